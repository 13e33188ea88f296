"""``fmsim collective``: nccl-tests style output, JSON, sweeps and one-line errors."""
from __future__ import annotations

import argparse
import io
import json

import pytest

from fmsim.cli_collective import SWEEP_SIZES, add_parser, main, run
from fmsim.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fmsim")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["collective", *argv])


def call(*argv: str) -> str:
    out = io.StringIO()
    assert run(parse(*argv), out=out) == 0
    return out.getvalue()


def test_prints_time_algbw_busbw_and_algorithm():
    text = call("all-reduce", "--instance", "p5.48xlarge", "--nodes", "2", "--size", "16GiB")
    assert "16 ranks" in text and "busbw" in text and "algbw" in text and "algorithm" in text
    busbw = float(text.split("busbw")[1].split("GB/s")[0])
    assert busbw == pytest.approx(487.09, rel=0.10)            # S20 2 x p5, 16 GiB


def test_json_gives_one_object_with_the_contract_keys():
    obj = json.loads(call("all-reduce", "--instance", "p5en.48xlarge", "--nodes", "16", "--size", "16GiB",
                          "--json"))
    assert {"time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "algorithm"} <= set(obj)
    assert obj["busbw_bytes_per_s"] / 1e9 == pytest.approx(369.86, rel=0.10)   # S20 16 x p5en


def test_p4de_reproduces_its_published_bus_bandwidth():
    obj = json.loads(call("all-reduce", "--instance", "p4de.24xlarge", "--nodes", "2", "--size", "2GiB",
                          "--json"))
    assert obj["busbw_bytes_per_s"] / 1e9 == pytest.approx(78.33, rel=0.10)


def test_sweep_json_is_a_list_over_8_bytes_to_16_gib():
    rows = json.loads(call("all-gather", "--instance", "p5.48xlarge", "--nodes", "2", "--sweep", "--json"))
    assert [r["size_bytes"] for r in rows] == list(SWEEP_SIZES)
    assert rows[0]["size_bytes"] == 8 and rows[-1]["size_bytes"] == 16 * 2 ** 30
    times = [r["time_s"] for r in rows]
    assert times == sorted(times)


def test_sweep_table_has_one_row_per_size():
    text = call("all-reduce", "--instance", "p5.48xlarge", "--sweep")
    rows = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(rows) == len(SWEEP_SIZES)
    assert rows[-1].split()[0] == str(16 * 2 ** 30)


def test_algorithm_and_members_per_node_can_be_chosen():
    obj = json.loads(call("all-reduce", "--instance", "p5.48xlarge", "--nodes", "4", "--per-node", "1",
                          "--algo", "ring", "--json"))
    assert obj["algorithm"] == "ring"
    # one GPU per node: its 4 of the node's 32 x 100 Gbps NICs at the efa-v2 efficiency
    assert obj["busbw_bytes_per_s"] < 50e9


def test_sharp_makes_a_long_reduce_scatter_latency_free_of_the_node_count():
    """448 ranks, two per DGX H100: the ring pays a hop per member, SHARP two fabric latencies."""
    args = ("reduce-scatter", "--instance", "dgx-h100", "--per-node", "2", "--size", "8", "--json")
    ring = [json.loads(call(*args, "--nodes", n))["time_s"] for n in ("16", "224")]
    sharp = [json.loads(call(*args, "--nodes", n, "--sharp")) for n in ("16", "224")]
    assert ring[1] > 10 * ring[0]
    assert sharp[0]["algorithm"] == sharp[1]["algorithm"] == "collnet"
    assert sharp[1]["time_s"] == pytest.approx(sharp[0]["time_s"], rel=1e-6) and sharp[1]["time_s"] < ring[0]
    assert "SHARP" in call("reduce-scatter", "--instance", "dgx-h100", "--nodes", "2", "--sharp")


@pytest.mark.parametrize("argv,field", [
    (("allreduce", "--instance", "p5.48xlarge"), "op"),
    (("all-reduce", "--instance", "p5.48xlarge", "--nodes", "two"), "nodes"),
    (("all-reduce", "--instance", "p5.48xlarge", "--nodes", "0"), "nodes"),
    (("all-reduce", "--instance", "p5.48xlarge", "--size", "1 parsec"), None),
    (("all-reduce", "--instance", "p5.48xlarge", "--algo", "magic"), "algo"),
    (("all-gather", "--instance", "p5.48xlarge", "--algo", "tree"), "algo"),
    (("all-reduce", "--instance", "p5.48xlarge", "--per-node", "3"), "per-node"),
    (("all-reduce", "--instance", "p9.mega"), None),
    (("reduce-scatter", "--instance", "p5.48xlarge", "--nodes", "2", "--sharp"), "sharp"),
])
def test_bad_input_is_a_config_error(argv, field):
    with pytest.raises(ConfigError) as err:
        run(parse(*argv), out=io.StringIO())
    if field:
        assert err.value.field == field


def test_stand_alone_entry_turns_errors_into_exit_code_2(capsys):
    assert main(["all-reduce", "--instance", "p5.48xlarge", "--nodes", "zero"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fmsim collective: nodes:") and "Traceback" not in err
