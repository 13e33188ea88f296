"""fmsim what-if explorer: the entry page (``fmsim app`` runs ``streamlit run app/Home.py``).

The app is thin (DESIGN.md "faces"): widgets -> the fmsim package-root API -> rendering, with
the computing in ``app/explorer/logic.py``, Streamlit caches in ``app/explorer/cache.py`` and
one file per page under ``app/pages/``. Streamlit puts this file's directory on ``sys.path``;
the pages add it themselves too, so each page also runs on its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import streamlit as st
from explorer import cache, widgets

import fmsim

widgets.page_setup("what-if explorer", ":material/calculate:")

st.title("fmsim what-if explorer")
st.markdown(
    "How long will this take, how much will it cost, and what is the bottleneck? Pick a scenario, "
    "turn a knob — instance type, node count, parallelism, precision, pricing — and see step time, "
    "MFU, memory fit, dollars and the bottleneck at once. Every number comes from the same API as "
    "`fmsim run`; download the what-if as a scenario file to run it in CI."
)

c1, c2 = st.columns(2)
with c1:
    st.page_link("pages/1_Training.py", label="Training", icon=":material/model_training:")
    st.caption(
        "Pre-training and fine-tuning: step time, MFU, time and cost to train, memory against HBM, "
        "the step's breakdown and its pipeline timeline."
    )
    st.page_link("pages/2_Serving.py", label="Serving", icon=":material/chat:")
    st.caption(
        "Inference and test-time compute: latency percentiles and CDF, throughput against load, "
        "KV-cache use, $ per million tokens and per answered question."
    )
with c2:
    st.page_link("pages/3_Compare.py", label="Compare", icon=":material/compare_arrows:")
    st.caption("Two or more scenarios (bundled, uploaded or kept what-ifs) side by side, with deltas.")
    st.page_link("pages/4_Catalog.py", label="Catalog", icon=":material/menu_book:")
    st.caption("Instances, accelerators, models and prices, with their dates and sources.")

try:
    cat = cache.catalog()
    bundled = cache.bundled()
    st.caption(
        f"fmsim {fmsim.__version__} · {len(cat.instances)} instance types, {len(cat.models)} models, "
        f"{len(bundled)} bundled scenarios."
    )
except Exception as exc:  # noqa: BLE001 - never a traceback on the page
    st.error(f"The catalog did not load: {exc}")
