"""Catalog page: the instances, accelerators, models, prices, fabrics and storage tiers fmsim
knows, with the date of every price and the source of every figure (issue 6, item 4)."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # app/ (see app/Home.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st
from explorer import cache, logic, widgets

P = "catalog"
TABLES = ("Instances", "Accelerators", "Models", "Prices", "Fabrics", "Storage")

widgets.page_setup("Catalog", ":material/menu_book:")


def _gbps(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e9:,.0f}"


def _tflops(acc, precision: str) -> str:
    v = acc.peak_flop_per_s.get(precision)
    return f"{v / 1e12:,.0f}" if v else "-"


def instances(cat) -> list[dict]:
    rows = []
    for name, i in sorted(cat.instances.items()):
        price = None if i.is_reference else cat.price(name, "on-demand")
        rows.append(
            {
                "instance": name,
                "provider": i.provider,
                "accelerator": i.accelerator.name,
                "per node": i.num_accelerators,
                "HBM per GPU": logic.fmt_bytes(i.accelerator.hbm_bytes),
                "scale-up": f"{i.scale_up.kind} {i.scale_up.domain_size}",
                "scale-up GB/s per GPU": f"{i.scale_up.bytes_per_s / 1e9:,.0f}",
                "fabric": i.fabric.name,
                "scale-out Gbps": _gbps(i.scale_out_bytes_per_s),
                "on-demand $/h": f"{price.usd_per_hour:,.2f}" if price else "-",
                "price date": price.date if price else "-",
                "source": i.source,
            }
        )
    return rows


def accelerators(cat) -> list[dict]:
    rows = []
    for name, a in sorted(cat.accelerators.items()):
        rows.append(
            {
                "accelerator": name,
                "vendor": a.vendor,
                "memory": f"{logic.fmt_bytes(a.hbm_bytes)} {a.memory_type}",
                "HBM TB/s": f"{a.hbm_bytes_per_s / 1e12:.2f}",
                "BF16 TFLOP/s": _tflops(a, "bf16"),
                "FP8 TFLOP/s": _tflops(a, "fp8"),
                "FP4 TFLOP/s": _tflops(a, "fp4"),
                "GEMM efficiency (bf16)": f"{a.gemm_efficiency.get('bf16', float('nan')):.2f}",
                "HBM efficiency": f"{a.hbm_efficiency:.2f}",
                "source": a.source,
                "efficiency source": a.calibration,
            }
        )
    return rows


def models(cat) -> list[dict]:
    rows = []
    for name, m in sorted(cat.models.items()):
        total, active = m.param_counts()
        rows.append(
            {
                "model": name,
                "parameters": logic.fmt_count(total),
                "active per token": logic.fmt_count(active),
                "layers": m.layers,
                "hidden": m.hidden,
                "heads / KV heads": f"{m.heads} / {m.kv_heads}",
                "FFN": m.ffn_hidden,
                "vocab": m.vocab,
                "attention": m.attention,
                "MoE": f"{m.moe.experts} experts, top-{m.moe.top_k}" if m.moe is not None else "-",
                "source": m.source,
            }
        )
    return rows


def prices(cat) -> list[dict]:
    rows = []
    for inst, ps in sorted(cat.prices.items()):
        for p in sorted(ps, key=lambda p: (p.option, p.date)):
            rows.append(
                {
                    "instance": inst,
                    "option": p.option,
                    "$/h per node": f"{p.usd_per_hour:,.2f}",
                    "date": p.date,
                    "region": p.region,
                    "note": p.note,
                    "source": p.source,
                }
            )
    return rows


def fabrics(cat) -> list[dict]:
    return [
        {
            "fabric": n,
            "kind": f.kind,
            "NIC Gbps": _gbps(f.nic_bytes_per_s),
            "latency": logic.fmt_time(f.latency_s),
            "efficiency": f"{f.efficiency:.2f}",
            "in-network reduction": "yes" if f.in_network_reduction else "no",
            "source": f.source,
        }
        for n, f in sorted(cat.fabrics.items())
    ]


def storage(cat) -> list[dict]:
    return [
        {
            "tier": n,
            "kind": t.kind,
            "deployment": t.deployment or "-",
            "MB/s per TiB": f"{t.throughput_per_tib_bytes_per_s / 1e6:,.0f}"
            if t.throughput_per_tib_bytes_per_s
            else "-",
            "per client GB/s": f"{t.per_client_bytes_per_s / 1e9:,.2f}" if t.per_client_bytes_per_s else "-",
            "$/GB-month": f"{t.usd_per_gb_month:.4g}" if t.usd_per_gb_month is not None else "-",
            "price date": t.price_date or "-",
            "source": t.source,
        }
        for n, t in sorted(cat.storage.items())
    ]


BUILDERS = {
    "Instances": instances,
    "Accelerators": accelerators,
    "Models": models,
    "Prices": prices,
    "Fabrics": fabrics,
    "Storage": storage,
}


def main() -> None:
    st.title("Catalog")
    st.caption(
        "What fmsim knows, from `hardware_catalog/` and `model_catalog/`: every figure with its "
        "source, every price with its date (USD per node-hour, us-east-1 unless noted)."
    )
    try:
        cat = cache.catalog()
    except Exception as exc:  # noqa: BLE001 - a catalog error is shown, never a traceback
        widgets.show_error(str(exc), "Fix the catalog file and field the message names.")
        return
    table = st.radio("Table", TABLES, horizontal=True, key=f"{P}.table")
    needle = st.text_input("Filter (any column contains)", key=f"{P}.filter").strip().lower()
    rows = BUILDERS[table](cat)
    if needle:
        rows = [r for r in rows if any(needle in str(v).lower() for v in r.values())]
    st.session_state[f"{P}.rows"] = len(rows)
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        height=min(38 + 35 * max(1, len(rows)), 800),
        column_config={"source": st.column_config.TextColumn("source", width="large")},
    )
    st.caption(f"{len(rows)} {table.lower()}")


main()
