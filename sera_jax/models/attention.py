"""Causal grouped-query attention over one contiguous span of valid keys per row, without a (Q, S) mask.

Every mask the decoder needs is a span plus causality: full sequences are ``[left-padded prompt |
right-padded response]`` and the sampler's cache rows are a left-padded prompt followed by response slots. So
visibility is given by integers: key slot s is visible to query i of row b iff

    kv_start_B[b] <= s < kv_end_B[b]   and   s <= query_offset + i

(``query_offset`` is the slot of the first query: the cache write index when decoding, 0 for a full
sequence). ``attention`` computes, for query head h = m * groups + g reading KV head m (Hugging Face's
``repeat_kv``), ``softmax(q_h . k_m * head_dim**-0.5 over the visible slots) @ v_m`` with the softmax in
float32, by one of these implementations:

- ``"dense"``: the reference. Materialises the ``(B, Q, S)`` mask from the spans and float32 scores
  ``(B, M, groups, Q, S)`` (kept for the backward pass), exactly the decoder's numerics before this module:
  masked scores take float32's minimum, so a row with no visible key averages all S values uniformly.
- ``"blockwise"``: flash attention in pure JAX. An online softmax over key blocks inside a loop over query
  blocks, the mask of each (query block, key block) pair computed from the spans inside the loop, key blocks
  wholly in a query block's future skipped. A ``jax.custom_vjp`` runs the flash backward (FlashAttention-2,
  Dao 2023): it keeps only the inputs, the output and the float32 log-sum-exp ``(B, A, Q)`` and recomputes
  each block's probabilities, so neither pass stores anything of size Q x S: memory is
  O(B*A*(Q+S)*D + B*A*block_q*block_k). An axis longer than its block is split into the fewest equal
  blocks (a multiple of 8, padded inside: L = 76 with blocks of 64 is 2 blocks of 40), one that fits is one
  block; a call whose queries fit in one block (decoding, Q = 1) gets key blocks of up to
  ``block_q * block_k / Q`` slots (the same score-block area), so a decoding step over a few thousand
  slots is one block. The defaults (64) were the fastest on CPU from L ~ 76 to 1,024 (causal skipping
  pays for the loop); on accelerators larger blocks (``DecoderConfig.attention_block_*``) cost fewer
  loop steps. Being a ``custom_vjp``, it has reverse-mode derivatives only (as the decoder's MLP).
- ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (GPU; float16/bfloat16 only, head_dim
  a multiple of 8 and at most 128). cuDNN's padding mask takes only per-row lengths (right padding), so each
  row is first rotated left by ``kv_start_B`` (a gather of q, k and v along the sequence; RoPE was applied
  before, so positions are unaffected): its span then starts at slot 0, causality is preserved, and
  ``key_value_seq_lengths = kv_end_B - kv_start_B`` masks the rest; the output is rotated back. This needs
  a full sequence (Q == S, ``query_offset`` the Python int 0); other calls (decoding, prefill into a larger
  cache) fall back to ``"blockwise"``.
- ``"pallas_tpu"``: the Pallas TPU flash attention that JAX ships
  (``jax.experimental.pallas.ops.tpu.flash_attention``, causal, segment ids: queries 1, keys 1 inside the
  span and 0 outside, so padding on both sides is exact). KV heads are repeated to the query heads (the
  kernel has no GQA) and the sequence is padded to a multiple of 128 (blocks: the largest of 512, 256, 128
  that divides it); head_dim at most 128 or a multiple of 128. Full sequences only; other calls fall back
  to ``"blockwise"``. On a mesh of several devices the kernel runs under ``jax.shard_map``, each device on its
  rows and heads (the compiler cannot partition a Mosaic kernel; see ``_kernel_layout``). Off TPU it runs only
  under ``pltpu.force_tpu_interpret_mode()`` (tests).
- ``"auto"``: TPU -> ``"pallas_tpu"`` for full sequences; GPU -> ``"cudnn"`` for full sequences in
  float16/bfloat16 with a head_dim it supports; everything else (CPU, float32 on GPU, decoding steps,
  prefill into a larger cache) -> ``"blockwise"``. ``resolve_implementation`` says what it picks, for the
  platform ``target_platform()`` names: the default backend, or the one ``lowering_for(platform)`` sets
  while programs are traced for another platform (``python -m experiments.plan --platform=tpu``).

The float32-accumulating block matmuls (``f32_einsum``) take their operands in the compute dtype on
accelerators; on CPU low-precision operands are upcast to float32 first, which is exact (see ``f32_einsum``)
and avoids XLA:CPU's missing ``BF16 x BF16 = F32`` dot kernel.

Rows with no visible key (a left-padded prompt's pad positions, or a row with an empty span) get a finite
output: the uniform average of all S values with ``"dense"`` (as before), 0 with every other
implementation; nothing downstream reads them (their keys are invisible to every valid query, and losses
mask them), and their cotangents are 0 in the decoder, so gradients agree too.

Shape letters: B rows, Q query tokens of the call, S key slots, A query heads, M key/value heads
(A = M * groups), D head_dim.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("auto", "dense", "blockwise", "cudnn", "pallas_tpu")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's names
# Measured on 2 CPU cores (benchmarks/bench_attention.py): blocks of 64 beat one whole-sequence block from
# L ~ 76 up (causal block skipping, little padding with balanced blocks), e.g. 0.5x dense at L = 436.
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_PALLAS_MIN_BLOCK = 128


_LOWERING_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("lowering_platform",
                                                                                default=None)


@contextlib.contextmanager
def lowering_for(platform: str) -> Iterator[None]:
    """Inside it, ``target_platform()`` is ``platform``: code traced there picks the kernels (``"auto"``) and
    the dot forms that ``platform`` would, so that ``jax.export(..., platforms=[platform])`` lowers what runs
    there. A context rather than an argument because the choice is made deep inside the decoder, in every
    jitted program of a run, none of which should carry a platform argument. ``jax.jit`` caches traces by
    argument types, not by this setting: enter it before the functions are first traced (the planner does,
    for its whole process)."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: choose one of {', '.join(PLATFORMS)}")
    token = _LOWERING_PLATFORM.set(platform)
    try:
        yield
    finally:
        _LOWERING_PLATFORM.reset(token)


_COMPILE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("compile_only", default=False)


@contextlib.contextmanager
def compile_only() -> Iterator[None]:
    """Inside it, programs traced on CPU are compiled for their memory plan and never run, as the planner does for
    accelerator configs: ``cpu_workarounds()`` is False, so the plan holds the accelerator's program (native
    bf16 dots, no transpose barrier), not CPU-only extra buffers."""
    token = _COMPILE_ONLY.set(True)
    try:
        yield
    finally:
        _COMPILE_ONLY.reset(token)


def cpu_workarounds() -> bool:
    """Whether code traced now takes the workarounds XLA:CPU needs to run it (``f32_einsum``'s upcast, the
    decoder's SwiGLU transpose barrier): on CPU, unless ``compile_only()``."""
    return target_platform() == "cpu" and not _COMPILE_ONLY.get()


def target_platform() -> str:
    """The platform code is traced for: ``lowering_for``'s, else the default backend ("gpu" named as
    "cuda" or "rocm")."""
    platform = _LOWERING_PLATFORM.get()
    if platform is not None:
        return platform
    backend = jax.default_backend()
    if backend == "gpu":
        return "cuda" if _is_cuda() else "rocm"
    return backend


def f32_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``einsum(spec, a, b)`` accumulated and returned in float32. On CPU, bfloat16/float16 operands are
    upcast first: XLA:CPU's dot thunk has no ``BF16 x BF16 = F32`` kernel (``UNIMPLEMENTED ... DotThunk``
    whenever XLA leaves such a dot unfused), and the upcast changes no number: bf16/f16 -> f32 is exact, and
    so is the product of two of them (8 + 8 or 11 + 11 significand bits fit f32's 24), so only the float32
    accumulation remains, as in the mixed-precision dot. Elsewhere the operands stay as given (native bf16
    matmuls accumulating in float32)."""
    if cpu_workarounds():
        a, b = (x.astype(jnp.float32) if jnp.dtype(x.dtype).itemsize < 4 else x for x in (a, b))
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def check_implementation(implementation: str, field: str = "implementation") -> None:
    """ValueError naming ``field`` unless ``implementation`` is one of ``IMPLEMENTATIONS``."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{field}={implementation!r} is not an attention implementation: choose one of "
                         f"{', '.join(IMPLEMENTATIONS)}")


def check_block_size(size: Any, field: str) -> None:
    """ValueError naming ``field`` unless ``size`` is a positive Python int."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"{field}={size!r} must be a positive int")


def is_full_sequence(q_len: int, s_len: int, query_offset: Any) -> bool:
    """True when queries and keys are the same Q == S tokens (``query_offset`` statically 0)."""
    return q_len == s_len and isinstance(query_offset, (int, np.integer)) and int(query_offset) == 0


def resolve_implementation(implementation: str, q_len: int, s_len: int, dtype: Any, head_dim: int,
                           query_offset: Any = 0, backend: str | None = None) -> str:
    """The implementation ``attention`` runs for a call: ``"auto"`` resolved, and ``"cudnn"`` /
    ``"pallas_tpu"`` replaced by ``"blockwise"`` on calls they do not cover (see the module docstring).
    ``backend``: a platform name (``PLATFORMS``, or ``"gpu"``); default ``target_platform()``."""
    check_implementation(implementation)
    backend = backend or target_platform()
    if backend == "gpu":  # JAX's name for both CUDA and ROCm
        backend = "cuda" if _is_cuda() else "rocm"
    full = is_full_sequence(q_len, s_len, query_offset)
    if implementation == "auto":
        if full and backend == "tpu" and pallas_tpu_supports(head_dim):
            return "pallas_tpu"
        if full and backend == "cuda" and cudnn_supports(dtype, head_dim):
            return "cudnn"
        return "blockwise"
    if implementation in ("cudnn", "pallas_tpu") and not full:
        return "blockwise"
    if implementation == "cudnn" and not cudnn_supports(dtype, head_dim):
        raise ValueError(f"implementation='cudnn' needs float16/bfloat16 inputs and head_dim a multiple of 8 "
                         f"<= 128, got dtype={jnp.dtype(dtype).name}, head_dim={head_dim}; use 'auto' or "
                         "'blockwise'")
    return implementation


def cudnn_supports(dtype: Any, head_dim: int) -> bool:
    """Whether cuDNN flash attention takes these inputs (dtype and head_dim; checked by JAX at lowering)."""
    return jnp.dtype(dtype) in _CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128


def pallas_tpu_supports(head_dim: int) -> bool:
    """Whether the Pallas TPU kernel takes this head_dim (at most 128, or a multiple of 128)."""
    return head_dim <= _PALLAS_MIN_BLOCK or head_dim % _PALLAS_MIN_BLOCK == 0


def _is_cuda() -> bool:
    """True unless the GPU backend is ROCm (no cuDNN there)."""
    try:
        return "rocm" not in jax.devices()[0].client.platform_version.lower()
    except Exception:  # an unusual client: assume CUDA, as JAX's GPU wheels are
        return True


# --- spans and masks -------------------------------------------------------------------------------

def kv_spans_from_valid(valid_BxL: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(kv_start_B, kv_end_B, contiguous_B)`` of a validity mask: the first valid index, the last valid
    index + 1 (``(L, 0)`` for a row with no valid token, an empty span), and whether the row's valid
    tokens are exactly that span (attention given these spans sees the whole span, holes included)."""
    valid_BxL = jnp.asarray(valid_BxL).astype(bool)
    length = valid_BxL.shape[1]
    col_L = jnp.arange(length, dtype=jnp.int32)
    start_B = jnp.min(jnp.where(valid_BxL, col_L, length), axis=1)
    end_B = jnp.max(jnp.where(valid_BxL, col_L + 1, 0), axis=1)
    count_B = jnp.sum(valid_BxL, axis=1, dtype=jnp.int32)
    return start_B, end_B, count_B == jnp.maximum(end_B - start_B, 0)


def span_mask(kv_start_B: jax.Array, kv_end_B: jax.Array, query_offset: Any, q_len: int,
              s_len: int) -> jax.Array:
    """The boolean ``(B, Q, S)`` visibility mask of the spans (what ``"dense"`` materialises)."""
    slot_S = jnp.arange(s_len)
    query_slot_Q = query_offset + jnp.arange(q_len)
    in_span_BxS = (slot_S[None, :] >= kv_start_B[:, None]) & (slot_S[None, :] < kv_end_B[:, None])
    return in_span_BxS[:, None, :] & (slot_S[None, :] <= query_slot_Q[:, None])[None]


def empty_rows(kv_start_B: jax.Array, kv_end_B: jax.Array, query_offset: Any, q_len: int) -> jax.Array:
    """``(B, Q)`` True where a query sees no key: an empty span, or the query precedes the span."""
    query_slot_Q = query_offset + jnp.arange(q_len)
    return (kv_start_B[:, None] >= kv_end_B[:, None]) | (query_slot_Q[None, :] < kv_start_B[:, None])


# --- the entry point -------------------------------------------------------------------------------

def attention(
    q_BxQxAxD: jax.Array,
    k_BxMxSxD: jax.Array,
    v_BxMxSxD: jax.Array,
    kv_start_B: jax.Array,
    kv_end_B: jax.Array,
    query_offset: jax.Array | int = 0,
    *,
    implementation: str = "auto",
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> jax.Array:
    """Causal GQA ``(B, Q, A, D)`` in q's dtype: query i of row b attends to the slots s with
    ``kv_start_B[b] <= s < kv_end_B[b]`` and ``s <= query_offset + i`` (see the module docstring).

    ``q`` is laid out as the projections give it, ``k``/``v`` as the KV cache stores them (heads before
    slots). ``kv_start_B``/``kv_end_B`` are int arrays (clipped to [0, S]); ``query_offset`` an int or a
    traced int scalar. ``block_q``/``block_k`` are the blockwise implementation's block sizes (an axis
    shorter than its block is one block). Raises ValueError on an unknown ``implementation``, bad shapes or an
    empty sequence (Q or S of 0).
    """
    check_implementation(implementation)
    check_block_size(block_q, "block_q")
    check_block_size(block_k, "block_k")
    b, q_len, n_heads, head_dim = q_BxQxAxD.shape
    if k_BxMxSxD.ndim != 4 or k_BxMxSxD.shape != v_BxMxSxD.shape or k_BxMxSxD.shape[0] != b \
            or k_BxMxSxD.shape[3] != head_dim or n_heads % k_BxMxSxD.shape[1]:
        raise ValueError(f"q {q_BxQxAxD.shape}, k {k_BxMxSxD.shape}, v {v_BxMxSxD.shape} must be (B, Q, A, D), "
                         "(B, M, S, D), (B, M, S, D) with M dividing A")
    s_len = k_BxMxSxD.shape[2]
    if q_len == 0 or s_len == 0:
        raise ValueError(f"attention of an empty sequence: q {q_BxQxAxD.shape} has Q={q_len} queries and k "
                         f"{k_BxMxSxD.shape} S={s_len} key slots; both must be >= 1")
    if jnp.ndim(query_offset) != 0:
        raise ValueError(f"query_offset must be a scalar, got shape {jnp.shape(query_offset)}")
    kv_start_B = jnp.clip(jnp.broadcast_to(jnp.asarray(kv_start_B, jnp.int32), (b,)), 0, s_len)
    kv_end_B = jnp.clip(jnp.broadcast_to(jnp.asarray(kv_end_B, jnp.int32), (b,)), 0, s_len)
    impl = resolve_implementation(implementation, q_len, s_len, q_BxQxAxD.dtype, head_dim, query_offset)
    if impl == "dense":
        return dense_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, query_offset)
    if impl == "blockwise":
        return blockwise_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, query_offset,
                                   block_q=block_q, block_k=block_k)
    if impl == "cudnn":
        out = cudnn_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B)
    else:
        out = pallas_tpu_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B)
    empty_BxQ = empty_rows(kv_start_B, kv_end_B, 0, q_len)
    return jnp.where(empty_BxQ[:, :, None, None], jnp.zeros((), out.dtype), out)


# --- dense (the reference) -------------------------------------------------------------------------

def dense_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, query_offset=0) -> jax.Array:
    """The reference: the decoder's attention as it was, with the (B, Q, S) mask built from the spans."""
    b, q_len, n_heads, head_dim = q_BxQxAxD.shape
    n_kv, s_len = k_BxMxSxD.shape[1], k_BxMxSxD.shape[2]
    groups = n_heads // n_kv
    q = q_BxQxAxD.reshape(b, q_len, n_kv, groups, head_dim)
    # Both matmuls read k/v as stored, batched over (b, m); with the keys as the left operand XLA (CPU)
    # relayouts neither the cache nor q nor the scores.
    scores = jnp.einsum("bksd,btkgd->bkgts", k_BxMxSxD, q).astype(jnp.float32) * head_dim**-0.5
    mask_BxQxS = span_mask(kv_start_B, kv_end_B, query_offset, q_len, s_len)
    scores = jnp.where(mask_BxQxS[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v_BxMxSxD.astype(q.dtype))
    return out.reshape(b, q_len, n_heads, head_dim)


# --- blockwise (flash attention in pure JAX) -------------------------------------------------------

def _block_and_count(length: int, block: int) -> tuple[int, int]:
    """Block size and count for an axis of ``length``: the whole axis if it fits in ``block``, else the
    fewest blocks of at most ``block`` with equal sizes (rounded up to a multiple of 8), so that padding
    wastes little (76 with block 64 is 2 blocks of 40, not 2 of 64)."""
    if length <= block:
        return length, 1
    even = -(-length // -(-length // block))  # ceil(length / fewest blocks)
    size = min(block, -(-even // 8) * 8)
    return size, -(-length // size)


def _pad_to(x: jax.Array, axis: int, size: int) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _block_mask(kv_start_B, kv_end_B, query_slot_Q, key_slot_S):
    """``(B, 1, 1, Q, S)`` visibility of one (query block, key block) pair, from the spans."""
    in_span_BxS = (key_slot_S[None, :] >= kv_start_B[:, None]) & (key_slot_S[None, :] < kv_end_B[:, None])
    causal_QxS = key_slot_S[None, :] <= query_slot_Q[:, None]
    return in_span_BxS[:, None, None, None, :] & causal_QxS[None, None, None]


def _loop(lo, hi, body, carry):
    """``fori_loop(lo, hi, body, carry)``, called directly when the bounds are static and one apart."""
    if isinstance(lo, int) and isinstance(hi, int):
        if hi - lo == 1:
            return body(lo, carry)
        if hi <= lo:
            return carry
    return jax.lax.fori_loop(lo, hi, body, carry)


class _Layout:
    """Static sizes of one blockwise call and the padded, head-grouped views it works on."""

    def __init__(self, q_shape, s_len, block_q, block_k):
        self.b, self.q_len, self.n_heads, self.d = q_shape
        self.s_len = s_len
        self.bq, self.nq = _block_and_count(self.q_len, block_q)
        if self.nq == 1:  # few queries (decoding): key blocks as long as the score block's area allows
            block_k = max(block_k, block_q * block_k // self.bq)
        self.bk, self.nk = _block_and_count(s_len, block_k)
        self.scale = self.d**-0.5

    def grouped(self, x_BxQxAxD, n_kv):
        """(B, Q, A, D) -> (B, M, groups, Q padded, D): the layout whose block matmuls need no relayout."""
        x = x_BxQxAxD.reshape(self.b, self.q_len, n_kv, self.n_heads // n_kv, self.d).transpose(0, 2, 3, 1, 4)
        return _pad_to(x, 3, self.nq * self.bq)

    def ungrouped(self, x_BxMxGxQxD):
        """(B, M, groups, Q padded, D) -> (B, Q, A, D)."""
        x = x_BxMxGxQxD[:, :, :, : self.q_len].transpose(0, 3, 1, 2, 4)
        return x.reshape(self.b, self.q_len, self.n_heads, self.d)

    def key_bound(self, qi, offset):
        """Number of key blocks query block ``qi`` can see (later ones are wholly in its future); the
        offset is never negative, so one key block is always seen (a static bound: no loop)."""
        if self.nk == 1:
            return 1
        last_query = offset + qi * self.bq + self.bq - 1
        if isinstance(last_query, int):
            return min(self.nk, last_query // self.bk + 1)
        return jnp.minimum(self.nk, last_query // self.bk + 1)

    def query_bound(self, kb, offset):
        """First query block that can see key block ``kb`` (0 for the first key block, statically)."""
        if isinstance(kb, int) and kb == 0:
            return 0
        first = (kb * self.bk - offset) // self.bq
        if isinstance(first, int):
            return min(max(first, 0), self.nq)
        return jnp.clip(first, 0, self.nq)


def _forward(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, offset, block_q, block_k):
    """Flash forward: output (B, Q, A, D) and the float32 log-sum-exp (B, M, groups, Q padded)."""
    lay = _Layout(q_BxQxAxD.shape, k_BxMxSxD.shape[2], block_q, block_k)
    n_kv = k_BxMxSxD.shape[1]
    groups = lay.n_heads // n_kv
    q5 = lay.grouped(q_BxQxAxD, n_kv)
    k4 = _pad_to(k_BxMxSxD, 2, lay.nk * lay.bk)
    v4 = _pad_to(v_BxMxSxD, 2, lay.nk * lay.bk)
    f32 = jnp.float32

    def query_block(qi):
        q_blk = jax.lax.dynamic_slice_in_dim(q5, qi * lay.bq, lay.bq, axis=3)
        query_slot = offset + qi * lay.bq + jnp.arange(lay.bq)

        def key_step(kb, carry):
            m_prev, l_prev, acc_prev = carry
            k_blk = jax.lax.dynamic_slice_in_dim(k4, kb * lay.bk, lay.bk, axis=2)
            v_blk = jax.lax.dynamic_slice_in_dim(v4, kb * lay.bk, lay.bk, axis=2)
            s = f32_einsum("bkgtd,bksd->bkgts", q_blk, k_blk) * lay.scale
            mask = _block_mask(kv_start_B, kv_end_B, query_slot, kb * lay.bk + jnp.arange(lay.bk))
            s = jnp.where(mask, s, -jnp.inf)
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1))
            m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # no visible key yet: keep exp finite
            p = jnp.exp(s - m_safe[..., None])
            alpha = jnp.exp(m_prev - m_safe)
            pv = f32_einsum("bkgts,bksd->bkgtd", p.astype(v_blk.dtype), v_blk)
            return m_new, alpha * l_prev + jnp.sum(p, axis=-1), alpha[..., None] * acc_prev + pv

        # Accumulators made from q's block keep its sharding (explicit-sharding meshes need that).
        zeros = jnp.zeros_like(q_blk, f32)
        carry = (zeros[..., 0] - jnp.inf, zeros[..., 0], zeros)
        m, l, acc = _loop(0, lay.key_bound(qi, offset), key_step, carry)
        seen = l > 0
        l_safe = jnp.where(seen, l, 1.0)
        out = (acc / l_safe[..., None]).astype(q_BxQxAxD.dtype)  # 0 on rows that saw no key
        return out, jnp.where(seen, m + jnp.log(l_safe), 0.0)

    if lay.nq == 1:
        out5, lse = query_block(0)
    else:
        outs, lses = jax.lax.map(query_block, jnp.arange(lay.nq))  # (nq, B, M, groups, bq, ...)
        out5 = outs.transpose(1, 2, 3, 0, 4, 5).reshape(lay.b, n_kv, groups, lay.nq * lay.bq, lay.d)
        lse = lses.transpose(1, 2, 3, 0, 4).reshape(lay.b, n_kv, groups, lay.nq * lay.bq)
    return lay.ungrouped(out5), lse


def _backward(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, offset, out_BxQxAxD, lse, dout_BxQxAxD,
              block_q, block_k):
    """Flash backward: dq, dk, dv from recomputed block probabilities ``exp(s - lse)``; one pass over key
    blocks (outer) and the query blocks that see each (inner), dq accumulated in float32.

    Scores are recomputed transposed, ``(B, M, S block, groups, Q block)``, and q and dO are also held
    query-minor, ``(B, M, D, groups, Q)`` (one transpose each, outside the loops), so that every block matmul
    reads its operands as stored: dv and dk contract (groups, Q) of p and ds, dq (accumulated as
    ``(B, M, D, groups, Q)``) contracts S with k transposed once per key block."""
    lay = _Layout(q_BxQxAxD.shape, k_BxMxSxD.shape[2], block_q, block_k)
    n_kv = k_BxMxSxD.shape[1]
    groups = lay.n_heads // n_kv
    f32 = jnp.float32
    dtype = q_BxQxAxD.dtype
    q5 = lay.grouped(q_BxQxAxD, n_kv)  # (B, M, groups, Q, D)
    do5 = lay.grouped(dout_BxQxAxD.astype(dtype), n_kv)
    q5_t, do5_t = q5.transpose(0, 1, 4, 2, 3), do5.transpose(0, 1, 4, 2, 3)  # (B, M, D, groups, Q)
    # delta = rowsum(dO * O), on the (B, Q, A, D) layout before the small (B, Q, A) result is regrouped.
    delta_BxQxA = jnp.sum(dout_BxQxAxD.astype(f32) * out_BxQxAxD.astype(f32), axis=-1)
    delta = _pad_to(delta_BxQxA.reshape(lay.b, lay.q_len, n_kv, groups).transpose(0, 2, 3, 1), 3,
                    lay.nq * lay.bq)
    k4 = _pad_to(k_BxMxSxD, 2, lay.nk * lay.bk)
    v4 = _pad_to(v_BxMxSxD, 2, lay.nk * lay.bk)

    def key_block(dq5_t, kb):
        k_blk = jax.lax.dynamic_slice_in_dim(k4, kb * lay.bk, lay.bk, axis=2)
        v_blk = jax.lax.dynamic_slice_in_dim(v4, kb * lay.bk, lay.bk, axis=2).astype(dtype)
        k_blk_t = k_blk.swapaxes(2, 3).astype(dtype)  # (B, M, D, S block)
        key_slot = kb * lay.bk + jnp.arange(lay.bk)
        in_span = (key_slot[None, :] >= kv_start_B[:, None]) & (key_slot[None, :] < kv_end_B[:, None])

        def query_step(qi, carry):
            dk_acc, dv_acc, dq5_t = carry
            start = qi * lay.bq

            def rows(x, axis):
                return jax.lax.dynamic_slice_in_dim(x, start, lay.bq, axis=axis)

            q_blk, do_blk = rows(q5, 3), rows(do5, 3)  # (B, M, groups, Q block, D)
            q_blk_t, do_blk_t = rows(q5_t, 4), rows(do5_t, 4)  # (B, M, D, groups, Q block)
            lse_blk, delta_blk = rows(lse, 3)[:, :, None], rows(delta, 3)[:, :, None]  # (B, M, 1, groups, Qb)
            causal = key_slot[:, None] <= (offset + start + jnp.arange(lay.bq))[None, :]  # (S block, Q block)
            mask = in_span[:, None, :, None, None] & causal[None, None, :, None, :]
            s = f32_einsum("bksd,bkdgt->bksgt", k_blk, q_blk_t) * lay.scale
            p = jnp.exp(jnp.where(mask, s, -jnp.inf) - lse_blk)
            dv_acc = dv_acc + f32_einsum("bksgt,bkgtd->bksd", p.astype(dtype), do_blk)
            dp = f32_einsum("bksd,bkdgt->bksgt", v_blk, do_blk_t)
            ds = (p * (dp - delta_blk)).astype(dtype)
            dk_acc = dk_acc + f32_einsum("bksgt,bkgtd->bksd", ds, q_blk)
            dq_blk_t = f32_einsum("bkds,bksgt->bkdgt", k_blk_t, ds)
            dq_old = jax.lax.dynamic_slice_in_dim(dq5_t, start, lay.bq, axis=4)
            return dk_acc, dv_acc, jax.lax.dynamic_update_slice_in_dim(dq5_t, dq_old + dq_blk_t, start, axis=4)

        zeros = jnp.zeros_like(k_blk, f32)
        dk_acc, dv_acc, dq5_t = _loop(lay.query_bound(kb, offset), lay.nq, query_step, (zeros, zeros, dq5_t))
        return dq5_t, (dk_acc, dv_acc)

    dq5_t = jnp.zeros_like(q5_t, f32)
    if lay.nk == 1:
        dq5_t, (dk, dv) = key_block(dq5_t, 0)
    else:
        dq5_t, (dks, dvs) = jax.lax.scan(key_block, dq5_t, jnp.arange(lay.nk))  # (nk, B, M, bk, D)
        dk = dks.transpose(1, 2, 0, 3, 4).reshape(lay.b, n_kv, lay.nk * lay.bk, lay.d)
        dv = dvs.transpose(1, 2, 0, 3, 4).reshape(lay.b, n_kv, lay.nk * lay.bk, lay.d)
    dq = lay.ungrouped((dq5_t * lay.scale).transpose(0, 1, 3, 4, 2)).astype(q_BxQxAxD.dtype)
    dk = (dk[:, :, : lay.s_len] * lay.scale).astype(k_BxMxSxD.dtype)
    dv = dv[:, :, : lay.s_len].astype(v_BxMxSxD.dtype)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _flash(q, k, v, kv_start_B, kv_end_B, offset_array, static_offset, block_q, block_k):
    offset = offset_array if static_offset is None else static_offset
    return _forward(q, k, v, kv_start_B, kv_end_B, offset, block_q, block_k)[0]


def _flash_fwd(q, k, v, kv_start_B, kv_end_B, offset_array, static_offset, block_q, block_k):
    offset = offset_array if static_offset is None else static_offset
    out, lse = _forward(q, k, v, kv_start_B, kv_end_B, offset, block_q, block_k)
    return out, (q, k, v, kv_start_B, kv_end_B, offset_array, out, lse)


def _flash_bwd(static_offset, block_q, block_k, residuals, dout):
    q, k, v, kv_start_B, kv_end_B, offset_array, out, lse = residuals
    offset = offset_array if static_offset is None else static_offset
    dq, dk, dv = _backward(q, k, v, kv_start_B, kv_end_B, offset, out, lse, dout, block_q, block_k)
    return dq, dk, dv, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, query_offset=0, *,
                        block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K) -> jax.Array:
    """Flash attention in pure JAX with its own backward (see the module docstring); spans as ``attention``."""
    static_offset = int(query_offset) if isinstance(query_offset, (int, np.integer)) else None
    offset_array = jnp.asarray(query_offset, jnp.int32)
    v_BxMxSxD = v_BxMxSxD.astype(q_BxQxAxD.dtype)
    k_BxMxSxD = k_BxMxSxD.astype(q_BxQxAxD.dtype)
    return _flash(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, jnp.asarray(kv_start_B, jnp.int32),
                  jnp.asarray(kv_end_B, jnp.int32), offset_array, static_offset, int(block_q), int(block_k))


# --- cuDNN (GPU) -----------------------------------------------------------------------------------

def cudnn_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B, *,
                    sdpa_implementation: str = "cudnn") -> jax.Array:
    """Full-sequence (Q == S) attention through ``jax.nn.dot_product_attention``: each row rotated left by
    its span start so that the span is ``[0, kv_end - kv_start)`` (a right-padded, causal problem cuDNN
    takes as ``key_value_seq_lengths``), and rotated back. Rows before the span wrap to the end and see
    the whole span; ``attention`` zeroes them (they see nothing). ``sdpa_implementation="xla"`` runs
    the same mapping on any backend (tests)."""
    b, length, n_heads, head_dim = q_BxQxAxD.shape
    col_L = jnp.arange(length, dtype=jnp.int32)
    take_BxL = (col_L[None, :] + kv_start_B[:, None]) % length  # rotated slot j holds slot j + start

    def rotate(x_BxLxHxD, index_BxL):
        return jnp.take_along_axis(x_BxLxHxD, index_BxL[:, :, None, None], axis=1)

    q = rotate(q_BxQxAxD, take_BxL)
    k = rotate(k_BxMxSxD.swapaxes(1, 2).astype(q.dtype), take_BxL)
    v = rotate(v_BxMxSxD.swapaxes(1, 2).astype(q.dtype), take_BxL)
    # At least one key per row, so that no row is fully masked inside cuDNN (empty rows are zeroed after).
    lengths_B = jnp.clip(kv_end_B - kv_start_B, 1, length).astype(jnp.int32)
    out = jax.nn.dot_product_attention(q, k, v, scale=head_dim**-0.5, is_causal=True,
                                       key_value_seq_lengths=lengths_B, implementation=sdpa_implementation)
    return rotate(out, (col_L[None, :] - kv_start_B[:, None]) % length)


# --- Pallas TPU flash attention --------------------------------------------------------------------

def pallas_tpu_attention(q_BxQxAxD, k_BxMxSxD, v_BxMxSxD, kv_start_B, kv_end_B) -> jax.Array:
    """Full-sequence (Q == S) attention through JAX's Pallas TPU flash kernel: KV heads repeated to the
    query heads, the sequence padded to a multiple of 128, the spans as segment ids (queries 1; keys 1
    inside the span, 0 outside and on the padding), ``causal=True``. Block sizes (forward and backward):
    the largest of 512, 256, 128 that divides the padded length."""
    from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # TPU-only module

    b, length, n_heads, head_dim = q_BxQxAxD.shape
    groups = n_heads // k_BxMxSxD.shape[1]
    padded = -(-length // _PALLAS_MIN_BLOCK) * _PALLAS_MIN_BLOCK
    q = _pad_to(q_BxQxAxD.transpose(0, 2, 1, 3), 2, padded)  # (B, A, L, D)
    # Query head h = m * groups + g reads KV head m: repeat each KV head `groups` times in place.
    k = _pad_to(jnp.repeat(k_BxMxSxD.astype(q.dtype), groups, axis=1), 2, padded)
    v = _pad_to(jnp.repeat(v_BxMxSxD.astype(q.dtype), groups, axis=1), 2, padded)
    slot_L = jnp.arange(padded)
    kv_segment_BxL = ((slot_L[None, :] >= kv_start_B[:, None]) & (slot_L[None, :] < kv_end_B[:, None]))
    segment_ids = pallas_flash.SegmentIds(q=jnp.ones((b, padded), jnp.int32),
                                          kv=kv_segment_BxL.astype(jnp.int32))
    size = next(s for s in (512, 256, _PALLAS_MIN_BLOCK) if padded % s == 0)
    block_sizes = pallas_flash.BlockSizes(
        block_q=size, block_k_major=size, block_k=size, block_b=1, block_q_major_dkv=size,
        block_k_major_dkv=size, block_k_dkv=size, block_q_dkv=size, block_k_major_dq=size, block_k_dq=size,
        block_q_dq=size)

    def kernel(q, k, v, segment_ids):
        return pallas_flash.flash_attention(q, k, v, segment_ids=segment_ids, causal=True,
                                            sm_scale=head_dim**-0.5, block_sizes=block_sizes)

    layout = _kernel_layout(q)
    if layout is None:  # one device (or no mesh): the kernel as it is
        out = kernel(q, k, v, segment_ids)
    else:
        # A Mosaic kernel cannot be partitioned by the compiler ("Mosaic kernels cannot be automatically
        # partitioned"), so on a mesh it runs under shard_map, per device on its block of rows and heads:
        # attention is independent per row and per head, so this is exact, forward and backward (shard_map is
        # differentiable; the kernel's own custom_vjp runs per device). check_vma=False: the kernel's
        # pallas_calls declare no varying-axes types (with True: "manual_axis_type ... must not be None").
        mesh, rows, heads, mapped = layout
        spec = jax.P(rows or None, heads or None)
        args = (q, k, v, segment_ids)
        specs = (spec, spec, spec, pallas_flash.SegmentIds(q=jax.P(rows or None), kv=jax.P(rows or None)))
        if _all_explicit(mesh):  # the types carry the layout: put every operand in the kernel's
            args = jax.sharding.reshard(args, jax.tree.map(lambda p: jax.NamedSharding(mesh, p), specs,
                                                           is_leaf=lambda x: isinstance(x, jax.P)))
        out = jax.shard_map(kernel, mesh=mesh, in_specs=specs, out_specs=spec, axis_names=mapped,
                            check_vma=False)(*args)
    return out[:, :, :length].transpose(0, 2, 1, 3)


def _all_explicit(mesh) -> bool:
    return all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def _kernel_layout(x_BxAxLxD: jax.Array) -> tuple[Any, tuple[str, ...], tuple[str, ...], set[str]] | None:
    """``(mesh, row axes, head axes, mapped axes)`` to run a per-device kernel over ``(B, A, L, D)`` operands by
    shard_map, or None when they are not on a mesh of several devices (or already per device: inside a
    shard_map, whose manual axes are not mapped again). The mesh is the abstract mesh in context, else the
    one the operand's type names (inside ``jax.jit`` with ``in_shardings`` on a mesh: the project's way,
    ``sharding.Placement``). On a mesh of explicit axes the operand's type carries its layout, which is kept:
    rows and heads split as they are. With automatic axes (``mesh.axis_types="auto"``, the default) the
    compiler lays arrays out only after tracing, so no layout can be read here; rows are split over every mesh
    axis (in mesh order) whose size keeps B divisible, then heads over the axes left that divide A: the layout
    the project's runs give the rows (the flat rollout axis over the data axes, every other axis of size 1
    or unused by activations), and any other is resharded into it by the compiler, exactly."""
    mesh = jax.sharding.get_abstract_mesh()
    sharding = getattr(jax.typeof(x_BxAxLxD), "sharding", None)
    if mesh.empty:
        mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None
    free = {a for a, t in zip(mesh.axis_names, mesh.axis_types) if t != jax.sharding.AxisType.Manual}
    if all(mesh.shape[a] == 1 for a in free):
        return None

    def names(entry):
        return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)

    if _all_explicit(mesh) and sharding is not None and getattr(sharding, "mesh", None) == mesh:
        spec = tuple(sharding.spec) + (None,) * 2
        return mesh, names(spec[0]), names(spec[1]), free
    split: dict[int, list[str]] = {0: [], 1: []}
    for dim in (0, 1):
        size = x_BxAxLxD.shape[dim]
        for axis in mesh.axis_names:
            if axis in free and mesh.shape[axis] > 1 and axis not in split[0] and size % mesh.shape[axis] == 0:
                split[dim].append(axis)
                size //= mesh.shape[axis]
    return mesh, tuple(split[0]), tuple(split[1]), free


def temp_bytes(fn, *args) -> int:
    """Temporary bytes XLA allocates for ``jax.jit(fn)(*args)`` (``memory_analysis`` of the compiled
    program; what the memory test and the benchmark compare)."""
    return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)

