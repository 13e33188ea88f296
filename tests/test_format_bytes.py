"""Sizes in messages go through the one number formatter (:func:`fmsim.units.format_quantity`, by way of
:func:`fmsim.units.format_bytes`): the out-of-memory messages of training, RL and serving write
``85.3 GiB`` / ``80 GiB`` / ``1.21 TiB`` as every face does, not ``x / 2**30`` each their own way."""
from __future__ import annotations

import pytest

import fmsim
from fmsim.errors import OutOfMemoryError
from fmsim.model.memory import MemoryBreakdown
from fmsim.units import format_bytes, format_quantity

GIB = 2.0**30


@pytest.mark.parametrize("value, text", [
    (80 * GIB, "80 GiB"), (85.3 * GIB, "85.3 GiB"), (141 * GIB, "141 GiB"), (0.5 * GIB, "512 MiB"),
    (1240 * GIB, "1.21 TiB"), (2048 * GIB, "2 TiB"), (0.0, "0 B"),
])
def test_format_bytes_is_format_quantity_in_bytes(value, text):
    assert format_bytes(value) == text == format_quantity(value, "bytes")


def test_a_training_stage_that_overflows_names_its_sizes_in_the_one_format():
    m = MemoryBreakdown(weights=40 * GIB, gradients=20 * GIB, optimizer=30.5 * GIB, activations=1 * GIB, logits=0.0)
    with pytest.raises(OutOfMemoryError) as exc:
        m.require_fit(80 * GIB, where="stage 0")
    assert str(exc.value).startswith("stage 0: needs 91.5 GiB per GPU of 80 GiB; largest part: weights 40 GiB ")


def test_serving_weights_that_leave_no_kv_cache_name_their_sizes_in_the_one_format():
    from test_serving_cost import _cm

    cat = fmsim.load_catalog()
    cm = _cm(cat, model="llama3.1-405b", inst="dgx-h100", prec="bf16", tp=1)
    hbm = cat.instance("dgx-h100").accelerator.hbm_bytes
    with pytest.raises(OutOfMemoryError) as exc:
        cm.kv_capacity_tokens(hbm_bytes=hbm, memory_fraction=0.9, fraction_of="total", activation_bytes=0.0)
    text = str(exc.value)
    assert f"needs {format_bytes(cm.weight_bytes_per_gpu)} of weights per GPU" in text
    assert "with 0 B of activations" in text and f"in {format_bytes(hbm)} x 0.9" in text
    assert "GiB" in format_bytes(hbm) and "/ 2**30" not in text


def test_an_rl_update_that_does_not_fit_names_its_sizes_in_the_one_format():
    from fmsim.scenario import scenario_from_mapping

    sc = scenario_from_mapping({
        "version": 1, "name": "x", "workload": {"kind": "rl", "model": "kimi-k2", "precision": "fp8"},
        "cluster": {"instance": "hgx-h20", "nodes": 2}, "pricing": {"usd_per_hour": 0.0001},
        "rl": {"only": "weight_sync", "generation": {"tp": 16},
               "weight_sync": {"method": "broadcast", "source": "host", "bucket": "13 GiB"}},
    }, file="x.yaml")
    with pytest.raises(OutOfMemoryError) as exc:
        fmsim.simulate(sc)
    b = exc.value.breakdown
    assert f"one bucket ({format_bytes(3 * 13 * GIB)}) need" in str(exc.value)
    assert f"of {format_bytes(b['hbm'])}; lower the bucket" in str(exc.value)
    assert f"({format_bytes(b['engine_weights'])} per GPU at tp 16)" in str(exc.value)
