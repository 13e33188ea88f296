"""Model architectures: the frozen :class:`ModelSpec` and its parameter counts.

Owns the keys of a ``model_catalog/`` entry and of an inline ``workload.model`` mapping (they are
the same, documented in ``model_catalog/README.md``), their validation, and parameter counting from
the architecture: token and learned position embeddings, attention of each kind (MHA, GQA, MQA,
DeepSeek's multi-head latent attention), dense MLPs (GELU/ReLU/squared-ReLU with two matrices,
SwiGLU/GeGLU with three), MoE layers (routed and shared experts, router, leading dense layers),
norms and biases, and DeepSeek-V3's multi-token-prediction (MTP) modules, which published totals
leave out. Pure data: imported by the data layer to validate scenarios.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..fields import _MISSING, _Section, _what
from ..units import parse_count

ACTIVATIONS = ("gelu", "swiglu", "geglu", "relu2", "relu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
ATTENTION_KINDS = ("mha", "gqa", "mla", "mqa")
NORMS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")
MODEL_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "activation",
              "vocab", "tied_embeddings", "attention", "moe", "source", "params", "active_params",
              "notes", "norm", "bias", "max_seq_len", "family", "mtp_layers", "position_embedding",
              "attention_window")


class HashMemo:
    """Base of a frozen, slotted dataclass whose hash :func:`memoise_hash` keeps: one slot, no field
    (``dataclasses.fields``, ``repr``, equality, pickling and ``replace`` see only the fields)."""

    __slots__ = ("_hash_memo",)


def memoise_hash(cls):
    """Class decorator (above ``@dataclass(frozen=True, slots=True)`` of a :class:`HashMemo` subclass):
    the generated ``__hash__`` -- the hash of the fields' tuple -- computed once per object and kept
    in its slot. The same value as before, so equality and every dict and set behave as they did; the
    search's caches key on models and workloads many times per plan (25 model hashes per candidate)."""
    field_hash = cls.__hash__

    def __hash__(self, _field_hash=field_hash, _set=object.__setattr__):
        try:
            return self._hash_memo
        except AttributeError:
            h = _field_hash(self)
            _set(self, "_hash_memo", h)
            return h

    __hash__.__doc__ = field_hash.__doc__
    cls.__hash__ = __hash__
    return cls
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")
WINDOW_KEYS = ("size", "kind", "full_every")
WINDOW_KINDS = ("sliding", "chunked")
MOE_KEYS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "dense_layers",
            "dense_ffn_hidden", "shared_expert_ffn_hidden", "capacity_factor", "layer_freq",
            "router_groups", "router_group_topk")


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
    # group-limited routing (DeepSeek's node-limited routing): the experts form router_groups
    # contiguous groups and a token picks its top_k experts inside router_group_topk of them
    router_groups: int = 1              # 1 = no groups
    router_group_topk: int = 0          # 0 = every group

    def token_groups(self) -> int:
        """Groups one token's experts may come from."""
        return self.router_group_topk or self.router_groups


def causal_pairs(chunk: int, past: int) -> float:
    """(query, key) pairs a causal chunk computes: each new token attends to ``past`` + its prefix."""
    return chunk * past + chunk * (chunk + 1) / 2.0


def window_pairs(chunk: int, past: int, window: int) -> float:
    """(query, key) pairs of a causal chunk under a sliding window: the token at position j
    (1-based) attends to min(j, window) keys, for j = past + 1 .. past + chunk."""
    w, end = float(window), float(past + chunk)
    if end <= w:
        return causal_pairs(chunk, past)
    if past >= w:
        return chunk * w
    return (w * (w + 1) - past * (past + 1)) / 2.0 + (end - w) * w


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionWindow:
    """Local attention on some layers: a query sees at most ``size`` keys.

    ``sliding``: the ``size`` tokens up to and including itself (Mistral 7B; GPT-OSS's 128-token
    layers; Gemma's local layers). ``chunked``: the tokens of its own ``size``-token chunk up to
    itself (Llama 4's chunked attention). Every ``full_every``-th layer (layer i with
    (i + 1) % full_every == 0) keeps full causal attention; 0: every layer is local."""

    size: int
    kind: str = "sliding"
    full_every: int = 0

    def keys_per_query(self, seq_len: float) -> float:
        """Mean keys a query of a causal ``seq_len``-token sequence attends to (pairs / seq_len)."""
        s, w = float(seq_len), float(self.size)
        if s <= 0:
            return 0.0
        if self.kind == "chunked":
            full, rest = divmod(s, w)
            return (full * w * (w + 1) / 2 + rest * (rest + 1) / 2) / s
        return window_pairs(s, 0, w) / s


@memoise_hash
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec(HashMemo):
    """A decoder-only transformer, as the catalog and scenario files describe it.

    ``num_params`` / ``num_active_params`` count what published totals count: embeddings, every
    layer, final norm; MTP modules excluded (``param_counts(include_mtp=True)`` adds them).
    """

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
    bias: bool = False                  # biases on every linear layer (GPT-2/3, OPT, BLOOM)
    norm: str = "rmsnorm"               # layernorm (weight + bias) | rmsnorm (weight)
    position_embedding: str = "rope"    # rope | learned | alibi | none
    max_seq_len: int = 0                # rows of a learned position table; 0 = not stated
    mtp_layers: int = 0                 # DeepSeek-V3 multi-token-prediction depth
    window: AttentionWindow | None = None   # local attention on some or all layers
    source: str = ""
    published_params: float | None = None          # total, as the source states it
    published_active_params: float | None = None

    # -- structure -------------------------------------------------------------------------
    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) has an MoE MLP."""
        if self.moe is None or i < self.moe.dense_layers:
            return False
        return (i - self.moe.dense_layers) % self.moe.layer_freq == 0

    def is_windowed_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) attends locally (see :class:`AttentionWindow`)."""
        w = self.window
        return w is not None and not (w.full_every and (i + 1) % w.full_every == 0)

    def attention_keys(self, i: int, seq_len: float) -> float:
        """Mean keys a query attends to in layer ``i`` of a causal ``seq_len``-token sequence."""
        if self.is_windowed_layer(i):
            assert self.window is not None
            return self.window.keys_per_query(seq_len)
        return seq_len / 2.0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    # -- parameter counts -------------------------------------------------------------------
    def norm_params(self) -> int:
        """Weights of one norm over ``hidden``: LayerNorm has a gain and a bias, RMSNorm a gain."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> int:
        """Weights of one attention block (projections; biases if ``bias``)."""
        h = self.hidden
        if self.attention == "mla":
            # DeepSeek-V2 (arXiv 2405.04434) §2.1.2 eqs. 9-12 and 37: queries and keys/values are
            # down-projected to a latent (with an RMSNorm on it), then up-projected per head; the
            # decoupled RoPE key (qk_rope_dim) is shared by all heads and comes from the input.
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
        # Q, K, V and output projections; GQA/MQA share K/V over heads // kv_heads query heads
        # (Ainslie et al. 2023, arXiv 2305.13245 §2)
        q = h * self.heads * self.head_dim
        kv = 2 * h * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * h
        b = (self.heads + 2 * self.kv_heads) * self.head_dim + h if self.bias else 0
        return q + kv + o + b

    def kv_heads_per_rank(self, tp: int) -> float:
        """K/V heads each of ``tp`` tensor-parallel ranks computes and holds. A rank needs whole heads:
        when ``tp`` exceeds ``kv_heads`` each K/V head is replicated on ``tp / kv_heads`` ranks (NeuronX
        Distributed's ``kv_replicator``; vLLM replicates the same way when serving), so a rank still
        holds one head instead of a fraction."""
        return max(self.kv_heads / tp, 1.0)

    def replicated_kv_params(self, tp: int) -> float:
        """Per layer, the K/V projection weights a tensor-parallel rank holds beyond its ``1/tp`` share
        of the layer (0 unless ``tp > kv_heads``; MLA's latent K/V is not split by heads)."""
        if self.attention == "mla" or tp <= self.kv_heads:
            return 0.0
        per_head = 2 * self.hidden * self.head_dim          # K and V rows of one head
        return per_head * (self.kv_heads_per_rank(tp) - self.kv_heads / tp)

    def mlp_params(self, ffn: int) -> int:
        """Weights of one dense MLP of width ``ffn``.

        Two matrices for GELU/ReLU/squared-ReLU (Vaswani et al. 2017; So et al. 2021 for relu2,
        used by Nemotron-4), three for gated units (Shazeer 2020, arXiv 2002.05202 eq. 6).
        """
        mats = 3 if self.gated else 2
        b = (ffn * (2 if self.gated else 1) + self.hidden) if self.bias else 0
        return mats * self.hidden * ffn + b

    def lora_params(self, i: int, rank: int, modules: str = "all") -> int:
        """Trainable LoRA parameters of layer ``i``: rank·(in + out) per adapted linear layer
        (Hu et al. 2021, eq. 3). ``modules``: ``attention`` (Q, K, V, O) or ``all`` linear layers
        (plus the dense or shared-expert MLP; routed experts are not adapted)."""
        h = self.hidden
        if self.attention == "mla" and self.mla is not None:
            m = self.mla
            dq = self.heads * (m.qk_nope_dim + m.qk_rope_dim)
            attn = rank * (h + dq) + rank * (h + m.kv_lora_rank + m.qk_rope_dim) \
                + rank * (self.heads * m.v_head_dim + h)
        else:
            dq = self.heads * self.head_dim
            dkv = 2 * self.kv_heads * self.head_dim
            attn = rank * (h + dq + dkv) + rank * (dq + h)
        if modules == "attention":
            return attn
        if self.is_moe_layer(i):
            ffn = (self.moe.shared_expert_ffn_hidden or self.moe.expert_ffn_hidden) * self.moe.shared_experts
        else:
            ffn = self.moe.dense_ffn_hidden if (self.moe and self.moe.dense_ffn_hidden) else self.ffn_hidden
        if not ffn:
            return attn
        up = ffn * (2 if self.gated else 1)
        return attn + rank * (h + up) + rank * (ffn + h)

    def total_lora_params(self, rank: int, modules: str = "all") -> int:
        """Trainable LoRA parameters of the whole model (:meth:`lora_params` summed over its layers)."""
        return sum(self.lora_params(i, rank, modules) for i in range(self.layers))

    def router_params(self) -> int:
        """Weights of one MoE router (a hidden x experts linear layer); 0 for a dense model."""
        return self.hidden * self.moe.experts if self.moe else 0

    def layer_kinds(self, layers: Sequence[int] | None = None) -> tuple[tuple[int, int], ...]:
        """(first layer, count) of each kind of layer among ``layers`` (all by default): dense MLP and MoE
        MLP. A layer's parameters and stored activations depend only on its kind, so sums over layers
        price each kind once (a per-layer property that came to matter -- local attention's window, say --
        would have to become part of the kind)."""
        ids = range(self.layers) if layers is None else layers
        out: dict[bool, list[int]] = {}
        for i in ids:
            k = out.setdefault(self.is_moe_layer(i), [i, 0])
            k[1] += 1
        return tuple((first, count) for first, count in out.values())

    def layer_params(self, i: int) -> tuple[int, int]:
        """(total, active) parameters of layer ``i``, norms included."""
        norms = 2 * self.norm_params()
        attn = self.attention_params()
        if not self.is_moe_layer(i):
            ffn = self.moe.dense_ffn_hidden if (self.moe and self.moe.dense_ffn_hidden) else self.ffn_hidden
            mlp = self.mlp_params(ffn)
            return attn + mlp + norms, attn + mlp + norms
        m = self.moe
        assert m is not None
        # Fedus et al. 2022 (Switch) / DeepSeekMoE (arXiv 2401.06066) eq. 9: a token runs its top_k
        # routed experts and every shared expert; all experts are stored.
        expert = self.mlp_params(m.expert_ffn_hidden)
        shared = m.shared_experts * self.mlp_params(m.shared_expert_ffn_hidden or m.expert_ffn_hidden)
        common = attn + norms + self.router_params() + shared
        return common + m.experts * expert, common + m.top_k * expert

    def embedding_params(self) -> int:
        """Input embedding, (untied) output projection and a learned position table if any."""
        tokens = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        positions = self.max_seq_len * self.hidden if self.position_embedding == "learned" else 0
        return tokens + positions

    def mtp_params(self) -> tuple[int, int]:
        """(total, active) parameters of the ``mtp_layers`` multi-token-prediction modules.

        DeepSeek-V3 (arXiv 2412.19437) §2.2 eqs. 21-23: each module is one transformer layer (of the
        kind of the last main layer), a projection of [norm(h); norm(emb)] from 2·hidden to hidden
        and the two RMSNorms; the embedding and output head are shared with the main model, and a
        final norm precedes the shared head. Not part of published totals (671B excludes them).
        """
        if not self.mtp_layers:
            return 0, 0
        t, a = self.layer_params(self.layers - 1)
        extra = 2 * self.hidden * self.hidden + 3 * self.norm_params()
        return self.mtp_layers * (t + extra), self.mtp_layers * (a + extra)

    def param_counts(self, *, include_mtp: bool = False) -> tuple[int, int]:
        """(total, active-per-token) parameters, embeddings and final norm included.

        MTP modules are left out, as published totals leave them out, unless ``include_mtp``.
        """
        total = active = self.embedding_params() + self.norm_params()
        for first, count in self.layer_kinds():
            t, a = self.layer_params(first)
            total += count * t
            active += count * a
        if include_mtp:
            t, a = self.mtp_params()
            total += t
            active += a
        return total, active

    @property
    def num_params(self) -> int:
        """Total parameters as published totals count them (MTP modules excluded)."""
        return self.param_counts()[0]

    @property
    def num_active_params(self) -> int:
        """Parameters one token runs through (top_k routed + shared experts), embeddings included."""
        return self.param_counts()[1]

    @property
    def num_mtp_params(self) -> int:
        """Parameters of the MTP modules (0 without them)."""
        return self.mtp_params()[0]

    def to_mapping(self) -> dict[str, Any]:
        """The catalog/scenario mapping this spec reads back from (round-trips)."""
        out: dict[str, Any] = {
            "name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
            "kv_heads": self.kv_heads, "head_dim": self.head_dim, "ffn_hidden": self.ffn_hidden,
            "activation": self.activation, "vocab": self.vocab, "tied_embeddings": self.tied_embeddings,
            "norm": self.norm, "position_embedding": self.position_embedding,
        }
        if self.max_seq_len:
            out["max_seq_len"] = self.max_seq_len
        if self.attention == "mla" and self.mla is not None:
            out["attention"] = {"kind": "mla", **{k: getattr(self.mla, k) for k in MLA_KEYS}}
        else:
            out["attention"] = self.attention
        if self.moe is not None:
            out["moe"] = {k: getattr(self.moe, k) for k in MOE_KEYS}
        if self.bias:
            out["bias"] = True
        if self.mtp_layers:
            out["mtp_layers"] = self.mtp_layers
        if self.window is not None:
            out["attention_window"] = {"size": self.window.size, "kind": self.window.kind,
                                       "full_every": self.window.full_every}
        if self.source:
            out["source"] = self.source
        if self.published_params:
            out["params"] = self.published_params
        if self.published_active_params:
            out["active_params"] = self.published_active_params
        return out


# ----------------------------------------------------------------------------------------------
# reading


# Sizes past any architecture (the largest published: ~200 layers, or DeepNet's 1,000; width 25,600;
# 256k-token vocabularies; 384 experts), so that the per-layer, per-bucket and per-expert lists the cost
# models build stay bounded: a field past its bound is a located error naming it.
MAX_LAYERS = 4096
MAX_WIDTH = 2**20        # hidden, ffn, head and latent dimensions
MAX_HEADS = 2**16        # attention heads, K/V heads, experts, router groups
MAX_VOCAB = 2**24
MAX_TOKENS = 10**8       # max_seq_len, attention window size (= fmsim.scenario.MAX_SEQ_LEN)
MAX_PARAMS = 10**14      # 100T parameters: 50x the largest model trained

_ATTENTION_WHAT = "mha | gqa | mqa, or a mapping {kind: mla, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim, q_lora_rank}"


def _width(s: _Section, key: str, default: Any = _MISSING, *, minimum: int = 1, maximum: int = MAX_WIDTH) -> int:
    """A dimension (or count) of the architecture, bounded by what any architecture has."""
    return s.integer(key, default, minimum=minimum, maximum=maximum)


def _mla(s: _Section) -> MLASpec:
    att = s.section("attention", ("kind", *MLA_KEYS), what=_ATTENTION_WHAT)
    assert att is not None
    kind = att.raw("kind", "mla")
    if kind != "mla":
        raise att.err("kind", f"only mla takes dimensions (got {_what(kind)}; write mha/gqa/mqa as a plain "
                              "string)")
    return MLASpec(q_lora_rank=_width(att, "q_lora_rank", 0, minimum=0),
                   kv_lora_rank=_width(att, "kv_lora_rank"),
                   qk_nope_dim=_width(att, "qk_nope_dim"),
                   qk_rope_dim=_width(att, "qk_rope_dim"),
                   v_head_dim=_width(att, "v_head_dim"))


def _moe(s: _Section, *, layers: int, ffn_hidden: int) -> MoESpec:
    m = s.section("moe", MOE_KEYS, what="a mapping {experts, top_k, expert_ffn_hidden, ...}")
    assert m is not None
    experts = _width(m, "experts", maximum=MAX_HEADS)
    top_k = _width(m, "top_k", maximum=MAX_HEADS)
    if top_k > experts:
        raise m.err("top_k", f"{top_k} exceeds {experts} experts (expected 1..experts)")
    dense_layers = _width(m, "dense_layers", 0, minimum=0, maximum=MAX_LAYERS)
    if dense_layers >= layers:
        raise m.err("dense_layers", f"{dense_layers} leaves no MoE layer among {layers} (expected 0..layers - 1)")
    cf = m.number("capacity_factor", 0.0, minimum=0.0, inclusive=True, maximum=float(experts),
                  rule=f"a number in 0..{experts} (0 = dropless; past the expert count a capacity pads "
                       "nothing more)")
    groups = _width(m, "router_groups", 1, maximum=MAX_HEADS)
    if experts % groups:
        raise m.err("router_groups", f"{groups} groups do not divide {experts} experts")
    group_topk = _width(m, "router_group_topk", 0, minimum=0, maximum=MAX_HEADS)
    if group_topk > groups:
        raise m.err("router_group_topk", f"{group_topk} exceeds {groups} router_groups")
    if group_topk and top_k > group_topk * experts // groups:
        raise m.err("router_group_topk", f"{group_topk} groups of {experts // groups} experts cannot hold "
                    f"top_k {top_k}")
    return MoESpec(experts=experts, top_k=top_k, router_groups=groups, router_group_topk=group_topk,
                   expert_ffn_hidden=_width(m, "expert_ffn_hidden", ffn_hidden),
                   shared_experts=_width(m, "shared_experts", 0, minimum=0, maximum=MAX_HEADS),
                   shared_expert_ffn_hidden=_width(m, "shared_expert_ffn_hidden", 0, minimum=0),
                   dense_layers=dense_layers,
                   dense_ffn_hidden=_width(m, "dense_ffn_hidden", 0, minimum=0),
                   capacity_factor=float(cf),
                   layer_freq=_width(m, "layer_freq", 1, maximum=MAX_LAYERS))


def _window(s: _Section, *, layers: int) -> AttentionWindow:
    w = s.section("attention_window", WINDOW_KEYS, what="a mapping {size, kind: sliding|chunked, full_every}")
    assert w is not None
    full_every = _width(w, "full_every", 0, minimum=0, maximum=MAX_LAYERS)
    if full_every == 1:
        raise w.err("full_every", "1 makes every layer full attention (leave attention_window out)")
    if full_every > layers:
        raise w.err("full_every", f"{full_every} exceeds {layers} layers: no layer would keep full attention "
                                  "(0 says every layer is local)")
    return AttentionWindow(size=_width(w, "size", maximum=MAX_TOKENS),
                           kind=w.choice("kind", WINDOW_KINDS, "sliding"),
                           full_every=full_every)


def _count(s: _Section, key: str) -> float | None:
    """A published parameter count (``"70.6B"``, ``1.5e9``), > 0; None when not given."""
    v = s.parsed(key, parse_count, None, expected="a parameter count such as '70.6B'")
    if v is not None and not 0 < v <= MAX_PARAMS:
        raise s.err(key, f"must be a parameter count in (0, {MAX_PARAMS:.0e}] (got {s.raw(key)!r})")
    return v


def model_from_mapping(data: Any, *, name: str | None = None, file: str | None = None,
                       where: str = "model", require_source: bool = False) -> ModelSpec:
    """Build and validate a :class:`ModelSpec` from catalog/scenario keys.

    Read with the one validating reader of scenarios and catalogs (:class:`fmsim.fields._Section`):
    unknown keys get a "did you mean", and errors are :class:`ConfigError` located at ``file``/``where.key``
    (``model_catalog/x.yaml: models.m.kv_heads: 6 does not divide 64 heads``).
    """
    s = _Section(data, file, where, MODEL_KEYS, what="a mapping of architecture keys (model_catalog/README.md)")
    name = s.text("name", None, nonempty=True) or name or ""
    if not name:
        raise s.err("name", "is required for an inline model")
    layers = _width(s, "layers", maximum=MAX_LAYERS)
    hidden = _width(s, "hidden")
    heads = _width(s, "heads", maximum=MAX_HEADS)

    # attention kind first: it sets the default number of K/V heads
    mla = None
    if isinstance(s.raw("attention", None), Mapping):
        mla = _mla(s)
        att: str | None = "mla"
    else:
        att = s.choice("attention", ATTENTION_KINDS, None)
        if att == "mla":
            raise s.err("attention", "mla needs its dimensions: {kind: mla, kv_lora_rank: ..., qk_nope_dim: ..., "
                                     "qk_rope_dim: ..., v_head_dim: ..., q_lora_rank: ...}")
    kv_heads = _width(s, "kv_heads", 1 if att == "mqa" else heads, maximum=MAX_HEADS)
    if heads % kv_heads:
        raise s.err("kv_heads", f"{kv_heads} does not divide {heads} heads")
    if att is None:
        att = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    elif att == "mha" and kv_heads != heads:
        raise s.err("kv_heads", f"{kv_heads} != {heads} heads, but attention is mha (use gqa or mqa)")
    elif att == "mqa" and kv_heads != 1:
        raise s.err("kv_heads", f"{kv_heads}, but attention is mqa (one K/V head; use gqa)")
    head_dim = _width(s, "head_dim", mla.v_head_dim if mla is not None else max(1, hidden // heads))

    activation = s.choice("activation", ACTIVATIONS, "gelu")
    ffn_hidden = _width(s, "ffn_hidden", 4 * hidden)
    vocab = _width(s, "vocab", maximum=MAX_VOCAB)
    tied = s.boolean("tied_embeddings", False)
    bias = s.boolean("bias", False)
    norm = s.choice("norm", NORMS, "layernorm" if bias else "rmsnorm")
    position = s.choice("position_embedding", POSITION_EMBEDDINGS, "rope")
    max_seq_len = _width(s, "max_seq_len", 0, minimum=0, maximum=MAX_TOKENS)
    if position == "learned" and not max_seq_len:
        raise s.err("max_seq_len", "is required with position_embedding: learned (rows of the position table)")
    mtp_layers = _width(s, "mtp_layers", 0, minimum=0, maximum=MAX_LAYERS)

    moe = _moe(s, layers=layers, ffn_hidden=ffn_hidden) if s.has("moe") else None
    window = _window(s, layers=layers) if s.has("attention_window") else None

    for key in ("notes", "family"):
        s.joined_text(key, "; ")
    source = s.joined_text("source", "; ")
    if require_source and not source.strip():
        raise s.err("source", "is required (every catalog number needs a source)")

    params, active = _count(s, "params"), _count(s, "active_params")
    if params and active and active > params:
        raise s.err("active_params", f"must not exceed params {s.raw('params')!r} (got {s.raw('active_params')!r})")

    spec = ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, ffn_hidden=ffn_hidden, activation=activation, vocab=vocab,
                     tied_embeddings=tied, attention=att, mla=mla, moe=moe, bias=bias, norm=norm,
                     position_embedding=position, max_seq_len=max_seq_len, mtp_layers=mtp_layers,
                     window=window, source=source, published_params=params, published_active_params=active)
    if spec.num_params > MAX_PARAMS:
        raise s.err("", f"{spec.num_params:.3g} parameters is past the {MAX_PARAMS:.0e} any run could train "
                        "(check layers, hidden, ffn_hidden, vocab and the experts)")
    return spec
