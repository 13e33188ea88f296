"""Writing back: :func:`scenario_to_mapping`, the mapping (SI numbers, explicit values) that
:func:`fmsim.scenario.scenario_from_mapping` reads back to an equal scenario.
"""

from __future__ import annotations

import copy
from typing import Any

from ..catalog import Catalog, load_catalog, per_core
from .parallelism import DEFAULT_GRAD_BUCKET, GRAD_BUCKET_MEGATRON, default_grad_reduce_op, default_pp_comm
from .run import Reliability
from .spec import Scenario


def _reliability_mapping(rel: Reliability) -> dict[str, Any]:
    out: dict[str, Any] = {"restart": rel.restart_s}
    for key, value in (("node_mtbf", rel.node_mtbf_s), ("fleet", rel.fleet),
                       ("run_length", rel.run_length_s)):
        if value is not None:
            out[key] = value
    if rel.rates:
        out["rates"] = dict(rel.rates)
    if rel.trials != 200:
        out["trials"] = rel.trials
    return out


def scenario_to_mapping(sc: Scenario, *, catalog: Catalog | None = None) -> dict[str, Any]:
    """A YAML-able mapping that loads back to an equal scenario (SI numbers, no unit strings)."""
    cat = catalog if catalog is not None else load_catalog()
    wl, par, cl = sc.workload, sc.parallelism, sc.cluster
    model: Any = wl.model.name if cat.models.get(wl.model.name) == wl.model else wl.model.to_mapping()
    workload: dict[str, Any] = {"kind": wl.kind, "model": model, "precision": wl.precision}
    if wl.seq_len:
        workload["seq_len"] = wl.seq_len
    if wl.global_batch:
        workload["global_batch"] = wl.global_batch
    workload["micro_batch"] = wl.micro_batch
    if wl.train_tokens is not None:
        workload["train_tokens"] = wl.train_tokens
    if wl.attention_kernel != "flash":
        workload["attention_kernel"] = wl.attention_kernel
    if wl.fp8_attention:
        workload["fp8_attention"] = True
    if wl.cross_entropy != "fused":
        workload["cross_entropy"] = wl.cross_entropy
    if wl.kernel_fusion != "fused":
        workload["kernel_fusion"] = wl.kernel_fusion
    if wl.cuda_graphs != "none":
        workload["cuda_graphs"] = wl.cuda_graphs
    if wl.fp8_recipe != "delayed":
        workload["fp8_recipe"] = wl.fp8_recipe
    if wl.hidden_dropout:
        workload["hidden_dropout"] = wl.hidden_dropout
    if wl.attention_dropout:
        workload["attention_dropout"] = wl.attention_dropout
    if wl.lora_rank:
        workload["lora"] = {"rank": wl.lora_rank, "modules": wl.lora_modules}
        if wl.lora_dropout:
            workload["lora"]["dropout"] = wl.lora_dropout
        if wl.lora_exchange != "all-gather":
            workload["lora"]["exchange"] = wl.lora_exchange
    if wl.moe_routing != "balanced":
        workload["moe_routing"] = wl.moe_routing
    if wl.moe_imbalance != 1.0:
        workload["moe_imbalance"] = wl.moe_imbalance
    if wl.moe_capacity_factor:
        workload["moe_capacity_factor"] = wl.moe_capacity_factor
        workload["moe_pad_to_capacity"] = wl.moe_pad_to_capacity
    parallelism = {
        "tp": par.tp,
        "pp": par.pp,
        "dp": par.dp,
        "cp": par.cp,
        "ep": par.ep,
        "vpp": par.vpp,
        "schedule": par.schedule,
        "sequence_parallel": par.sequence_parallel,
        "recompute": par.recompute,
        **({"recompute_modules": list(par.recompute_modules)} if par.recompute == "selective"
           and par.recompute_policy == "modules" else {}),
        **({"recompute_policy": par.recompute_policy} if par.recompute_policy != "modules" else {}),
        **({"recompute_layers": par.recompute_layers} if par.recompute_layers else {}),
        "zero": par.zero,
        **({"dp_shard": par.dp_shard} if par.dp_shard else {}),
        **({"grad_bucket": {0: "unit", GRAD_BUCKET_MEGATRON: "megatron"}.get(par.grad_bucket, par.grad_bucket)}
           if par.grad_bucket != DEFAULT_GRAD_BUCKET else {}),
        "grad_reduce_precision": par.grad_reduce_precision,
        "param_gather_precision": par.param_gather_precision,
        **({"offload_activations": par.offload_activations} if par.offload_activations else {}),
        **({"activation_fp8_input": True} if par.activation_fp8_input else {}),
        **({} if par.fp8_transpose_cache else {"fp8_transpose_cache": False}),
        **({} if par.gradient_accumulation_fusion else {"gradient_accumulation_fusion": False}),
        "cp_comm": par.cp_comm,
        "ep_dispatch": par.ep_dispatch,
        **({"moe_grouped_gemm": par.moe_grouped_gemm} if par.moe_grouped_gemm != "multi-stream" else {}),
        **({"moe_host_sync": par.moe_host_sync} if par.moe_host_sync != "none" else {}),
        **({"param_fetch": par.param_fetch} if par.param_fetch != "unit" else {}),
        **({"grad_reduce_op": par.grad_reduce_op} if par.grad_reduce_op not in ("", default_grad_reduce_op(par.zero)) else {}),
        "overlap": {
            "grad_reduce": par.overlap.grad_reduce,
            "param_gather": par.overlap.param_gather,
            "tp_comm": par.overlap.tp_comm,
            "tp_backward": par.overlap.tp_backward,
            "tp_qkv": par.overlap.tp_qkv,
            "tp_rs_dgrad": par.overlap.tp_rs_dgrad,
            "ep_comm": par.overlap.ep_comm,
            # pp_comm's default follows the schedule: written only where it departs from it, so that a
            # change of schedule made on this mapping (the explorer's knobs) takes the new default
            **({} if par.overlap.pp_comm == default_pp_comm(par.schedule) else {"pp_comm": par.overlap.pp_comm}),
        },
        "order": list(par.order),
    }
    cluster: dict[str, Any] = {"instance": cl.instance.name, "nodes": cl.nodes, "placement": cl.placement}
    base = cat.instance(cl.instance.name)
    if cl.rank_unit != "chip":
        cluster["rank_unit"] = cl.rank_unit
        base = per_core(base)
    network: dict[str, Any] = {}
    if cl.instance != base:
        network = {
            "fabric": cl.instance.fabric.name,
            "nics_per_node": cl.instance.num_nics,
            "nic_bandwidth": cl.instance.nic_bytes_per_s,
        }
    if cl.instance.fabric.in_network_reduction != cat.fabric(cl.instance.fabric.name).in_network_reduction:
        network["in_network_reduction"] = cl.instance.fabric.in_network_reduction
    if cl.instance.scale_up.in_switch_reduction != base.scale_up.in_switch_reduction:
        network["nvls"] = cl.instance.scale_up.in_switch_reduction
    if cl.oversubscription != 1.0:
        network["oversubscription"] = cl.oversubscription
    if network:
        cluster["network"] = network
    if cl.storage is not None:
        cluster["storage"] = dict(cl.storage)
    if cl.straggler_cv:
        cluster["stragglers"] = {"cv": cl.straggler_cv}
    out: dict[str, Any] = {"version": sc.version, "name": sc.name}
    if sc.description:
        out["description"] = sc.description
    if sc.stack:
        out["stack"] = sc.stack
    if sc.configuration == "stated":
        out["configuration"] = "stated"
    elif sc.configuration:
        out["configuration"] = {"partial": sc.configuration_missing}
        if sc.configuration_unknown:
            out["configuration"]["unknown"] = {p: copy.deepcopy(list(v))
                                               for p, v in sc.configuration_unknown.items()}
    out["seed"] = sc.seed
    out["workload"] = workload
    out["parallelism"] = parallelism
    out["cluster"] = cluster
    out["pricing"] = (
        sc.pricing.option if sc.pricing.option is not None else {"usd_per_hour": sc.pricing.usd_per_hour}
    )
    if sc.checkpoint is not None:
        out["checkpoint"] = {"every": sc.checkpoint.every_s, "async": sc.checkpoint.async_}
        if sc.checkpoint.grads:
            out["checkpoint"]["grads"] = True
        if sc.checkpoint.keep != 1:
            out["checkpoint"]["keep"] = sc.checkpoint.keep
        if sc.checkpoint.staging != "pinned":
            out["checkpoint"]["staging"] = sc.checkpoint.staging
        if sc.checkpoint.writers != "all":
            out["checkpoint"]["writers"] = sc.checkpoint.writers
        if sc.checkpoint.master_only:
            out["checkpoint"]["master_only"] = True
    if sc.reliability is not None:
        out["reliability"] = _reliability_mapping(sc.reliability)
    if sc.data is not None:
        d = sc.data
        out["data"] = {k: v for k, v in (("bytes_per_token", None if d.sample_bytes else d.bytes_per_token),
                                         ("sample_bytes", d.sample_bytes), ("prefetch", d.prefetch),
                                         ("source", d.source), ("samples_per_file", d.samples_per_file))
                       if v is not None}
    if sc.measured:
        measured: dict[str, Any] = dict(sc.measured)
        measured["source"] = sc.measured_source
        for key in ("flops_formula", "notes"):
            if key in sc.measured_notes:
                measured[key] = sc.measured_notes[key]
        if sc.measured_peak_flop_per_s is not None:
            measured["peak"] = sc.measured_peak_flop_per_s
        out["measured"] = measured
    if sc.expect:
        out["expect"] = {
            k: {
                "value": (bool(e.value) if k == "fits" else e.value),
                "rel_tol": e.rel_tol,
                "abs_tol": e.abs_tol,
            }
            for k, e in sc.expect.items()
        }
    for key, value in sc.extra.items():
        out[key] = copy.deepcopy(dict(value))
    return out
