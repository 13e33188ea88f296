"""The explorer under hostile input, and never an infeasible plan shown as an improvement.

The upload path takes the hostile files of tests/hostile_inputs.py and the field mutants of
tests/test_hostile_scenarios.py through what a page does with them (``logic.decode_upload`` then the
page's ``run_*``): each is a result or one located line for ``st.error``, never an internal error. The pure
helpers that decide whether a change is shown better or worse (``logic.greyed_reason``, the Compare
page's ``logic.compare_table``) are checked on plans that do not fit, miss their SLOs or leave requests
unserved, in both seats (what-if and base). One AppTest run uploads hostile files to the Training page.
"""
from __future__ import annotations

import types

import pytest
import yaml

pytest.importorskip("streamlit")

import fmsim
from app_helpers import EXAMPLES, open_page
from explorer import logic
from hostile_inputs import HOSTILE_FILES
from test_hostile_scenarios import mutants

LLAMA = EXAMPLES / "llama3-70b-p5.yaml"
APP_VALUES = ("a string", "NaN", "huge int")
DOES_NOT_FIT = {"parallelism.tp": 4, "parallelism.recompute": "none"}   # 86 GiB of 80, and a faster step


def located(out: logic.Outcome, name: str) -> str:
    """"" when ``out`` is a result or fmsim's one located line for ``name``; else what is wrong."""
    if out.ok:
        return ""
    if out.error_kind == "InternalError":
        return f"internal error: {out.error}"
    if "\n" in out.error or not out.error.startswith(f"{name}: "):
        return f"not one located line: {out.error!r}"
    return ""


def run_page(text: str, name: str) -> logic.Outcome:
    """What the page of the text's kind runs (analytical: the mutants are many)."""
    try:
        kind = (yaml.safe_load(text).get("workload") or {}).get("kind")
    except Exception:  # noqa: BLE001 - not even YAML: the Compare page's reader says so
        kind = None
    if kind == "rl":
        return logic.run_rl(text, name, engine="analytical")
    return logic.run_any(text, name, engine="analytical")


# -- uploads -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hostile", list(HOSTILE_FILES))
def test_a_hostile_upload_is_one_located_line_for_st_error(hostile):
    data, says = HOSTILE_FILES[hostile]
    name = "upload.yaml"
    try:
        text = logic.decode_upload(name, data)
    except fmsim.ConfigError as exc:          # refused as bytes: shown in the sidebar
        assert str(exc).startswith(f"{name}: ") and "\n" not in str(exc) and says in str(exc)
        return
    for run in (logic.run_training, logic.run_serving, logic.run_rl, run_page):
        kwargs = {} if run is run_page else {"engine": "analytical"}
        out = run(text, name, **kwargs)
        assert not out.ok and located(out, name) == "" and says in out.error, out.error


def test_an_upload_is_refused_by_its_size_and_its_bytes_as_a_file_is():
    with pytest.raises(fmsim.ConfigError, match="over the 1,048,576-byte limit"):
        logic.decode_upload("big.yaml", b"#" * (1 << 20 + 1))
    with pytest.raises(fmsim.ConfigError, match="big.yaml: line 2, column 3: a NUL byte"):
        logic.decode_upload("big.yaml", b"a: 1\nb:\x00\n")


@pytest.mark.parametrize("example", ["llama3-70b-p5", "serving-llama3.1-8b-g6e", "rl-grpo-qwen3-32b-p5en"])
def test_every_mutant_of_an_example_uploaded_is_a_result_or_one_located_line(example):
    with (EXAMPLES / f"{example}.yaml").open(encoding="utf-8") as fh:
        base = yaml.safe_load(fh)
    base.pop("expect", None)
    bugs = []
    for what, doc in mutants(base, APP_VALUES):     # the reader test tries every value; the app's path, these
        text = yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
        problem = located(run_page(text, "mutant.yaml"), "mutant.yaml")
        if problem:
            bugs.append(f"{what}: {problem}")
    assert bugs == []


def test_hostile_knob_text_is_a_located_error_on_its_field():
    text = (EXAMPLES / "serving-llama3.1-8b-g6e.yaml").read_text(encoding="utf-8")
    for knob in ("9" * 5000, "{dist: lognormal, median: 800, sigma: 1e9}", "a: &a [*a]", "[[[[", "\udcff"):
        out = logic.run_serving(text, "s.yaml", (("traffic.prompt_len", logic.parse_knob_text(knob)),),
                                engine="analytical")
        assert not out.ok and located(out, "s.yaml") == "" and "traffic.prompt_len" in out.error, out.error


def test_the_training_page_shows_a_hostile_upload_as_an_error_not_a_traceback():
    at = open_page("1_Training.py")
    for hostile in ("billion laughs", "a 5,000-digit integer", "non-UTF-8 byte"):
        data, says = HOSTILE_FILES[hostile]
        at.file_uploader(key="train.upload").set_value((f"{hostile}.yaml", data, "application/x-yaml")).run()
        assert not at.exception
        shown = " ".join(e.value for e in [*at.error, *at.sidebar.error])
        assert logic.md_escape(f"{hostile}.yaml") in shown and logic.md_escape(says) in shown, shown


# -- an infeasible plan is never an improvement --------------------------------------------------------

def fake(**metrics):
    return types.SimpleNamespace(metrics=metrics)


@pytest.mark.parametrize("what_if, base, says", [
    (fake(fits=True), fake(fits=True), ""),
    (fake(fits=False), fake(fits=True), "the what-if cannot run as asked: it does not fit in memory"),
    (fake(slo_met=False), fake(slo_met=True), "the what-if cannot run as asked: it misses its SLOs"),
    (fake(unfinished_requests=3, slo_met=None), fake(), "requests are left unserved"),
    (fake(fits=True), fake(fits=False), "the base cannot run as asked (it does not fit in memory)"),
    (fake(slo_met=True), fake(rejected_requests=5), "the base cannot run as asked (it is overloaded"),
    (fake(fits=False), fake(fits=False), "the what-if cannot run"),
    (fake(fits=True, goodput=0.0), fake(fits=True, goodput=0.95), "the run never finishes"),
])
def test_changes_are_greyed_when_either_plan_cannot_run(what_if, base, says):
    got = logic.greyed_reason(what_if, base)
    assert (got == "") if not says else (says in got), got


def test_a_run_that_never_finishes_is_infeasible_by_the_simulator_itself():
    """Checkpoints every 1e9 h: every interruption loses the run, goodput 0 and no time to train."""
    res = fmsim.estimate(fmsim.load_scenario(EXAMPLES / "llama3.1-405b-p5en-storage.yaml",
                                             overrides={"checkpoint.every": "1e9 h"}))
    assert res.metrics["goodput"] == 0 and "never finishes" in logic.infeasible_reason(res)


def test_a_what_if_serving_less_than_its_offered_load_is_greyed():
    r = fake(requests_per_s=4.0, slo_met=None)
    assert "less than the offered load" in logic.greyed_reason(r, fake(), offered=10.0, saturation=4.0)
    assert logic.greyed_reason(r, fake(), offered=3.0, saturation=4.0) == ""


def test_the_compare_table_shows_no_change_against_or_of_a_plan_that_cannot_run():
    base = fmsim.estimate(fmsim.load_scenario(LLAMA))
    oom = fmsim.estimate(fmsim.load_scenario(LLAMA, overrides=DOES_NOT_FIT))
    assert oom.metrics["fits"] is False and oom.metrics["step_time_s"] < base.metrics["step_time_s"]
    fits = fmsim.estimate(fmsim.load_scenario(LLAMA, overrides={"parallelism.recompute": "none"}))
    assert fits.metrics["fits"] and fits.metrics["step_time_s"] < base.metrics["step_time_s"]

    table = {r["metric"]: r for r in logic.compare_table([("base", base), ("oom", oom), ("fits", fits)])}
    ran = table["Runs as asked"]
    assert ran["oom"] == "no: it does not fit in memory" and ran["fits"] == "yes" and ran["Δ oom"] == "changed"
    step = table["Step time"]
    assert step["Δ oom"] == "n/a (cannot run)"                       # faster, but no improvement
    assert step["Δ fits"].startswith("-") and step["Δ fits"].endswith("%")

    table = {r["metric"]: r for r in logic.compare_table([("oom", oom), ("base", base)])}
    assert table["Step time"]["Δ base"] == "n/a (reference cannot run)"


def test_the_training_page_greys_a_faster_plan_that_does_not_fit():
    at = open_page("1_Training.py")
    at.radio(key="train.engine").set_value("analytical estimate").run()
    at.select_slider(key="train.tp").set_value(4).run()
    at.selectbox(key="train.recompute").set_value("none").run()
    assert not at.exception
    step = next(m for m in at.metric if m.label == "Step time")
    assert step.delta.startswith("-") and step.proto.color == step.proto.MetricColor.GRAY   # faster, greyed
    assert all(m.proto.color != m.proto.MetricColor.GREEN for m in at.metric)
    assert any("Infeasible plan" in e.value for e in at.error)


def _upload(at, key: str, example: str, edit) -> None:
    doc = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    doc.pop("expect", None)
    edit(doc)
    at.file_uploader(key=key).set_value(("edited.yaml", yaml.safe_dump(doc).encode(), "application/x-yaml")).run()


def test_a_file_value_past_a_knobs_range_widens_the_knob_instead_of_raising():
    """The reader allows a 10-day checkpoint interval and a 1 EiB file system; the storage panel's knobs
    stopped at 10,000 minutes and 100,000 TiB and raised (a traceback under the page's figures)."""
    at = open_page("1_Training.py")
    _upload(at, "train.upload", "llama3.1-405b-p5en-storage.yaml",
            lambda d: (d["checkpoint"].update(every="10 d"), d["cluster"]["storage"].update(capacity="1 EiB")))
    assert not at.exception, [e.value for e in at.exception]
    assert "Goodput" in [m.label for m in at.metric]             # the panel drew its figures


def test_an_rl_group_past_the_knobs_range_runs_as_the_file_says():
    """2,048 samples a prompt (the reader takes up to 4,096): the group-size knob stopped at 1,024 and the
    page reported an error the file does not have."""
    at = open_page("5_RL.py")

    def big_group(d):
        d["rl"].update(samples_per_prompt=2048, prompts=1, train_global_batch=2048)

    _upload(at, "rl.upload", "rl-grpo-qwen3-32b-p5en.yaml", big_group)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.number_input(key="rl.samples_per_prompt").value == 2048


def test_the_compare_page_sends_an_rl_scenario_to_the_rl_page():
    """It was run as training and told to open on the Serving page."""
    out = logic.run_any((EXAMPLES / "rl-grpo-qwen3-32b-p5en.yaml").read_text(), "rl.yaml", engine="analytical")
    assert not out.ok and located(out, "rl.yaml") == "" and out.hint == "Open this scenario on the RL page."
