"""A serving run's work is bounded whatever the request count (issue 27): the discrete-event simulation
schedules sequences, and a run simulates at most MAX_SIMULATED_SEQUENCES of them over its questions'
samples and revision rounds -- a best-of-8 run at 10^9 requests drew 20,000 questions (160,000 sequences,
8x any single-sample run's work) and now draws 2,500; one question of more sequences than a run simulates is
refused with one located line. The work is asserted (questions drawn, sequences), never a wall-clock time."""
from __future__ import annotations

from pathlib import Path

import pytest

import fmsim
import fmsim.workloads.inference as inference
from fmsim.cli import main
from fmsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "scenarios" / "examples"
BEST_OF_8 = EXAMPLES / "serving-reasoning-best-of-8-p5en.yaml"
CHAT = EXAMPLES / "serving-llama3.1-70b-chat-p5.yaml"


def _drawn(path: Path, **overrides) -> inference._Simulation:
    """The simulation of ``path`` set up (its questions drawn, nothing run yet)."""
    sc = fmsim.load_scenario(path, overrides=overrides)
    return inference._Simulation(inference.plan_from_scenario(sc))


def _sequences(sim: inference._Simulation) -> int:
    return int(sim.outs.size)          # one output length per sequence: questions x rounds x samples


def test_a_run_simulates_no_more_sequences_than_one_single_sample_run_does():
    assert inference.MAX_SIMULATED_SEQUENCES <= inference.MAX_SIMULATED_QUESTIONS


@pytest.mark.parametrize("path, requests", [(BEST_OF_8, 10**9), (BEST_OF_8, 30_000), (CHAT, 10**9)])
def test_a_huge_request_count_draws_a_bounded_number_of_sequences(path, requests):
    sim = _drawn(path, **{"traffic.requests": requests})
    samples = sim.spec.ttc.samples * sim.spec.ttc.revision_rounds
    assert sim.n_offered == requests
    assert _sequences(sim) == sim.n_questions * samples <= inference.MAX_SIMULATED_SEQUENCES
    assert sim.n_questions == min(inference.MAX_SIMULATED_QUESTIONS, inference.MAX_SIMULATED_SEQUENCES // samples)
    assert sim.request_cap == sim.n_questions and sim.prompts.size == sim.arrivals.size == sim.n_questions


def test_a_capped_best_of_8_run_says_how_many_questions_it_simulated(monkeypatch):
    """The cap's logic at a test's size: 400 sequences of best-of-8 are 50 questions, and the result says so."""
    monkeypatch.setattr(inference, "MAX_SIMULATED_SEQUENCES", 400)
    res = fmsim.simulate(fmsim.load_scenario(BEST_OF_8, overrides={"traffic.requests": 10**9}))
    assert res.metrics["requests_simulated"] == 50 and res.metrics["requests_offered"] == 10**9
    assert res.details["request_cap"]["cap"] == 50


def test_an_uncapped_run_draws_every_request_it_is_asked_for():
    sim = _drawn(BEST_OF_8)
    assert sim.request_cap is None and sim.n_questions == sim.n_offered == 150
    assert _sequences(sim) == 150 * 8


def test_one_question_of_more_sequences_than_a_run_simulates_is_one_located_line(capsys):
    with pytest.raises(ConfigError) as exc:
        _drawn(BEST_OF_8, **{"test_time_compute.samples": 100_000, "traffic.requests": 1})
    assert exc.value.field == "test_time_compute.samples" and "100,000 sequences per question" in exc.value.message
    code = main(["run", str(BEST_OF_8), "--set", "test_time_compute.samples=100000", "--set", "traffic.requests=1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"{BEST_OF_8}: test_time_compute.samples: 100,000 samples x 1 revision rounds"), err
    # the estimate prices it: no simulation, so no bound on the sequences it draws
    est = fmsim.estimate(fmsim.load_scenario(BEST_OF_8, overrides={"test_time_compute.samples": 100_000,
                                                                    "traffic.requests": 1}))
    assert 0 < est.metrics["requests_per_s"] and est.metrics["output_tokens_per_s"] > 0
