"""Model architectures: the frozen :class:`ModelSpec` and its parameter counts.

Owns the keys of a ``model_catalog/`` entry and of an inline ``workload.model`` mapping (they are
the same), their validation, and parameter counting from the architecture (embedding, attention
of each kind, dense MLP, MoE experts). Pure data: imported by the data layer to validate scenarios.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

ACTIVATIONS = ("gelu", "swiglu", "geglu", "relu2", "relu")
ATTENTION_KINDS = ("mha", "gqa", "mla", "mqa")
MODEL_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "activation",
              "vocab", "tied_embeddings", "attention", "moe", "source", "params", "active_params",
              "notes", "norm", "bias", "max_seq_len", "family", "mtp_layers")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")
MOE_KEYS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "dense_layers",
            "dense_ffn_hidden", "shared_expert_ffn_hidden", "capacity_factor", "layer_freq")


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    q_lora_rank: int          # 0 = no query compression
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts layout: routed experts, shared experts and leading dense layers."""

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    shared_expert_ffn_hidden: int = 0   # 0 = expert_ffn_hidden
    dense_layers: int = 0               # leading layers with a dense MLP
    dense_ffn_hidden: int = 0           # 0 = ModelSpec.ffn_hidden
    capacity_factor: float = 0.0        # 0 = dropless
    layer_freq: int = 1                 # every n-th layer (after dense_layers) is MoE


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, as the catalog and scenario files describe it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    activation: str
    vocab: int
    tied_embeddings: bool = False
    attention: str = "mha"
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    bias: bool = False
    source: str = ""
    published_params: float | None = None          # total, as the source states it
    published_active_params: float | None = None

    # -- structure -------------------------------------------------------------------------
    @property
    def gated(self) -> bool:
        return self.activation in ("swiglu", "geglu")

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) has an MoE MLP."""
        if self.moe is None or i < self.moe.dense_layers:
            return False
        return (i - self.moe.dense_layers) % self.moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    # -- parameter counts -------------------------------------------------------------------
    def attention_params(self) -> int:
        """Weights of one attention block (projections; biases if ``bias``)."""
        h = self.hidden
        if self.attention == "mla":
            m = self.mla
            assert m is not None
            qk = m.qk_nope_dim + m.qk_rope_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.heads * qk  # down, norm, up
            else:
                q = h * self.heads * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_dim) + m.kv_lora_rank \
                + m.kv_lora_rank * self.heads * (m.qk_nope_dim + m.v_head_dim)
            o = self.heads * m.v_head_dim * h
            return q + kv + o
        q = h * self.heads * self.head_dim
        kv = 2 * h * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * h
        b = (self.heads + 2 * self.kv_heads) * self.head_dim + h if self.bias else 0
        return q + kv + o + b

    def mlp_params(self, ffn: int) -> int:
        """Weights of one dense MLP of width ``ffn``."""
        mats = 3 if self.gated else 2
        b = (ffn * (2 if self.gated else 1) + self.hidden) if self.bias else 0
        return mats * self.hidden * ffn + b

    def layer_params(self, i: int) -> tuple[int, int]:
        """(total, active) parameters of layer ``i``, norms included."""
        norms = 2 * self.hidden * (2 if self.bias else 1)
        attn = self.attention_params()
        if not self.is_moe_layer(i):
            ffn = self.moe.dense_ffn_hidden if (self.moe and self.moe.dense_ffn_hidden) else self.ffn_hidden
            mlp = self.mlp_params(ffn)
            return attn + mlp + norms, attn + mlp + norms
        m = self.moe
        assert m is not None
        expert = self.mlp_params(m.expert_ffn_hidden)
        shared = m.shared_experts * self.mlp_params(m.shared_expert_ffn_hidden or m.expert_ffn_hidden)
        router = self.hidden * m.experts
        total = attn + norms + router + shared + m.experts * expert
        active = attn + norms + router + shared + m.top_k * expert
        return total, active

    def embedding_params(self) -> int:
        """Input embedding plus (untied) output projection."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def param_counts(self) -> tuple[int, int]:
        """(total, active-per-token) parameters, embeddings and final norm included."""
        total = active = self.embedding_params() + self.hidden
        for i in range(self.layers):
            t, a = self.layer_params(i)
            total += t
            active += a
        return total, active

    @property
    def num_params(self) -> int:
        return self.param_counts()[0]

    @property
    def num_active_params(self) -> int:
        return self.param_counts()[1]

    def to_mapping(self) -> dict[str, Any]:
        """The catalog/scenario mapping this spec reads back from (round-trips)."""
        out: dict[str, Any] = {
            "name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
            "kv_heads": self.kv_heads, "head_dim": self.head_dim, "ffn_hidden": self.ffn_hidden,
            "activation": self.activation, "vocab": self.vocab, "tied_embeddings": self.tied_embeddings,
        }
        if self.attention == "mla" and self.mla is not None:
            out["attention"] = {"kind": "mla", **{k: getattr(self.mla, k) for k in MLA_KEYS}}
        else:
            out["attention"] = self.attention
        if self.moe is not None:
            out["moe"] = {k: getattr(self.moe, k) for k in MOE_KEYS}
        if self.bias:
            out["bias"] = True
        if self.source:
            out["source"] = self.source
        if self.published_params:
            out["params"] = self.published_params
        if self.published_active_params:
            out["active_params"] = self.published_active_params
        return out


def _int(data: Mapping[str, Any], key: str, err, *, default: Any = None, minimum: int = 1) -> int:
    if key not in data or data[key] is None:
        if default is None:
            raise err(key, "is required")
        return default
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise err(key, f"{v!r} is not an integer")
    if v < minimum:
        raise err(key, f"{v} must be >= {minimum}")
    return v


def _unknown(data: Mapping[str, Any], allowed: tuple[str, ...], err) -> None:
    from ..catalog import suggest

    for k in data:
        if k not in allowed:
            raise err(str(k), f"unknown key{suggest(str(k), allowed)}")


def model_from_mapping(data: Any, *, name: str | None = None, file: str | None = None,
                       where: str = "model", require_source: bool = False) -> ModelSpec:
    """Build and validate a :class:`ModelSpec` from catalog/scenario keys.

    Errors are :class:`ConfigError` located at ``file``/``where.key``.
    """
    from ..units import parse_count

    def err(key: str, msg: str) -> ConfigError:
        return ConfigError(msg, file=file, field=f"{where}.{key}" if key else where)

    if not isinstance(data, Mapping):
        raise err("", f"expected a mapping of architecture keys, got {type(data).__name__}")
    _unknown(data, MODEL_KEYS, err)
    name = str(data.get("name") or name or "")
    if not name:
        raise err("name", "is required for an inline model")
    layers = _int(data, "layers", err)
    hidden = _int(data, "hidden", err)
    heads = _int(data, "heads", err)
    kv_heads = _int(data, "kv_heads", err, default=heads)
    if heads % kv_heads:
        raise err("kv_heads", f"{kv_heads} does not divide {heads} heads")
    head_dim = _int(data, "head_dim", err, default=max(1, hidden // heads))
    activation = str(data.get("activation", "gelu"))
    if activation not in ACTIVATIONS:
        from ..catalog import suggest
        raise err("activation", f"unknown activation {activation!r}{suggest(activation, ACTIVATIONS)}")
    ffn_hidden = _int(data, "ffn_hidden", err, default=4 * hidden)
    vocab = _int(data, "vocab", err)
    tied = data.get("tied_embeddings", False)
    if not isinstance(tied, bool):
        raise err("tied_embeddings", f"{tied!r} is not true/false")
    att = data.get("attention", "gqa" if kv_heads != heads else "mha")
    mla = None
    if isinstance(att, Mapping):
        sub = dict(att)
        kind = str(sub.pop("kind", "mla"))
        if kind != "mla":
            raise err("attention.kind", "only mla takes dimensions")

        def aerr(key: str, msg: str) -> ConfigError:
            return err(f"attention.{key}", msg)

        _unknown(sub, MLA_KEYS, aerr)
        mla = MLASpec(q_lora_rank=_int(sub, "q_lora_rank", aerr, default=0, minimum=0),
                      kv_lora_rank=_int(sub, "kv_lora_rank", aerr),
                      qk_nope_dim=_int(sub, "qk_nope_dim", aerr),
                      qk_rope_dim=_int(sub, "qk_rope_dim", aerr),
                      v_head_dim=_int(sub, "v_head_dim", aerr))
        att = "mla"
    elif att not in ATTENTION_KINDS:
        from ..catalog import suggest
        raise err("attention", f"unknown attention kind {att!r}{suggest(str(att), ATTENTION_KINDS)}")
    elif att == "mla":
        raise err("attention", "mla needs its dimensions: {kind: mla, kv_lora_rank: ..., ...}")
    moe = None
    if data.get("moe") is not None:
        m = data["moe"]

        def merr(key: str, msg: str) -> ConfigError:
            return err(f"moe.{key}", msg)

        if not isinstance(m, Mapping):
            raise merr("", "expected a mapping {experts, top_k, expert_ffn_hidden, ...}")
        _unknown(m, MOE_KEYS, merr)
        experts = _int(m, "experts", merr)
        top_k = _int(m, "top_k", merr)
        if top_k > experts:
            raise merr("top_k", f"{top_k} exceeds {experts} experts")
        dense_layers = _int(m, "dense_layers", merr, default=0, minimum=0)
        if dense_layers >= layers:
            raise merr("dense_layers", f"{dense_layers} leaves no MoE layer among {layers}")
        cf = m.get("capacity_factor", 0.0) or 0.0
        if not isinstance(cf, (int, float)) or isinstance(cf, bool) or cf < 0:
            raise merr("capacity_factor", f"{cf!r} must be a number >= 0 (0 = dropless)")
        moe = MoESpec(experts=experts, top_k=top_k,
                      expert_ffn_hidden=_int(m, "expert_ffn_hidden", merr, default=ffn_hidden),
                      shared_experts=_int(m, "shared_experts", merr, default=0, minimum=0),
                      shared_expert_ffn_hidden=_int(m, "shared_expert_ffn_hidden", merr, default=0, minimum=0),
                      dense_layers=dense_layers,
                      dense_ffn_hidden=_int(m, "dense_ffn_hidden", merr, default=0, minimum=0),
                      capacity_factor=float(cf),
                      layer_freq=_int(m, "layer_freq", merr, default=1))
    source = data.get("source", "")
    if isinstance(source, list):
        source = "; ".join(map(str, source))
    if require_source and not str(source).strip():
        raise err("source", "is required (every catalog number needs a source)")

    def count(key: str) -> float | None:
        if data.get(key) is None:
            return None
        try:
            return parse_count(data[key])
        except ConfigError as exc:
            raise err(key, exc.message) from None

    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, ffn_hidden=ffn_hidden, activation=activation, vocab=vocab,
                     tied_embeddings=tied, attention=str(att), mla=mla, moe=moe,
                     bias=bool(data.get("bias", False)), source=str(source),
                     published_params=count("params"), published_active_params=count("active_params"))
