"""A Llama / Qwen2 / Qwen3-style decoder-only transformer in Flax NNX.

Mirrors Hugging Face's ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` semantics so that
their weights load one-to-one (see ``DecoderConfig.from_hf`` and the parameter layout below):

- RMSNorm in float32, cast back to the activation dtype, then times the scale (HF ``LlamaRMSNorm``).
- RoPE with the ``rotate_half`` convention: the head dimension is split into two halves, frequency
  ``theta ** (-2i / head_dim)`` shared by element i of each half; cos/sin built in float32, cast to dtype.
- Grouped-query attention: query head h reads KV head ``h // (n_heads // n_kv_heads)`` (HF ``repeat_kv``);
  scale ``head_dim ** -0.5``; softmax in float32. Visibility is causal plus one contiguous span of valid
  keys per row (``kv_start_B <= s < kv_end_B``), never a (Q, S) mask: ``sera_jax.models.attention`` runs it
  as ``DecoderConfig.attention`` says (``"auto"``: Pallas flash on TPU, cuDNN on GPU, blockwise flash
  attention in pure JAX elsewhere; ``"dense"`` is the materialised reference). A query with no visible key
  gets a finite output.
- Qwen2: biases on q/k/v (not o). Qwen3: RMSNorm over head_dim on q and k (before RoPE), no biases.
- SwiGLU MLP ``down(silu(gate(x)) * up(x))`` with a hand-written backward (``swiglu``: faster on XLA:CPU; being
  a ``custom_vjp``, the decoder has reverse-mode derivatives only); pre-norm residual blocks; final RMSNorm;
  optional tied embeddings (logits = h @ embedding.T). No embedding scaling.

Parameter layout (HF torch ``Linear.weight`` is ``(out, in)``; transpose and reshape to load):

    embed.embedding        (vocab, d_model)              ("vocab", "embed")
    blocks[i].attn.q_proj  (d_model, n_heads, head_dim)  ("embed", "q_heads", "head_dim")   [+ bias]
    blocks[i].attn.k_proj  (d_model, n_kv, head_dim)     ("embed", "kv_heads", "head_dim")  [+ bias]
    blocks[i].attn.v_proj  (d_model, n_kv, head_dim)     ("embed", "kv_heads", "head_dim")  [+ bias]
    blocks[i].attn.o_proj  (n_heads, head_dim, d_model)  ("q_heads", "head_dim", "embed")
    blocks[i].mlp.gate/up  (d_model, ffn)                ("embed", "mlp"); down (ffn, d_model) ("mlp", "embed")
    *_norm.scale           (d_model,) or (head_dim,)     ("norm",)
    lm_head                (d_model, vocab)              ("embed", "vocab")   (only if not tied)

Logical axis names are stored as each ``nnx.Param``'s ``out_sharding`` metadata (read them with
``nnx.get_partition_spec``); the sharding module maps them to mesh axes. Params are placed eagerly only
when flax's eager sharding is on *and* a mesh is set, so the model also builds with no mesh (tests, CPU).

The KV cache is a ``KVCache`` pytree of per-layer ``(B, n_kv, S, head_dim)`` arrays that callers carry
(heads before slots: the layout the attention matmuls read, so decoding steps never relayout the cache).

Shape letters: B rows, L tokens of a full sequence (``__call__``, training and log-probs), Q the new
(query) tokens of one call through the layers (Q = L for a full sequence, the prompt length T at prefill,
1 per decoding step), S KV-cache slots (S = L without a cache), V vocabulary, D model width, and inside
``apply_rope`` A heads of D = head_dim each.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sera_jax.core.validation import is_traced
from sera_jax.models import attention as attention_lib
from sera_jax.models import decode_attention as decode_attention_lib

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]

# What a block keeps for the backward pass of a full sequence: everything ("none"); only its input ("block":
# the block is recomputed, activations cost one (B, L, D) array per layer); its input and the outputs of its
# matmuls ("block_save_dots": less recomputation, more memory).
REMAT_POLICIES = {"none": None, "block": jax.checkpoint_policies.nothing_saveable,
                  "block_save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of the decoder (names follow HF where they map 1:1)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = True
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    dtype: str = "float32"  # activations / compute
    param_dtype: str = "float32"
    max_seq_len: int = 2048
    init_std: float = 0.02  # HF initializer_range
    attention: str = "auto"  # one of attention.IMPLEMENTATIONS (see sera_jax/models/attention.py)
    attention_block_q: int = attention_lib.DEFAULT_BLOCK_Q  # blockwise attention's query block
    attention_block_k: int = attention_lib.DEFAULT_BLOCK_K  # ... and key block
    # Full sequences only (training, log-probs; decoding with a cache is unaffected):
    remat: str = "none"  # REMAT_POLICIES: recompute each block's activations in the backward pass
    scan_layers: bool = False  # the blocks as one lax.scan over stacked weights: compiles once, not n_layers times

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                     "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DecoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"DecoderConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"DecoderConfig.head_dim={self.head_dim} must be even (RoPE halves)")
        for name in ("dtype", "param_dtype"):
            try:
                jnp.dtype(getattr(self, name))
            except TypeError as e:
                raise ValueError(f"DecoderConfig.{name}={getattr(self, name)!r} is not a dtype") from e
        attention_lib.check_implementation(self.attention, "DecoderConfig.attention")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"DecoderConfig.remat={self.remat!r}: must be one of {list(REMAT_POLICIES)}")
        for name in ("attention_block_q", "attention_block_k"):
            attention_lib.check_block_size(getattr(self, name), f"DecoderConfig.{name}")

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides: Any) -> DecoderConfig:
        """Config from a Hugging Face ``config.json`` dict (llama, qwen2, qwen3); ``overrides`` win.

        Raises ValueError on features this decoder does not implement (rope scaling, MLP/o biases,
        sliding windows, non-SiLU activations).
        """
        model_type = hf.get("model_type")
        if model_type not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"hf['model_type']={model_type!r} is not one of llama, qwen2, qwen3")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hf['hidden_act']={hf.get('hidden_act')!r} is not supported (only silu)")
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling:
            raise ValueError(f"hf['rope_scaling']={scaling!r} is not supported (only default RoPE)")
        if hf.get("mlp_bias", False):
            raise ValueError("hf['mlp_bias']=True is not supported")
        if model_type != "qwen2" and hf.get("attention_bias", False):
            raise ValueError("hf['attention_bias']=True is not supported for llama/qwen3 (it biases o_proj)")
        if hf.get("use_sliding_window", False):
            raise ValueError("hf['use_sliding_window']=True is not supported")
        n_heads = hf["num_attention_heads"]
        kwargs = dict(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
            ffn_dim=hf["intermediate_size"],
            rope_theta=float(hf.get("rope_theta", rope.get("rope_theta", 10_000.0))),
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            max_seq_len=int(hf.get("max_position_embeddings", 2048)),
            init_std=float(hf.get("initializer_range", 0.02)),
        )
        kwargs.update(overrides)
        return cls(**kwargs)


def maze_full() -> DecoderConfig:
    """The maze policy of docs/method.md §8B: Qwen2-style, 4 layers, d=256, FFN 1024, 4 heads / 2 KV heads,
    vocab 32, tied embeddings, RoPE theta 1e6 (MaxRL's maze model); 3,944,704 parameters."""
    return DecoderConfig(
        vocab_size=32, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=1024,
        rope_theta=1_000_000.0, rms_eps=1e-6, tie_embeddings=True, qkv_bias=True, max_seq_len=512,
    )


def tiny(vocab_size: int = 32, **overrides: Any) -> DecoderConfig:
    """A ~20k-parameter config for tests (GQA with 2 query heads per KV head); overrides win."""
    kwargs = dict(
        vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
        rope_theta=10_000.0, rms_eps=1e-6, tie_embeddings=True, qkv_bias=True, max_seq_len=128,
    )
    kwargs.update(overrides)
    return DecoderConfig(**kwargs)


# --- parameters with logical axis names ------------------------------------------------------------

def _param(rngs: nnx.Rngs, init: Initializer, shape: tuple[int, ...], names: tuple[str, ...],
           param_dtype: Any) -> nnx.Param:
    """An ``nnx.Param`` annotated with logical axis ``names`` (placed eagerly only under a mesh)."""
    eager = nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty
    return nnx.Param(init(rngs.params(), shape, param_dtype), out_sharding=names, eager_sharding=eager)


def _zeros(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    del key
    return jnp.zeros(shape, dtype)


def _ones(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    del key
    return jnp.ones(shape, dtype)


# --- building blocks -------------------------------------------------------------------------------

class RMSNorm(nnx.Module):
    """``scale * (x / sqrt(mean(x**2) + eps))`` with the normalisation in float32 (HF LlamaRMSNorm)."""

    def __init__(self, dim: int, eps: float, param_dtype: Any, *, rngs: nnx.Rngs):
        self.scale = _param(rngs, _ones, (dim,), ("norm",), param_dtype)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (self.scale[...] * normed.astype(x.dtype)).astype(x.dtype)


def rope_cos_sin(positions_BxQ: jax.Array, head_dim: int, theta: float, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """cos, sin ``(B, Q, head_dim)`` of HF's default RoPE: angle ``pos * theta**(-2i/head_dim)``, the
    ``head_dim // 2`` frequencies repeated for both halves; computed in float32 and cast to ``dtype``."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions_BxQ.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x_BxQxAxD: jax.Array, cos_BxQxD: jax.Array, sin_BxQxD: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half([a, b]) = [-b, a]`` over the last axis.

    ``x`` has A heads of width D = head_dim; ``cos``/``sin`` are shared by the heads.
    """
    half = x_BxQxAxD.shape[-1] // 2
    rotated = jnp.concatenate([-x_BxQxAxD[..., half:], x_BxQxAxD[..., :half]], axis=-1)
    return x_BxQxAxD * cos_BxQxD[:, :, None, :] + rotated * sin_BxQxD[:, :, None, :]


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE, optional q/k/v biases (Qwen2) and q/k norms (Qwen3)."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        normal = jax.nn.initializers.normal(cfg.init_std)
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = _param(rngs, normal, (d, h, hd), ("embed", "q_heads", "head_dim"), pd)
        self.k_proj = _param(rngs, normal, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd)
        self.v_proj = _param(rngs, normal, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd)
        self.o_proj = _param(rngs, normal, (h, hd, d), ("q_heads", "head_dim", "embed"), pd)
        if cfg.qkv_bias:
            self.q_bias = _param(rngs, _zeros, (h, hd), ("q_heads", "head_dim"), pd)
            self.k_bias = _param(rngs, _zeros, (kv, hd), ("kv_heads", "head_dim"), pd)
            self.v_bias = _param(rngs, _zeros, (kv, hd), ("kv_heads", "head_dim"), pd)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_eps, pd, rngs=rngs)
            self.k_norm = RMSNorm(hd, cfg.rms_eps, pd, rngs=rngs)
        self.cfg = cfg

    def project_qkv(self, x_BxQxD: jax.Array, cos_sin: tuple[jax.Array, jax.Array]
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q ``(B, Q, A, D)``, k and v ``(B, Q, M, D)`` in the compute dtype: projections, Qwen2 biases, Qwen3
        q/k norms and RoPE (what ``__call__`` attends with; the sampler's decode path reuses it)."""
        cfg = self.cfg
        dtype = jnp.dtype(cfg.dtype)
        x = x_BxQxD.astype(dtype)
        q = jnp.einsum("btd,dhk->bthk", x, self.q_proj[...].astype(dtype))
        k = jnp.einsum("btd,dhk->bthk", x, self.k_proj[...].astype(dtype))
        v = jnp.einsum("btd,dhk->bthk", x, self.v_proj[...].astype(dtype))
        if cfg.qkv_bias:
            q = q + self.q_bias[...].astype(dtype)
            k = k + self.k_bias[...].astype(dtype)
            v = v + self.v_bias[...].astype(dtype)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, *cos_sin), apply_rope(k, *cos_sin), v

    def __call__(
        self,
        x_BxQxD: jax.Array,
        cos_sin: tuple[jax.Array, jax.Array],
        kv_span: tuple[jax.Array, jax.Array],
        kv_cache: tuple[jax.Array, jax.Array] | None = None,
        write_index: jax.Array | int = 0,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Attention output ``(B, Q, D)`` and the updated ``(k, v)`` cache (None without a cache).

        Without a cache the keys are this call's Q tokens (S = Q). With one, the new keys/values are
        written at slots ``[write_index, write_index + Q)`` and the queries attend over the S slots.
        Query i sees slot s iff ``kv_start_B <= s < kv_end_B`` (``kv_span``) and ``s <= write_index + i``.
        """
        cfg = self.cfg
        dtype = jnp.dtype(cfg.dtype)
        q, k, v = self.project_qkv(x_BxQxD, cos_sin)
        # Keys/values as (B, n_kv, S, head_dim): the layout the cache is stored in and the matmuls read.
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        new_cache = None
        if kv_cache is not None:
            cache_k, cache_v = kv_cache
            start = (0, 0, write_index, 0)
            cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), start)
            cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), start)
            new_cache = (cache_k, cache_v)
            k, v = cache_k.astype(dtype), cache_v.astype(dtype)
        # Query head h = kv * groups + g reads KV head kv, as HF's repeat_kv does.
        out = attention_lib.attention(q, k, v, *kv_span, write_index, implementation=cfg.attention,
                                      block_q=cfg.attention_block_q, block_k=cfg.attention_block_k)
        return jnp.einsum("bthk,hkd->btd", out, self.o_proj[...].astype(dtype)), new_cache


def _rows_transposed(x_NxF: jax.Array) -> jax.Array:
    """``x`` as ``(F, rows)``: the leading axes flattened and moved last. On CPU the copy is made explicitly
    (behind an optimization barrier): XLA:CPU otherwise folds the transpose into the weight-gradient dot,
    which then contracts the leading (token) axis of both operands on a slow, single-threaded path."""
    x_t = x_NxF.reshape(-1, x_NxF.shape[-1]).T
    return jax.lax.optimization_barrier(x_t) if attention_lib.cpu_workarounds() else x_t


@jax.custom_vjp
def swiglu(x_NxD: jax.Array, w_gate_DxF: jax.Array, w_up_DxF: jax.Array, w_down_FxD: jax.Array) -> jax.Array:
    """``(silu(x @ w_gate) * (x @ w_up)) @ w_down`` over any leading axes N, with a hand-written backward.

    Why not autodiff: XLA:CPU fuses the derivative of ``silu(gate) * up`` into a transposed ``(F, N)``
    copy for the weight gradients, a slow strided write as large as the activations (it was ~30% of the maze
    policy's update). The backward below computes the same derivative on the ``(N, F)`` layout and transposes
    only the matmul operands (``_rows_transposed``): MLP forward + backward 1.7x-2.0x faster than
    ``jax.grad`` of the plain expression on 2 shared CPU cores, x (32, 490, 256) float32, FFN 1,024 (the maze
    policy's update batch; ``benchmarks/bench_swiglu.py``, two runs: 2.02x, 1.70x under load; 1.11x at 256
    tokens); the same numbers as autodiff to float rounding (tested)."""
    return (jax.nn.silu(x_NxD @ w_gate_DxF) * (x_NxD @ w_up_DxF)) @ w_down_FxD


def _swiglu_fwd(x, w_gate, w_up, w_down):
    gate, up = x @ w_gate, x @ w_up
    return (jax.nn.silu(gate) * up) @ w_down, (x, gate, up, w_gate, w_up, w_down)


def _swiglu_bwd(residuals, d_out):
    x, gate, up, w_gate, w_up, w_down = residuals
    sig = jax.nn.sigmoid(gate)
    hidden = gate * sig * up  # silu(gate) * up, recomputed rather than kept
    d_hidden = d_out @ w_down.T
    d_up = d_hidden * gate * sig
    d_gate = d_hidden * up * sig * (1 + gate * (1 - sig))  # silu'(g) = s (1 + g (1 - s))
    x_t, hidden_t = _rows_transposed(x), _rows_transposed(hidden)

    def rows(a):
        return a.reshape(-1, a.shape[-1])

    d_x = d_gate @ w_gate.T + d_up @ w_up.T
    return d_x, x_t @ rows(d_gate), x_t @ rows(d_up), hidden_t @ rows(d_out)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` (``swiglu``)."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        normal = jax.nn.initializers.normal(cfg.init_std)
        self.gate_proj = _param(rngs, normal, (cfg.d_model, cfg.ffn_dim), ("embed", "mlp"), pd)
        self.up_proj = _param(rngs, normal, (cfg.d_model, cfg.ffn_dim), ("embed", "mlp"), pd)
        self.down_proj = _param(rngs, normal, (cfg.ffn_dim, cfg.d_model), ("mlp", "embed"), pd)
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x_BxQxD: jax.Array) -> jax.Array:
        dtype = self.dtype
        return swiglu(x_BxQxD.astype(dtype), self.gate_proj[...].astype(dtype), self.up_proj[...].astype(dtype),
                      self.down_proj[...].astype(dtype))


class Block(nnx.Module):
    """Pre-norm residual block: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps, pd, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.rms_eps, pd, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, cos_sin, kv_span, kv_cache=None, write_index=0):
        attn_out, kv_cache = self.attn(self.attn_norm(x), cos_sin, kv_span, kv_cache, write_index)
        h = x + attn_out
        return h + self.mlp(self.mlp_norm(h)), kv_cache


class KVCache(NamedTuple):
    """Per-layer key/value caches, each ``(B, n_kv_heads, S, head_dim)``; a pytree the sampler carries."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def init_cache(cfg: DecoderConfig, batch: int, length: int, dtype: Any = None) -> KVCache:
    """An all-zero cache for ``batch`` rows of ``length`` slots (dtype defaults to ``cfg.dtype``)."""
    shape = (batch, cfg.n_kv_heads, length, cfg.head_dim)
    dtype = jnp.dtype(dtype or cfg.dtype)
    return KVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)),
    )


class Decoder(nnx.Module):
    """The decoder-only LM. ``__call__`` for training (full sequences), ``decode`` for prefill/steps with a
    KV cache. Both take explicit positions (RoPE) and one contiguous span of valid keys per row (a validity
    mask for full sequences, span starts for the cache), so left and right padding both work."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        normal = jax.nn.initializers.normal(cfg.init_std)
        self.cfg = cfg
        self.embed = _param(rngs, normal, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), pd)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.final_norm = RMSNorm(cfg.d_model, cfg.rms_eps, pd, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, normal, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), pd)

    def _hidden(self, tokens_BxQ, positions_BxQ, kv_span, cache, write_index, differentiated=False):
        """Final-normed hidden states ``(B, Q, D)`` and the updated cache (None without one). Full sequences
        and ``differentiated`` calls with a cache run the blocks as ``cfg.remat`` / ``cfg.scan_layers`` say;
        sampling keeps the plain loop (a scan would restack the whole cache at every decoding step)."""
        cfg = self.cfg
        dtype = jnp.dtype(cfg.dtype)
        x = jnp.take(self.embed[...], tokens_BxQ, axis=0).astype(dtype)
        cos_sin = rope_cos_sin(positions_BxQ, cfg.head_dim, cfg.rope_theta, dtype)
        if (cache is None or differentiated) and (cfg.remat != "none" or cfg.scan_layers):
            x, cache = self._blocks_functional(x, cos_sin, kv_span, cache, write_index)
            return self.final_norm(x), cache
        new_k, new_v = [], []
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else (cache.k[i], cache.v[i])
            x, layer_cache = block(x, cos_sin, kv_span, layer_cache, write_index)
            if cache is not None:
                new_k.append(layer_cache[0])
                new_v.append(layer_cache[1])
        return self.final_norm(x), (None if cache is None else KVCache(k=tuple(new_k), v=tuple(new_v)))

    def _blocks_functional(self, x, cos_sin, kv_span, cache=None, write_index=0):
        """The blocks as pure functions of their weights (and layer caches), rematerialised by ``cfg.remat``
        and, with ``cfg.scan_layers``, scanned over the weights (and caches) stacked on a leading layer axis
        (one copy of the block weights per call; the body compiles once). Returns ``(x, updated cache)``."""
        cfg = self.cfg
        graphdef = nnx.graphdef(self.blocks[0])
        states = [nnx.state(block) for block in self.blocks]

        def apply(state, h, layer_cache):
            return nnx.merge(graphdef, state)(h, cos_sin, kv_span, layer_cache, write_index)

        if cfg.remat != "none":
            apply = jax.checkpoint(apply, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
        layer_caches = [None] * len(states) if cache is None else list(zip(cache.k, cache.v))
        if not cfg.scan_layers:
            new_caches = []
            for state, layer_cache in zip(states, layer_caches):
                x, layer_cache = apply(state, x, layer_cache)
                new_caches.append(layer_cache)
        else:
            stack = functools.partial(jax.tree.map, lambda *layers: jnp.stack(layers))
            xs = (stack(*states), None if cache is None else stack(*layer_caches))
            x, stacked = jax.lax.scan(lambda h, layer: apply(layer[0], h, layer[1]), x, xs)
            new_caches = [None] * len(states) if cache is None else \
                [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(len(states))]
        if cache is None:
            return x, None
        return x, KVCache(k=tuple(kv[0] for kv in new_caches), v=tuple(kv[1] for kv in new_caches))

    def head_matrix(self) -> jax.Array:
        """The output projection ``(d_model, vocab)`` in the compute dtype (the embedding's transpose if tied)."""
        head = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
        return head.astype(jnp.dtype(self.cfg.dtype))

    def hidden_states(
        self,
        tokens_BxL: jax.Array,
        positions_BxL: jax.Array | None = None,
        valid_BxL: jax.Array | None = None,
    ) -> jax.Array:
        """Final-normed hidden states ``(B, L, D)``; ``__call__`` without the output projection (for
        memory-lean log-probs with a large vocabulary). Same arguments as ``__call__``."""
        b, length = tokens_BxL.shape
        if positions_BxL is None:
            positions_BxL = jnp.broadcast_to(jnp.arange(length), (b, length))
        if valid_BxL is None:
            kv_span = (jnp.zeros((b,), jnp.int32), jnp.full((b,), length, jnp.int32))
            return self._hidden(tokens_BxL, positions_BxL, kv_span, None, 0)[0]
        if not is_traced(valid_BxL):
            check_contiguous(np.asarray(valid_BxL))
        kv_start_B, kv_end_B, contiguous_B = attention_lib.kv_spans_from_valid(valid_BxL)
        h = self._hidden(tokens_BxL, positions_BxL, (kv_start_B, kv_end_B), None, 0)[0]
        # Under jit a row with holes cannot raise: it comes out NaN, which the training loop's guard reports.
        return jnp.where(contiguous_B[:, None, None], h, jnp.nan)

    def __call__(
        self,
        tokens_BxL: jax.Array,
        positions_BxL: jax.Array | None = None,
        valid_BxL: jax.Array | None = None,
    ) -> jax.Array:
        """Logits ``(B, L, V)`` float32 for full sequences (training, log-probs).

        Token i attends to tokens j <= i (by index) with ``valid_BxL[:, j]``. The valid tokens of a row must
        be one contiguous span (left padding, right padding or both, as ``[left-padded prompt |
        right-padded response]``): attention sees ``[first valid, last valid]`` (never a (L, L) mask). A
        row with holes raises ValueError when ``valid_BxL`` is concrete and gives NaN outputs under jit.
        ``positions_BxL`` defaults to ``0..L-1`` (right padding); for left padding pass
        ``positions_from_valid(valid_BxL)``. Outputs at invalid (padding) positions are finite but
        meaningless.
        """
        h = self.hidden_states(tokens_BxL, positions_BxL, valid_BxL)
        return (h @ self.head_matrix()).astype(jnp.float32)

    def decode(
        self,
        tokens_BxQ: jax.Array,
        positions_BxQ: jax.Array,
        cache: KVCache,
        write_index: jax.Array | int,
        kv_start_B: jax.Array,
        kv_end_B: jax.Array | None = None,
        last_only: bool = False,
    ) -> tuple[jax.Array, KVCache]:
        """Run Q new tokens against a cache of S slots: prefill (Q = T, the prompt length, write_index = 0)
        or one decoding step (Q = 1). The tokens' keys/values go to slots ``[write_index, write_index + Q)``;
        token i attends to the slots s with ``kv_start_B <= s < kv_end_B`` and s <= write_index + i: a row's
        valid slots are one span (a left-padded prompt starts at ``kv_start_B = T - length``; the response
        slots follow it), ``kv_end_B`` defaults to S (causality bounds it). Returns logits ``(B, Q, V)``
        float32 (``(B, 1, V)`` for the last token only with ``last_only``, which is all a prefill needs) and
        the updated cache."""
        b = tokens_BxQ.shape[0]
        s = cache.k[0].shape[2]
        if jnp.ndim(kv_start_B) != 1 or jnp.shape(kv_start_B)[0] != b or \
                not jnp.issubdtype(jnp.result_type(kv_start_B), jnp.integer):
            raise ValueError(f"kv_start_B must be ({b},) ints (each row's first valid slot), got "
                             f"{jnp.result_type(kv_start_B)} {jnp.shape(kv_start_B)}; for a validity mask use "
                             "attention.kv_spans_from_valid")
        kv_end_B = jnp.full((b,), s, jnp.int32) if kv_end_B is None else kv_end_B
        h, cache = self._hidden(tokens_BxQ, positions_BxQ, (kv_start_B, kv_end_B), cache, write_index)
        if last_only:
            h = h[:, -1:]
        return (h @ self.head_matrix()).astype(jnp.float32), cache

    def extend_hidden(
        self,
        tokens_BxQ: jax.Array,
        positions_BxQ: jax.Array,
        cache: KVCache,
        write_index: int,
        kv_start_B: jax.Array,
    ) -> tuple[jax.Array, KVCache]:
        """``decode`` for gradients: final-normed hidden states ``(B, Q, D)`` of Q tokens written at slots
        ``[write_index, write_index + Q)`` of ``cache`` and attending (causally, from ``kv_start_B``) to the
        slots before them, with the blocks run as ``cfg.remat`` / ``cfg.scan_layers`` say; also the updated
        cache. What a prompt-shared update runs: each prompt once into an empty cache, then every rollout's
        response against its prompt's cached keys and values (``sera_jax.rl.step``)."""
        b, s = tokens_BxQ.shape[0], cache.k[0].shape[2]
        kv_end_B = jnp.full((b,), s, jnp.int32)
        return self._hidden(tokens_BxQ, positions_BxQ, (kv_start_B, kv_end_B), cache, write_index,
                            differentiated=True)

    def decode_shared(
        self,
        tokens_S: jax.Array,
        positions_S: jax.Array,
        caches: tuple[decode_attention_lib.SharedKV, ...],
        prompt_start_P: jax.Array,
        prompt_ids_S: jax.Array,
        n_valid_S: jax.Array,
        write_col: jax.Array,
        schedule: decode_attention_lib.Schedule,
        implementation: str = "auto",
    ) -> tuple[jax.Array, tuple[decode_attention_lib.SharedKV, ...]]:
        """One decoding step of S slots over prompts cached once and per-slot response caches (the sampler's
        layout, ``sera_jax.models.decode_attention``; ``caches`` holds one ``SharedKV`` per layer). Slot s feeds
        ``tokens_S[s]`` at RoPE position ``positions_S[s]``; every slot writes its key/value at response column
        ``write_col`` (the response caches are rings indexed by step) and attends to its prompt's valid columns
        and its newest ``n_valid_S[s]`` response columns (this token's included). ``schedule``:
        ``decode_attention.prompt_schedule`` of ``prompt_ids_S``. Returns logits ``(S, V)`` float32 and the
        updated caches."""
        cfg = self.cfg
        dtype = jnp.dtype(cfg.dtype)
        x = jnp.take(self.embed[...], tokens_S[:, None], axis=0).astype(dtype)  # (S, 1, D)
        cos_sin = rope_cos_sin(positions_S[:, None], cfg.head_dim, cfg.rope_theta, dtype)
        new_caches = []
        for block, kv in zip(self.blocks, caches):
            attn = block.attn
            q, k, v = attn.project_qkv(block.attn_norm(x), cos_sin)
            rk, rv = decode_attention_lib.write_response(kv.response_k, kv.response_v, k[:, 0], v[:, 0], write_col)
            kv = kv._replace(response_k=rk, response_v=rv)
            out = decode_attention_lib.shared_prompt_attention(q[:, 0], kv, prompt_start_P, prompt_ids_S, n_valid_S,
                                                               write_col, schedule, implementation)
            h = x + jnp.einsum("bthk,hkd->btd", out[:, None], attn.o_proj[...].astype(dtype))
            x = h + block.mlp(block.mlp_norm(h))
            new_caches.append(kv)
        h = self.final_norm(x)[:, 0]
        return (h @ self.head_matrix()).astype(jnp.float32), tuple(new_caches)


# --- helpers ---------------------------------------------------------------------------------------

def check_contiguous(valid_BxL: np.ndarray) -> None:
    """ValueError naming the rows of a (concrete) validity mask whose valid tokens are not one contiguous
    span (what ``Decoder.__call__`` needs)."""
    valid_BxL = np.asarray(valid_BxL, bool)
    # One span: at most one False -> True step, counting a virtual False before column 0.
    rises_B = np.sum(np.diff(valid_BxL.astype(np.int8), axis=1, prepend=0) == 1, axis=1)
    rows = np.flatnonzero(rises_B > 1).tolist()
    if rows:
        raise ValueError(f"valid_BxL must mark one contiguous span of tokens per row (e.g. [left-padded "
                         f"prompt | right-padded response]); rows {rows} have holes")


def positions_from_valid(valid_BxL: jax.Array) -> jax.Array:
    """RoPE positions 0, 1, ... counted over valid tokens (left or right padding); 0 on leading pads."""
    return jnp.maximum(jnp.cumsum(valid_BxL.astype(jnp.int32), axis=1) - 1, 0)


def gather_logprobs(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
    """``log softmax(logits)[target]`` per position, float32: ``logit[target] - logsumexp(logits)``."""
    logits = logits_BxLxV.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets_BxL[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def token_logprobs(
    model: Decoder,
    tokens_BxL: jax.Array,
    positions_BxL: jax.Array | None = None,
    valid_BxL: jax.Array | None = None,
    chunk_size: int | None = None,
) -> jax.Array:
    """Per-token log-probs ``(B, L)`` float32 of the given tokens under the model (temperature 1):
    entry t is ``log pi(tokens[t] | tokens[<t])``. It is 0 where it is not defined: t = 0, and any t whose
    token or predecessor is invalid (so a left-padded row's first real token is not scored).

    With ``chunk_size`` the output projection runs ``chunk_size`` positions at a time under
    ``jax.checkpoint``, so neither the forward nor the backward pass holds a full ``(B, L, V)`` array
    (what a 150k-token vocabulary needs); the result is the same.
    """
    b, length = tokens_BxL.shape
    if valid_BxL is None:
        valid_BxL = jnp.ones((b, length), bool)
    valid_BxL = valid_BxL.astype(bool)
    h_BxLxD = model.hidden_states(tokens_BxL, positions_BxL, valid_BxL)[:, :-1]
    targets_BxL = tokens_BxL[:, 1:]
    head_DxV = model.head_matrix()

    def chunk_logprobs(h, targets):
        return gather_logprobs((h @ head_DxV).astype(jnp.float32), targets)

    if chunk_size is None or chunk_size >= length - 1:
        logp = chunk_logprobs(h_BxLxD, targets_BxL)
    else:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got chunk_size={chunk_size}")
        n_chunks = -(-(length - 1) // chunk_size)
        pad = n_chunks * chunk_size - (length - 1)
        h = jnp.pad(h_BxLxD, ((0, 0), (0, pad), (0, 0))).reshape(b, n_chunks, chunk_size, -1)
        tg = jnp.pad(targets_BxL, ((0, 0), (0, pad))).reshape(b, n_chunks, chunk_size)
        per_chunk = jax.checkpoint(lambda args: chunk_logprobs(*args))
        logp = jax.lax.map(per_chunk, (h.swapaxes(0, 1), tg.swapaxes(0, 1)))  # (n_chunks, B, chunk)
        logp = logp.swapaxes(0, 1).reshape(b, -1)[:, : length - 1]
    scored = valid_BxL[:, 1:] & valid_BxL[:, :-1]
    return jnp.pad(jnp.where(scored, logp, 0.0), ((0, 0), (1, 0)))


def count_params(model_or_state: Any) -> int:
    """Total number of parameter entries of a model (or an ``nnx.State``)."""
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state, nnx.Param)
    return int(sum(x.size for x in jax.tree.leaves(state)))


def random_decoder(cfg: DecoderConfig, seed: int, scale: float = 0.3) -> Decoder:
    """A decoder with ``scale * N(0, 1)`` parameters (``1 + ...`` for the norm scales), filled from NumPy into
    an abstract model: no per-shape initializer to compile, and log-probs far from uniform (for parity tests
    and benchmarks, where a freshly initialised model is too close to uniform to check anything)."""
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)

    def fill(path, x):
        norm = any(getattr(k, "key", None) == "scale" for k in path)
        return jnp.asarray(scale * rng.standard_normal(x.shape) + norm, x.dtype)

    nnx.update(model, jax.tree_util.tree_map_with_path(fill, nnx.state(model, nnx.Param)))
    return model
