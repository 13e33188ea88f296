"""The what-if explorer (``app/``): every page through ``streamlit.testing`` AppTest (set a widget,
check that the shown numbers are the API's), the round trip what-if -> YAML -> ``fmsim run``, the
explorer's pure helpers (``app/explorer/logic.py``) and the ``fmsim app`` command line.

Expected numbers always come from the public API at test time (``fmsim.simulate`` /
``fmsim.estimate``), formatted the way the pages format them, so the tests follow the simulator's
physics as it changes and check only that the app shows what the API says.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

import fmsim
from fmsim.cli import app_command, app_entry, main
from fmsim.export import csv_cell
from fmsim.scenario import scenario_from_mapping

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
EXAMPLES = ROOT / "scenarios" / "examples"
LLAMA = EXAMPLES / "llama3-70b-p5.yaml"
if str(APP) not in sys.path:
    sys.path.insert(0, str(APP))

from explorer import charts, logic

TIMEOUT_S = 60  # generous per-run bound on a loaded 2-core machine; not a timing assertion

SMALL_SERVING = """\
version: 1
name: {name}
description: a small serving what-if for the app tests
workload: {{kind: inference, model: llama3-8b, precision: bf16}}
parallelism: {{tp: 1}}
cluster: {{instance: p5.48xlarge, nodes: 1}}
traffic: {{arrival: poisson, rate: 20/s, requests: 150, prompt_len: 400, output_len: 60}}
slo: {{ttft_p99: 2 s, tpot_p50: 50 ms}}
"""


# ----------------------------------------------------------------------------------------------
# helpers


def open_page(page: str | None = None) -> AppTest:
    """The app started at Home.py (as ``fmsim app`` does), then switched to ``pages/<page>``."""
    at = AppTest.from_file(str(APP / "Home.py"), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception
    if page:
        at.switch_page(f"pages/{page}")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def shown(at: AppTest) -> dict[str, str]:
    """The st.metric values on the page, by label."""
    return {m.label: m.value for m in at.metric}


def texts(elements) -> str:
    """The elements' text as a reader sees it: Markdown backslash escapes removed."""
    return "\n".join(unescape(str(e.value)) for e in elements)


def unescape(markdown: str) -> str:
    """CommonMark's backslash escapes of ASCII punctuation, undone (what the browser shows)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def training_expect(overrides: dict | None = None, *, engine: str = "des"):
    sc = fmsim.load_scenario(LLAMA, overrides=overrides)
    return fmsim.simulate(sc) if engine == "des" else fmsim.estimate(sc)


# ----------------------------------------------------------------------------------------------
# Home


def test_home_page_links_every_page_and_reports_the_catalog():
    at = open_page()
    links = [e.proto.page for e in at.get("page_link")]
    assert links == ["Training", "Serving", "Compare", "Catalog"]
    cat = fmsim.load_catalog()
    assert f"{len(cat.instances)} instance types" in texts(at.caption)


# ----------------------------------------------------------------------------------------------
# Training


def test_training_page_shows_what_fmsim_simulate_gives_for_the_bundled_scenario():
    at = open_page("1_Training.py")
    assert at.selectbox(key="train.bundled").value == "examples/llama3-70b-p5.yaml"
    res = training_expect()
    m = shown(at)
    assert m["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    assert m["MFU"] == logic.fmt_pct(res.metrics["mfu"])
    assert m["Tokens/s"] == logic.fmt_count(res.metrics["tokens_per_s"])
    assert m["Memory per GPU"] == logic.fmt_fit(
        res.metrics["memory_per_gpu_bytes"], res.metrics["hbm_per_gpu_bytes"]
    )
    assert m["Cost to train"] == logic.fmt_usd(res.metrics["cost_usd"])
    assert m["Time to train"] == logic.fmt_time(res.metrics["time_to_train_s"])
    assert res.details["bottleneck"] in texts(at.info)
    assert at.session_state["train.result"]["step_time_s"] == res.metrics["step_time_s"]
    assert len(at.get("vega_lite_chart")) == 3  # breakdown, memory, pipeline timeline
    assert not at.error


def test_moving_the_tp_slider_changes_the_step_time_as_the_api_does():
    at = open_page("1_Training.py")
    before = shown(at)["Step time"]
    at.select_slider(key="train.tp").set_value(4).run()
    assert not at.exception  # (it may not fit in memory: the page then says so, numbers still shown)
    res = training_expect({"parallelism.tp": 4, "parallelism.dp": "auto"})
    after = {m.label: m for m in at.metric}
    assert after["Step time"].value == logic.fmt_time(res.metrics["step_time_s"]) != before
    assert after["Step time"].delta  # the change against the base scenario is shown
    assert f"dp {res.metrics['dp']}" in texts(at.markdown)
    assert at.session_state["train.result"]["tp"] == 4


def test_more_nodes_and_the_analytical_engine_show_fmsim_estimate():
    at = open_page("1_Training.py")
    at.radio(key="train.engine").set_value("analytical estimate")
    at.number_input(key="train.nodes").set_value(16).run()
    assert not at.exception and not at.error
    res = training_expect({"cluster.nodes": 16, "parallelism.dp": "auto"}, engine="analytical")
    m = shown(at)
    assert m["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    assert m["Cluster $/h"] == logic.fmt_usd(res.usd_per_hour)
    assert "fmsim run --estimate" in texts(at.caption)


def test_a_gpu_count_that_tp_pp_cp_do_not_divide_is_shown_with_what_to_change():
    at = open_page("1_Training.py")
    at.number_input(key="train.nodes").set_value(3).run()
    assert not at.exception
    errors = texts(at.error)
    assert "parallelism.dp" in errors and "24 GPUs are not divisible" in errors
    assert "What to change" in texts(at.info) and "multiple of tp x pp x cp" in texts(at.info)
    assert not at.metric


def test_the_shard_group_knob_runs_hybrid_sharding_as_the_api_does_and_explains_a_bad_one():
    # the bundled Llama 3 70B plan: tp 8, pp 4 on 8 p5 -> dp 2, ZeRO 1
    at = open_page("1_Training.py")
    assert at.number_input(key="train.dp_shard").value == 0          # all of dp
    at.number_input(key="train.dp_shard").set_value(1).run()
    assert not at.exception and not at.error
    res = training_expect({"parallelism.dp_shard": 1, "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    assert res.metrics["memory_per_gpu_bytes"] > training_expect().metrics["memory_per_gpu_bytes"]
    at.number_input(key="train.dp_shard").set_value(3).run()
    assert not at.exception
    assert "parallelism.dp_shard" in texts(at.error) and "divides dp" in texts(at.info)
    at.number_input(key="train.dp_shard").set_value(0).run()          # back to all of dp
    assert not at.error and shown(at)["Step time"] == logic.fmt_time(training_expect().metrics["step_time_s"])


def test_the_recompute_layers_knob_runs_the_block_method_as_the_api_does_and_explains_a_bad_one():
    # the bundled Llama 3 70B plan: 80 layers over pp 4 x vpp 5, four per virtual stage, selective recompute
    at = open_page("1_Training.py")
    assert at.number_input(key="train.recompute_layers").value == 0          # every layer
    at.selectbox(key="train.recompute").set_value("full")
    at.number_input(key="train.recompute_layers").set_value(2).run()
    assert not at.exception and not at.error
    res = training_expect({"parallelism.recompute": "full", "parallelism.recompute_layers": 2,
                           "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    at.number_input(key="train.recompute_layers").set_value(5).run()
    assert not at.exception
    assert "parallelism.recompute_layers" in texts(at.error) and "one virtual stage" in texts(at.info)


def test_the_moe_imbalance_knob_slows_an_moe_plan_as_the_api_does_and_is_refused_for_a_dense_one():
    at = open_page("1_Training.py")
    at.selectbox(key="train.bundled").set_value("examples/mixtral-8x22b-p6-b200.yaml").run()
    assert at.number_input(key="train.moe_imbalance").value == 1.0
    at.number_input(key="train.moe_imbalance").set_value(1.5).run()
    assert not at.exception and not at.error
    mixtral = ROOT / "scenarios" / "examples" / "mixtral-8x22b-p6-b200.yaml"
    res = fmsim.simulate(fmsim.load_scenario(mixtral, overrides={"workload.moe_imbalance": 1.5,
                                                                 "parallelism.dp": "auto"}))
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    at.selectbox(key="train.bundled").set_value("examples/llama3-70b-p5.yaml").run()
    at.number_input(key="train.moe_imbalance").set_value(1.5).run()
    assert not at.exception
    assert "workload.moe_imbalance" in texts(at.error) and "MoE models" in texts(at.info)


def test_the_cp_exchange_and_gradient_bucket_knobs_reach_the_scenario_as_the_api_takes_them():
    at = open_page("1_Training.py")
    assert at.selectbox(key="train.cp_comm").value == "ring" and at.selectbox(key="train.grad_bucket").value == 40e6
    at.selectbox(key="train.grad_bucket").set_value(0).run()                 # per layer
    assert not at.exception and not at.error
    per_layer = training_expect({"parallelism.grad_bucket": "unit", "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(per_layer.metrics["step_time_s"])
    at.selectbox(key="train.grad_bucket").set_value(500_000_000).run()
    assert not at.exception and not at.error
    res = training_expect({"parallelism.grad_bucket": 500_000_000, "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    at.selectbox(key="train.grad_bucket").set_value(-1).run()                # Megatron-Core's own default
    assert not at.exception and not at.error
    mcore = training_expect({"parallelism.grad_bucket": "megatron", "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(mcore.metrics["step_time_s"])
    at.selectbox(key="train.cp").set_value(2)
    at.selectbox(key="train.cp_comm").set_value("a2a").run()        # tp 8 leaves one K/V head a rank
    assert not at.exception
    assert "parallelism.cp_comm" in texts(at.error) and "divides them" in texts(at.info)
    at.select_slider(key="train.tp").set_value(4).run()               # two K/V heads a rank: cp 2 splits them
    assert not at.exception and not at.error
    res = training_expect({"parallelism.grad_bucket": "megatron", "parallelism.tp": 4, "parallelism.cp": 2,
                           "parallelism.cp_comm": "a2a", "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"])


def test_the_stack_picker_supplies_what_the_base_file_leaves_unstated_as_the_api_does(tmp_path):
    at = open_page("1_Training.py")
    picker = at.selectbox(key="train.stack")
    assert picker.value == logic.FILE_STACK and "megatron-lm-2021" in picker.options
    assert "vllm-v1" not in picker.options                          # serving stacks are not offered
    before = shown(at)["Step time"]
    base = fmsim.load_scenario(LLAMA)
    assert "workload.attention_kernel" not in base.stated          # the file leaves it to the default
    picker.set_value("megatron-lm-2021").run()                      # Megatron-LM v2.5: unfused attention
    assert not at.exception and not at.error
    res = training_expect({"stack": "megatron-lm-2021", "parallelism.dp": "auto"})
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"]) != before
    assert "attention_kernel: unfused" in texts(at.sidebar.caption)
    path = tmp_path / "whatif.yaml"
    path.write_text(at.session_state["train.whatif_yaml"])
    again = fmsim.load_scenario(path)
    assert again.stack == "megatron-lm-2021" and again.workload.attention_kernel == "unfused"
    # the file's own settings still win over the picked stack (megatron-lm-2021 ships no overlapped reduce)
    assert again.parallelism.overlap.grad_reduce == base.parallelism.overlap.grad_reduce
    assert fmsim.simulate(again).metrics["step_time_s"] == res.metrics["step_time_s"]
    picker.set_value(logic.FILE_STACK).run()
    assert shown(at)["Step time"] == before


def test_a_plan_that_does_not_fit_says_so_and_how_to_make_it_fit():
    at = open_page("1_Training.py")
    at.select_slider(key="train.tp").set_value(1)
    at.number_input(key="train.pp").set_value(1)
    at.number_input(key="train.vpp").set_value(1).run()
    assert not at.exception
    assert at.selectbox(key="train.schedule").value == "1f1b"  # vpp 1 leaves interleaving
    assert "Does not fit in memory" in texts(at.error)
    # 582 GiB a GPU: no neighbouring plan fits, so the page says so and gives the list
    assert "None of the neighbouring plans" in texts(at.info) and "more HBM per GPU" in texts(at.info)
    assert at.session_state["train.result"]["fits"] is False


def test_the_whatif_yaml_loads_back_identically_and_fmsim_run_gives_the_same_numbers(tmp_path, capsys):
    at = open_page("1_Training.py")
    at.select_slider(key="train.tp").set_value(4)
    at.selectbox(key="train.pricing").set_value("capacity-block").run()
    assert not at.exception
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download the what-if (YAML)" in labels and "Download the results (CSV)" in labels
    path = tmp_path / "whatif.yaml"
    path.write_text(at.session_state["train.whatif_yaml"])
    again = fmsim.load_scenario(path)
    expect = fmsim.load_scenario(
        LLAMA, overrides={"parallelism.tp": 4, "parallelism.dp": "auto", "pricing": "capacity-block",
                          "name": "llama3-70b-p5-whatif"}
    )
    # the same plan; its expect: bands are its own numbers (see the fmsim check test below)
    same = dataclasses.replace(expect, file=None, expect={})
    assert dataclasses.replace(again, file=None, expect={}) == same
    out_csv = tmp_path / "run.csv"
    # 3: fmsim run's exit code for a plan that does not fit (this what-if needs 86 GiB of 80); the row is written
    assert main(["run", str(path), "--csv", str(out_csv)]) in (0, 3)
    capsys.readouterr()
    with out_csv.open() as fh:
        row = next(csv.DictReader(fh))
    app_row = at.session_state["train.result"]
    assert {k: csv_cell(v) for k, v in app_row.items()} == row


def test_a_malformed_upload_is_an_error_on_the_page_not_a_traceback():
    at = open_page("1_Training.py")
    bad = (b"version: 1\nname: broken\n"
           b"workload: {kind: pretrain, model: llama3-70c, seq_len: 8192, global_batch: 8}\n")
    at.file_uploader(key="train.upload").set_value(("broken.yaml", bad, "application/x-yaml")).run()
    assert not at.exception
    err = texts(at.error)
    assert err.startswith("broken.yaml: workload.model") and "llama3-70b" in err  # did you mean
    big = b"#" * (1024 * 1024 + 1)
    at.file_uploader(key="train.upload").set_value(("big.yaml", big, "application/x-yaml")).run()
    assert not at.exception
    assert "over the 1,048,576-byte limit" in texts(at.sidebar.error)


def test_kept_whatif_appears_on_the_compare_page():
    at = open_page("1_Training.py")
    at.select_slider(key="train.tp").set_value(4).run()
    at.button(key="train.keep").click().run()
    assert not at.exception
    at.switch_page("pages/3_Compare.py")
    at.run()
    assert not at.exception
    picked = at.multiselect(key="compare.picked").value
    assert picked[0] == "what-if: llama3-70b-p5-whatif" and len(picked) >= 2
    table = at.dataframe[0].value
    step = table[table["metric"] == "Step time"].iloc[0]
    res = training_expect({"parallelism.tp": 4, "parallelism.dp": "auto"})
    assert step["what-if: llama3-70b-p5-whatif"] == logic.fmt_time(res.metrics["step_time_s"])


# ----------------------------------------------------------------------------------------------
# Serving


def _upload_serving(at: AppTest, name: str) -> str:
    text = SMALL_SERVING.format(name=name)
    at.file_uploader(key="serve.upload").set_value(
        (f"{name}.yaml", text.encode(), "application/x-yaml")
    ).run()
    assert not at.exception, [e.value for e in at.exception]
    return text


def test_serving_page_shows_the_bundled_serving_scenario_as_simulated():
    at = open_page("2_Serving.py")
    label = at.selectbox(key="serve.bundled").value
    res = fmsim.simulate(fmsim.load_scenario(ROOT / "scenarios" / label))
    m = shown(at)
    assert m["TTFT p50 / p99"] == logic.fmt_pair(res.metrics["ttft_p50_s"], res.metrics["ttft_p99_s"])
    assert m["$ per M output tokens"] == logic.fmt_usd(res.metrics["usd_per_million_output_tokens"])
    assert not at.error


def test_serving_rate_knob_changes_latency_throughput_and_cost_as_the_api_does():
    at = open_page("2_Serving.py")
    text = _upload_serving(at, "app-test-serving")
    base = scenario_from_mapping(yaml.safe_load(text), file="app-test-serving.yaml")
    res = fmsim.simulate(base)
    m = shown(at)
    assert m["Requests/s"] == logic.fmt_count(res.metrics["requests_per_s"])
    assert m["$ per answered question"] == logic.fmt_usd(res.metrics["usd_per_query"])
    at.text_input(key="serve.rate").set_value("5/s").run()
    assert not at.exception and not at.error
    res2 = fmsim.simulate(
        scenario_from_mapping(
            yaml.safe_load(text), file="x", overrides={"traffic.rate": "5/s", "parallelism.dp": "auto"}
        )
    )
    m2 = shown(at)
    assert m2["Requests/s"] == logic.fmt_count(res2.metrics["requests_per_s"]) != m["Requests/s"]
    assert m2["Output tokens/s"] == logic.fmt_count(res2.metrics["output_tokens_per_s"])
    assert m2["E2E p50 / p99"] == logic.fmt_pair(res2.metrics["e2e_p50_s"], res2.metrics["e2e_p99_s"])
    assert len(at.get("vega_lite_chart")) >= 3  # CDF, load curve, memory (+ breakdowns)
    assert "ttft" in at.dataframe[0].value["latency"].tolist()


def test_serving_slo_and_test_time_compute_knobs_reach_the_scenario():
    at = open_page("2_Serving.py")
    _upload_serving(at, "app-test-serving-ttc")
    at.text_input(key="serve.ttft_p99").set_value("1 ms")
    at.number_input(key="serve.samples").set_value(4)
    at.selectbox(key="serve.strategy").set_value("self-consistency").run()
    assert not at.exception and "Infeasible plan" in texts(at.error)  # a 1 ms TTFT is out of reach
    doc = yaml.safe_load(at.session_state["serve.whatif_yaml"])
    assert doc["slo"]["ttft_p99"] == "1 ms"
    assert doc["test_time_compute"] == {"samples": 4, "strategy": "self-consistency"}
    assert "SLOs met: **no**" in texts(at.caption)


def test_serving_page_says_when_the_serving_simulator_is_not_available(monkeypatch):
    def not_built(sc, **_):
        raise fmsim.NotBuiltError(f"{sc.file}: workload.kind: the 'inference' simulator is not built yet")

    monkeypatch.setattr(fmsim, "simulate", not_built)
    at = open_page("2_Serving.py")
    _upload_serving(at, "app-test-not-built")
    assert "serving simulator is not available" in texts(at.info)
    assert not at.error and not at.metric


# ----------------------------------------------------------------------------------------------
# Compare and Catalog


def test_compare_page_shows_two_bundled_scenarios_side_by_side_with_deltas():
    at = open_page("3_Compare.py")
    picked = at.multiselect(key="compare.picked").value
    assert picked == ["examples/llama3-70b-p5.yaml", "examples/llama3.1-405b-p5en.yaml"]
    table = at.dataframe[0].value
    results = [fmsim.simulate(fmsim.load_scenario(ROOT / "scenarios" / p)) for p in picked]
    step = table[table["metric"] == "Step time"].iloc[0]
    for p, r in zip(picked, results):
        assert step[p] == logic.fmt_time(r.metrics["step_time_s"])
    a, b = (r.metrics["step_time_s"] for r in results)
    assert step[f"Δ {picked[1]}"] == f"{100 * (b - a) / a:+.1f} %"
    assert not at.error


def test_catalog_page_lists_every_price_with_its_date_and_source():
    at = open_page("4_Catalog.py")
    cat = fmsim.load_catalog()
    assert len(at.dataframe[0].value) == len(cat.instances)
    at.radio(key="catalog.table").set_value("Prices").run()
    df = at.dataframe[0].value
    assert len(df) == sum(len(v) for v in cat.prices.values())
    assert df["date"].str.len().min() >= 7 and df["source"].str.len().min() > 0
    at.text_input(key="catalog.filter").set_value("p5en.48xlarge").run()
    assert set(at.dataframe[0].value["instance"]) == {"p5en.48xlarge"}
    for table in ("Accelerators", "Models", "Fabrics", "Storage"):
        at.text_input(key="catalog.filter").set_value("")
        at.radio(key="catalog.table").set_value(table).run()
        assert not at.exception and len(at.dataframe[0].value) > 0


# ----------------------------------------------------------------------------------------------
# explorer.logic


def test_knob_overrides_round_trip_through_the_hashable_cache_key():
    values = {"parallelism.tp": 4, "slo": {"ttft_p99": "2 s"}, "traffic.rate": None}
    key = logic.as_overrides(values)
    hash(key)
    assert dict(logic._unfreeze(key)) == values


def test_run_training_turns_a_bug_into_a_one_line_internal_error(monkeypatch):
    def boom(sc):
        raise RuntimeError("kaput\nsecond line")

    monkeypatch.setattr(fmsim, "estimate", boom)
    out = logic.run_training(LLAMA.read_text(), "x.yaml")
    assert not out.ok and out.error == "internal error in fmsim (RuntimeError: kaput)"
    assert out.error_kind == "InternalError" and out.yaml_text  # the what-if itself was valid


def test_large_steps_fall_back_to_the_estimate_with_a_note():
    out = logic.run_training(LLAMA.read_text(), "x.yaml", des_job_limit=10)
    assert out.ok and out.engine == "analytical" and "fmsim run --estimate" in out.note
    assert out.result.metrics["step_time_s"] == training_expect(engine="analytical").metrics["step_time_s"]


def test_timeline_rows_merge_touching_spans_and_bin_large_traces():
    meta = [
        {"ph": "M", "name": "thread_name", "tid": 0, "args": {"name": "stage0"}},
        {"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "dp0"}},
    ]
    spans = [
        {"ph": "X", "tid": 0, "ts": 0, "dur": 10, "cat": "forward", "name": "F0"},
        {"ph": "X", "tid": 0, "ts": 10, "dur": 10, "cat": "forward", "name": "F1"},
        {"ph": "X", "tid": 0, "ts": 20, "dur": 30, "cat": "backward", "name": "B0"},
        {"ph": "X", "tid": 1, "ts": 50, "dur": 5, "cat": "dp", "name": "reduce"},
    ]
    rows, note = logic.timeline_rows(meta + spans)
    assert [(r[0], r[3], r[4]) for r in rows] == [
        ("stage 0 compute", "forward", "2 forward spans"),
        ("stage 0 compute", "backward", "B0"),
        ("stage 0 DP comm", "dp", "reduce"),
    ] and note == ""
    assert [r[1:3] for r in rows] == [pytest.approx(t) for t in ((0, 20e-6), (20e-6, 50e-6), (50e-6, 55e-6))]
    many = [
        {
            "ph": "X",
            "tid": 0,
            "ts": 2 * i,
            "dur": 1,
            "cat": "forward" if i % 2 else "backward",
            "name": str(i),
        }
        for i in range(5000)
    ]
    rows, note = logic.timeline_rows(meta + many, max_rows=100)
    assert 0 < len(rows) <= 100 and "time bins" in note
    assert math.isclose(max(r[2] for r in rows), 9999e-6, rel_tol=0.02)


def test_latency_cdf_uses_samples_when_the_simulator_gives_them_else_percentiles():
    res = fmsim.results.Result(
        scenario="s",
        kind="inference",
        instance="i",
        nodes=1,
        gpus=1,
        usd_per_hour=1.0,
        price_date="",
        metrics={"ttft_p50_s": 0.1, "ttft_p90_s": 0.2, "ttft_p99_s": math.inf},
    )
    points, src = logic.latency_cdf(res)
    assert src == "percentiles" and [(p["latency_s"], p["quantile"]) for p in points] == [
        (0.1, 0.5),
        (0.2, 0.9),
    ]
    res = dataclasses.replace(res, details={"latency_samples": {"ttft": [0.3, 0.1, 0.2, 0.4]}})
    points, src = logic.latency_cdf(res)
    assert src == "samples" and points[0] == {"metric": "ttft", "latency_s": 0.1, "quantile": 0.25}
    assert points[-1]["quantile"] == 1.0


@pytest.mark.parametrize(
    "seconds, text",
    [
        (15.615, "15.6 s"),
        (0.00861, "8.61 ms"),
        (3 * 3600, "3 h"),
        (223375358.0, "7.08 years"),
        (None, "-"),
        (math.inf, "unbounded"),
    ],
)
def test_times_are_shown_in_the_largest_unit_that_fits(seconds, text):
    assert logic.fmt_time(seconds) == text


def test_deltas_and_hints_for_what_to_change():
    assert logic.delta_text(10.0, 12.5) == "+25.0 %" and logic.delta_text("a", "a") == "same"
    err = fmsim.ParallelismError(
        "12 does not divide 64 attention heads", file="x.yaml", field="parallelism.tp"
    )
    assert "divides the model's attention heads" in logic.hint_for(err)
    assert logic.hint_for(fmsim.OutOfMemoryError("too big")) == logic.OOM_HINT
    with pytest.raises(fmsim.ConfigError, match="over the 1,048,576-byte limit"):
        logic.decode_upload("big.yaml", b" " * (1024 * 1024 + 1))


def test_bundled_scenarios_are_listed_with_their_kinds_examples_first():
    found = logic.bundled_scenarios()
    kinds = {b.label: b.kind for b in found}
    assert kinds["examples/llama3-70b-p5.yaml"] == "pretrain"
    assert found[0].label.startswith("examples/")
    with pytest.raises(fmsim.ConfigError):
        logic.read_bundled("../setup.py")


# ----------------------------------------------------------------------------------------------
# fmsim app


def test_fmsim_app_runs_the_entry_page_headless_on_the_given_port():
    cmd = app_command(8611, "127.0.0.1")
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"] and cmd[4] == str(APP / "Home.py")
    opts = dict(zip(cmd[5::2], cmd[6::2]))
    assert opts["--server.headless"] == "true" and opts["--server.port"] == "8611"
    assert opts["--server.address"] == "127.0.0.1" and opts["--browser.gatherUsageStats"] == "false"


def test_fmsim_app_execs_streamlit_and_refuses_a_bad_port(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("os.execv", lambda path, argv: calls.append((path, argv)))
    assert main(["app", "--port", "8612"]) == 0
    assert calls and calls[0][1][calls[0][1].index("--server.port") + 1] == "8612"
    assert main(["app", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "fmsim app: --port: 70000 is not a TCP port (expected 1 .. 65535)"


def test_fmsim_app_finds_the_explorer_shipped_inside_the_wheel(monkeypatch, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "Home.py").write_text("")
    monkeypatch.setattr("fmsim.catalog.data_root", lambda: tmp_path)
    assert app_entry() == tmp_path / "app" / "Home.py"
    monkeypatch.setattr("fmsim.catalog.data_root", lambda: tmp_path / "nowhere")
    with pytest.raises(fmsim.ConfigError, match="the explorer is not installed here"):
        app_entry()
    setup = (ROOT / "setup.py").read_text()
    assert '"app")' in setup.split("DATA_DIRS = ", 1)[1].splitlines()[0]  # pip install . ships app/


def test_a_recompute_knob_away_from_selective_drops_the_base_files_recompute_modules():
    text = (ROOT / "scenarios" / "validation" / "training" / "mb2511-b200-03.yaml").read_text()
    base = logic.load_base(text, "mb2511-b200-03.yaml")
    assert base.parallelism.recompute_modules == ("mla_up_proj",)
    full = logic.whatif_scenario(text, "mb2511-b200-03.yaml", (("parallelism.recompute", "full"),))
    assert (full.parallelism.recompute, full.parallelism.recompute_modules) == ("full", ())
    kept = logic.whatif_scenario(text, "mb2511-b200-03.yaml", (("parallelism.tp", 1),))
    assert kept.parallelism.recompute_modules == ("mla_up_proj",)


def test_a_recompute_or_pipeline_knob_drops_the_base_files_recompute_layers():
    text = (ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml").read_text()
    text = text.replace("recompute: selective", "recompute: full\n  recompute_layers: 2")
    assert logic.load_base(text, "f.yaml").parallelism.recompute_layers == 2
    for knobs in ((("parallelism.recompute", "selective"),), (("parallelism.vpp", 2),)):
        assert logic.whatif_scenario(text, "f.yaml", knobs).parallelism.recompute_layers == 0
    assert logic.whatif_scenario(text, "f.yaml", (("parallelism.tp", 4), ("parallelism.dp", 4))
                                 ).parallelism.recompute_layers == 2


def test_a_precision_knob_away_from_fp8_drops_the_fp8_parameter_gather():
    text = (ROOT / "scenarios" / "validation" / "training" / "mlpv51-405b-01.yaml").read_text()
    assert logic.load_base(text, "f.yaml").parallelism.param_gather_precision == "fp8"
    bf16 = logic.whatif_scenario(text, "f.yaml", (("workload.precision", "bf16"),))
    assert (bf16.workload.precision, bf16.parallelism.param_gather_precision) == ("bf16", "bf16")
    fp8 = logic.whatif_scenario(text, "f.yaml", (("workload.precision", "fp8"),))
    assert fp8.parallelism.param_gather_precision == "fp8"


def test_a_pipeline_or_recompute_knob_drops_activation_offloading():
    text = (ROOT / "scenarios" / "validation" / "training" / "mb2511-gb200-02.yaml").read_text()
    assert logic.load_base(text, "f.yaml").parallelism.offload_activations == 40
    for knobs in ((("parallelism.pp", 2), ("parallelism.dp", 32)), (("parallelism.recompute", "selective"),)):
        assert logic.whatif_scenario(text, "f.yaml", knobs).parallelism.offload_activations == 0
    assert logic.whatif_scenario(text, "f.yaml", (("workload.micro_batch", 1),)).parallelism.offload_activations == 40


# ----------------------------------------------------------------------------------------------
# issue 31: faces that planners can trust


def test_messages_are_escaped_so_markdown_shows_them_as_written():
    msg = "x.yaml: workload.global_batch: 128 is not divisible by dp*micro_batch = 3*1 = 3 [a](b) <i> $5 ~x~"
    esc = logic.md_escape(msg)
    assert unescape(esc) == msg
    for ch in "*_[]<>$~":
        assert ch not in re.sub(r"\\.", "", esc)  # every special character is escaped
    at = open_page("1_Training.py")
    at.number_input(key="train.nodes").set_value(12).run()
    assert not at.exception
    raw = "\n".join(str(e.value) for e in at.error)
    assert r"dp\*micro\_batch = 3\*1 = 3" in raw


def test_a_rate_that_is_not_a_number_is_a_located_message_with_its_rule():
    text = SMALL_SERVING.format(name="rate")
    out = logic.run_serving(text, "rate.yaml", (("traffic.rate", "fast"),), engine="analytical")
    assert not out.ok
    assert out.error == (
        "rate.yaml: traffic.rate: cannot read 'fast' as a request rate (expected requests per second: "
        "12, '12/s', '600/min', '2/h' or 'inf')"
    )


def says_no_cost_in_the_cli_and_on_the_page(capsys, scenario: Path, page: str, prefix: str,
                                            cost: str) -> AppTest:
    """``scenario`` on p5e.48xlarge (capacity-block prices only): ``fmsim run`` and ``page`` name the
    pricing that exists, and the page's ``cost`` figure says no price."""
    cat = fmsim.load_catalog()
    block = cat.price("p5e.48xlarge", "capacity-block")
    assert cat.price("p5e.48xlarge", "on-demand") is None and block is not None
    want = f"p5e.48xlarge has no on-demand price; pricing: capacity-block exists ({block.date})"
    assert main(["run", str(scenario), "--estimate", "--set", "cluster.instance=p5e.48xlarge"]) == 0
    assert f"no cost: {want}" in capsys.readouterr().out
    at = open_page(page)
    at.radio(key=f"{prefix}.engine").set_value("analytical estimate")
    at.selectbox(key=f"{prefix}.instance").set_value("p5e.48xlarge").run()
    assert not at.exception
    assert want in texts(at.warning)
    assert shown(at)[cost] == "no price"
    return at


def test_a_missing_price_names_the_pricing_that_exists_in_the_cli_and_on_the_page(capsys):
    says_no_cost_in_the_cli_and_on_the_page(capsys, LLAMA, "1_Training.py", "train", "Cost to train")


def test_a_serving_plan_without_a_price_names_the_pricing_that_exists_in_the_cli_and_on_the_page(capsys):
    chat = EXAMPLES / "serving-llama3.1-70b-chat-p5.yaml"
    cost = "$ per M output tokens"
    at = says_no_cost_in_the_cli_and_on_the_page(capsys, chat, "2_Serving.py", "serve", cost)
    at.selectbox(key="serve.pricing").set_value("capacity-block").run()    # a price: no warning
    assert not at.exception and "No cost" not in texts(at.warning)
    assert shown(at)[cost] != "no price"


def test_a_plan_that_does_not_fit_shows_no_better_arrows_and_names_a_neighbour_that_fits():
    at = open_page("1_Training.py")
    at.select_slider(key="train.tp").set_value(2).run()          # tp 2, pp 4: about 160 GiB a GPU
    assert not at.exception
    res = training_expect({"parallelism.tp": 2, "parallelism.dp": "auto"})
    assert res.metrics["fits"] is False
    assert "Infeasible plan" in texts(at.error) and "does not fit in memory" in texts(at.error)
    metrics = {m.label: m for m in at.metric}
    assert all(m.proto.color != m.proto.MetricColor.GREEN for m in metrics.values())
    for label in ("Step time", "Tokens/s", "Cost to train", "Time to train"):
        assert metrics[label].proto.color == metrics[label].proto.MetricColor.GRAY, label
    mem = metrics["Memory per GPU"]
    assert mem.proto.color == mem.proto.MetricColor.RED and "over HBM" in mem.delta
    hint = next(t for t in texts(at.info).splitlines() if "What to change" in t)
    assert hint.startswith("**What to change:** Try ")
    # the change it names does fit, by the estimate
    named = {"recompute full": {"parallelism.recompute": "full"}, "tp 4": {"parallelism.tp": 4},
             "pp 8": {"parallelism.pp": 8}, "ZeRO stage 2": {"parallelism.zero": 2}}
    change = {}
    for words, ov in named.items():
        if f"Try {words} " in hint or f"and {words} " in hint:
            change.update(ov)
    assert change, hint
    fixed = fmsim.estimate(fmsim.load_scenario(LLAMA, overrides={"parallelism.tp": 2, **change,
                                                                 "parallelism.dp": "auto"}))
    assert fixed.metrics["fits"] is True
    assert logic.fmt_fit(fixed.metrics["memory_per_gpu_bytes"], fixed.metrics["hbm_per_gpu_bytes"]) in hint


def test_a_serving_plan_that_misses_its_slo_is_marked_infeasible_without_better_arrows():
    at = open_page("2_Serving.py")
    _upload_serving(at, "app-test-slo-miss")
    at.text_input(key="serve.ttft_p99").set_value("1 ms").run()
    assert not at.exception
    assert "Infeasible plan" in texts(at.error) and "misses its SLOs" in texts(at.error)
    assert all(m.proto.color != m.proto.MetricColor.GREEN for m in at.metric)


def test_fit_suggestion_tries_the_neighbouring_plans_with_the_estimate():
    text = LLAMA.read_text()
    assert logic.fit_suggestion(text, "x.yaml") == ""                       # fits already: nothing
    hint = logic.fit_suggestion(text, "x.yaml", (("parallelism.tp", 2), ("parallelism.dp", "auto")))
    assert hint.startswith("Try ") and "it fits" in hint


def test_a_downloaded_whatif_takes_its_name_passes_fmsim_check_and_simulates_to_the_pages_numbers(
    tmp_path, capsys
):
    at = open_page("1_Training.py")
    at.select_slider(key="train.tp").set_value(4).run()
    assert not at.exception
    text = at.session_state["train.whatif_yaml"]
    doc = yaml.safe_load(text)
    assert doc["name"] == "llama3-70b-p5-whatif"
    assert "measured" not in doc and set(doc["expect"]) == {"step_time_s", "mfu", "memory_per_gpu_bytes"}
    page = at.session_state["train.result"]
    assert doc["expect"]["step_time_s"]["value"] == page["step_time_s"]        # re-derived, not the base's
    path = tmp_path / "whatif.yaml"
    path.write_text(text)
    again = fmsim.simulate(fmsim.load_scenario(path))
    assert again.metrics["step_time_s"] == page["step_time_s"] and again.metrics["mfu"] == page["mfu"]
    assert shown(at)["Step time"] == logic.fmt_time(again.metrics["step_time_s"])
    capsys.readouterr()
    assert main(["check", str(path)]) == 0
    assert "3 of 3 metrics in band" in capsys.readouterr().out
    # from the analytical estimate: the bands (of the simulation) are dropped, never carried over
    at.radio(key="train.engine").set_value("analytical estimate").run()
    doc = yaml.safe_load(at.session_state["train.whatif_yaml"])
    assert doc["name"] == "llama3-70b-p5-whatif" and "expect" not in doc


def test_compare_says_what_each_plan_is_and_its_chart_axis_carries_the_unit():
    at = open_page("3_Compare.py")
    picked = at.multiselect(key="compare.picked").value
    table = at.dataframe[0].value.set_index("metric")
    for p in picked:
        sc = fmsim.load_scenario(ROOT / "scenarios" / p)
        res = fmsim.simulate(sc)
        col = table[p]
        assert col["Model"] == sc.workload.model.name and col["Instance"] == res.instance
        assert col["Nodes"] == f"{res.nodes:,} ({res.gpus:,} GPUs)"
        for axis in ("tp", "pp", "dp", "cp", "ep"):
            assert f"{axis} {res.metrics[axis]}" in col["Parallelism"]
        assert col["Precision"] == sc.workload.precision
        assert col["Pricing"] == f"{res.metrics['pricing_option']} ({res.price_date})"
    assert table[f"Δ {picked[1]}"]["Model"] == "changed"
    spec = at.get("vega_lite_chart")[0].proto.spec
    assert '"title": "Step time (s)"' in spec or '"title":"Step time (s)"' in spec


def test_offered_rate_reads_the_forms_the_traffic_section_takes():
    from fmsim.workloads.inference_spec import _parse_rate_per_s

    for rate in (12, 2.5, "12/s", "600/min", "7200/h", "30 qps", "4rps", "1e2/s"):
        sc = logic.load_base(SMALL_SERVING.format(name="r").replace("rate: 20/s", f"rate: {rate}"), "r.yaml")
        assert logic.offered_rate(sc) == pytest.approx(_parse_rate_per_s(rate)), rate
    closed = SMALL_SERVING.format(name="c").replace("arrival: poisson, rate: 20/s", "concurrency: 4")
    assert logic.offered_rate(logic.load_base(closed, "c.yaml")) is None


def test_serving_load_curve_says_it_is_the_estimate_marks_the_offered_load_and_overload():
    at = open_page("2_Serving.py")
    _upload_serving(at, "app-test-load")
    assert not texts(at.warning)                                   # 20/s: well within the plan
    titles = [h.value for h in at.subheader]
    assert "Throughput against load (analytical estimate)" in titles
    assert "discrete-event simulation's, so they can differ" in texts(at.caption)
    curve, _ = logic.load_curve(SMALL_SERVING.format(name="app-test-load"), "x.yaml")
    spec = charts.load_curve(curve, 20.0).to_dict()
    marks = [layer["mark"]["type"] for layer in spec["layer"]]
    assert marks[0] == "rect" and marks[-1] == "rule"                      # overload band, offered load
    assert "dashed line: this what-if, offered 20/s" in json.dumps(spec)
    at.text_input(key="serve.rate").set_value("1000/s").run()
    assert not at.exception
    curve, _ = logic.load_curve(SMALL_SERVING.format(name="app-test-load"), "x.yaml")
    cap = curve[0]["saturation_requests_per_s"]
    assert cap < 1000
    assert [p["overloaded"] for p in curve] == [p["offered_requests_per_s"] > cap for p in curve]
    warning = texts(at.warning)
    assert "Overloaded: 1 k/s offered" in warning and logic.fmt_count(cap, "/s") in warning
    assert "Infeasible plan" in texts(at.error)
    assert all(m.proto.color != m.proto.MetricColor.GREEN for m in at.metric)


def test_state_survives_switching_pages_and_the_link_reproduces_the_page():
    at = open_page("1_Training.py")
    mixtral = "examples/mixtral-8x22b-p6-b200.yaml"
    at.selectbox(key="train.bundled").set_value(mixtral).run()
    at.radio(key="train.engine").set_value("analytical estimate")
    at.number_input(key="train.moe_imbalance").set_value(1.5).run()
    assert not at.exception and not at.error
    step = shown(at)["Step time"]
    assert dict(at.query_params) == {"scenario": mixtral, "engine": "analytical", "moe_imbalance": "1.5"}
    for page in ("2_Serving.py", "3_Compare.py", "1_Training.py"):
        at.switch_page(f"pages/{page}")
        at.run()
        assert not at.exception
    assert at.selectbox(key="train.bundled").value == mixtral
    assert at.radio(key="train.engine").value == "analytical estimate"
    assert at.number_input(key="train.moe_imbalance").value == 1.5
    assert shown(at)["Step time"] == step
    # a colleague opens the link: a new session with the same query parameters
    other = AppTest.from_file(str(APP / "Home.py"), default_timeout=TIMEOUT_S)
    other.query_params.update(
        {"scenario": mixtral, "engine": "analytical", "moe_imbalance": "1.5", "tp": "x"}
    )
    other.switch_page("pages/1_Training.py")
    other.run()
    assert not other.exception
    assert other.selectbox(key="train.bundled").value == mixtral
    assert shown(other)["Step time"] == step
    assert "tp=x (expected a whole number): ignored" in texts(other.warning)


def test_knobs_from_url_read_each_knob_as_its_type_and_refuse_what_it_does_not_take():
    defaults = {"tp": 8, "moe_imbalance": 1.0, "sequence_parallel": True, "recompute": "selective",
                "name": ""}
    params = logic.url_params(defaults, {**defaults, "tp": 4, "sequence_parallel": False}, scenario="a.yaml")
    assert params == {"scenario": "a.yaml", "tp": "4", "sequence_parallel": "false"}
    bad = {"recompute": "most", "zz": "1", "moe_imbalance": "nan"}
    values, ignored = logic.knobs_from_url(defaults, {**params, **bad},
                                           {"recompute": ["none", "selective", "full"], "tp": [1, 2, 4, 8]})
    assert values == {"tp": 4, "sequence_parallel": False}
    assert ignored == ["recompute=most (not one of the knob's choices)", "zz=1 (no such knob)",
                       "moe_imbalance=nan (expected a number)"]


def test_an_upload_and_the_bundled_picker_never_silently_override_each_other():
    at = open_page("1_Training.py")
    mine = LLAMA.read_text().replace("name: llama3-70b-p5", "name: mine").replace("nodes: 8", "nodes: 16")
    at.radio(key="train.engine").set_value("analytical estimate")
    at.file_uploader(key="train.upload").set_value(("mine.yaml", mine.encode(), "application/x-yaml")).run()
    assert not at.exception and not at.error
    line = texts(at.caption)
    assert "Scenario in use: uploaded file **mine.yaml**" in line
    assert "(the bundled pick examples/llama3-70b-p5.yaml is not in use)" in line
    assert at.radio(key="train.from").value == "uploaded"
    up = fmsim.estimate(logic.load_base(mine, "mine.yaml"))
    assert shown(at)["Step time"] == logic.fmt_time(up.metrics["step_time_s"])
    assert dict(at.query_params) == {}                                  # a link cannot carry the file
    at.selectbox(key="train.bundled").set_value("examples/mixtral-8x22b-p6-b200.yaml").run()
    assert not at.exception
    assert "Scenario in use: bundled scenario **examples/mixtral-8x22b-p6-b200.yaml**" in texts(at.caption)
    assert at.radio(key="train.from").value == "bundled"
    at.radio(key="train.from").set_value("uploaded").run()
    assert "Scenario in use: uploaded file **mine.yaml**" in texts(at.caption)
    assert shown(at)["Step time"] == logic.fmt_time(up.metrics["step_time_s"])


def _sidebar_labels(at: AppTest) -> list[str]:
    return [str(getattr(e, "label", "")) for e in at.sidebar if getattr(e, "label", None)]


@pytest.mark.parametrize("page, first", [
    ("1_Training.py", ("Nodes", "Tensor parallel (tp)", "Pipeline (pp)")),
    ("2_Serving.py", ("Nodes", "Tensor parallel (tp)")),
])
def test_cluster_size_and_parallelism_are_the_first_knobs(page, first):
    at = open_page(page)
    labels = _sidebar_labels(at)
    later = [labels.index(x) for x in ("Model", "Precision", "Numbers from", "What-if name")]
    for label in first:
        assert labels.index(label) < min(later), (label, labels)


def test_a_node_count_the_global_batch_does_not_fit_offers_to_keep_tokens_per_step_or_per_gpu():
    at = open_page("1_Training.py")
    at.radio(key="train.engine").set_value("analytical estimate")
    at.number_input(key="train.nodes").set_value(12).run()          # 96 GPUs: dp 3 does not divide 128
    assert not at.exception and "workload.global_batch" in texts(at.error)
    offers = {b.label: b for b in at.button if b.label.startswith("Keep tokens per")}
    assert len(offers) == 2
    per_gpu = next(b for label, b in offers.items() if label.startswith("Keep tokens per GPU"))
    assert "global batch 192" in per_gpu.label                        # 128 x 96 / 64
    assert any("global batch 129" in label for label in offers)       # the multiple of 3 nearest 128
    per_gpu.click().run()
    assert not at.exception and not at.error
    assert at.number_input(key="train.global_batch").value == 192
    res = training_expect({"cluster.nodes": 12, "workload.global_batch": 192, "parallelism.dp": "auto"},
                          engine="analytical")
    assert shown(at)["Step time"] == logic.fmt_time(res.metrics["step_time_s"])
    assert res.metrics["tokens_per_s"] / res.gpus == pytest.approx(
        training_expect(engine="analytical").metrics["tokens_per_s"] / 64, rel=0.2)


def test_a_step_too_large_to_simulate_says_it_shows_the_estimate_and_why(monkeypatch):
    monkeypatch.setattr(logic, "DES_JOB_LIMIT", 10)
    at = open_page("1_Training.py")
    assert not at.exception
    warning = texts(at.warning)
    assert "Showing the analytical estimate" in warning and "not the simulation you chose" in warning
    assert "engine jobs" in warning and "limit of 10" in warning
    est = training_expect(engine="analytical")
    assert shown(at)["Step time"] == logic.fmt_time(est.metrics["step_time_s"])


def test_charts_keep_their_legends_whole_base_above_the_whatif_and_label_the_hbm_line():
    rows = logic.breakdown_rows([("base", training_expect(engine="analytical")),
                                 ("what-if", training_expect({"parallelism.tp": 4, "parallelism.dp": "auto"},
                                                             engine="analytical"))])
    spec = charts.breakdown_bar(rows).to_dict()
    assert spec["encoding"]["y"]["sort"] == ["base", "what-if"]
    assert spec["encoding"]["color"]["legend"]["labelLimit"] == 0
    mem = charts.memory_bar([{"stage": "stage 0", "part": "attention_prefill_workspace", "bytes": 2.0**34}],
                            80 * 2**30).to_dict()
    assert mem["layer"][0]["encoding"]["color"]["legend"]["labelLimit"] == 0
    assert "red dashed line: HBM 80 GiB per GPU" in mem["layer"][0]["encoding"]["y"]["title"]
    assert [layer["mark"]["type"] for layer in mem["layer"]] == ["bar", "rule"]
    cdf = charts.latency_cdf([{"metric": "ttft", "latency_s": 0.1, "quantile": 0.5}]).to_dict()
    assert cdf["encoding"]["color"]["legend"]["labelLimit"] == 0


def test_mfu_under_fp8_says_which_peak_it_divides_by():
    at = open_page("1_Training.py")
    at.radio(key="train.engine").set_value("analytical estimate")
    at.selectbox(key="train.bundled").set_value("examples/mixtral-8x22b-p6-b200.yaml").run()
    assert not at.exception
    mfu = next(m for m in at.metric if m.label == "MFU")
    res = fmsim.estimate(fmsim.load_scenario(ROOT / "scenarios" / "examples" / "mixtral-8x22b-p6-b200.yaml"))
    assert res.metrics["precision"] == "fp8"
    peak = res.metrics["model_tflops_per_gpu"] / res.metrics["mfu"]
    assert f"the fp8 dense peak of the GPU ({peak:,.0f} TFLOP/s)" in mfu.help
    assert "against the bf16 peak" in mfu.help


def test_the_analytical_serving_view_says_its_percentiles_are_one_value_and_requests_per_s_has_help():
    at = open_page("2_Serving.py")
    _upload_serving(at, "app-test-analytical")
    req = next(m for m in at.metric if m.label == "Requests/s")
    assert "requests completed per second" in req.help
    at.radio(key="serve.engine").set_value("analytical estimate").run()
    assert not at.exception
    assert "deterministic" in texts(at.caption) and "p50, p90 and p99 are equal" in texts(at.caption)


def test_a_serving_scenario_on_the_training_page_is_an_inference_scenario():
    at = open_page("1_Training.py")
    text = SMALL_SERVING.format(name="wrong-page")
    upload = ("wrong-page.yaml", text.encode(), "application/x-yaml")
    at.file_uploader(key="train.upload").set_value(upload).run()
    assert not at.exception
    assert "is an `inference` scenario: open it on the Serving page" in texts(at.warning)


def test_the_compare_pick_survives_switching_pages():
    at = open_page("3_Compare.py")
    picks = ["examples/llama3-70b-p5.yaml", "examples/mixtral-8x22b-p6-b200.yaml"]
    at.radio(key="compare.engine").set_value("analytical estimate")
    at.multiselect(key="compare.picked").set_value(picks).run()
    assert not at.exception
    for page in ("1_Training.py", "3_Compare.py"):
        at.switch_page(f"pages/{page}")
        at.run()
        assert not at.exception
    assert at.multiselect(key="compare.picked").value == picks
    assert at.radio(key="compare.engine").value == "analytical estimate"
