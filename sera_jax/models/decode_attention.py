"""Decode-time attention of many rollouts over a shared prompt cache plus each rollout's own response cache.

A SERA sampling call decodes S slots, each holding one rollout of one of P prompts (``prompt_ids_S``: data,
changing as slots are refilled). The keys/values of a prompt are stored **once** (``SharedKV.prompt_*``,
P rows of T columns); a slot stores only its own response (``SharedKV.response_*``, R columns). The response
cache is a ring indexed by decoding step: at step i every slot writes column ``i mod R`` (one
``dynamic_update_slice`` for all slots, whatever their depth), and since an active slot feeds one token per
step, its rollout's ``n_valid`` fed tokens are the ring's newest ``n_valid`` columns (``ring_valid``; a
rollout feeds at most R - 1 tokens, so it never overwrites its own). One decoding step's attention for
slot s, query head h = m * groups + g reading KV head m, is

    softmax over [prompt columns of p(s) in [start_p, T)  |  the slot's newest n_valid_s response columns]

computed as two partial softmaxes merged by their log-sum-exp (the two-part online softmax of flash attention):
each part returns an unnormalised ``acc = sum_j exp(s_j - m) v_j``, its max ``m`` and ``l = sum_j exp(s_j - m)``;
``merge`` rescales both to the common max. The parts:

- **Response part** (``response_partials``): per slot, its ``groups`` query heads against its own R columns,
  masked by ``ring_valid``. Reads ``S x R`` cache columns per step (static shapes: all R, masked).
- **Prompt part**: the queries of all slots of prompt p form one ``(rows_p * groups, D)`` block multiplied
  by p's keys ``(D, T)``: p's cache is read once per step for all its rollouts, not once per rollout. The
  grouping is data: ``prompt_schedule`` sorts the slots by prompt (inactive slots last; an argsort of S
  ints) and cuts each prompt's run of rows into tiles of ``tile`` rows, so a step makes
  ``sum_p ceil(rows_p / tile)`` tile visits (<= S / tile + the number of prompts active, <= S). A visit is
  one batched matmul ``(tile * groups, D) x (D, T)`` per KV head, then ``x (T, D)``. Only the small query
  and partial arrays (``S x A x D``) are permuted; the caches never move. Two implementations of the visits:

  * ``"ragged"`` (CPU default): a ``lax.fori_loop`` over exactly the step's visits (a data-dependent trip
    count), each slicing its prompt's keys/values in place (``dynamic_slice``, no gather). Cost: the visits
    actually needed; prompt bytes read per step: each active prompt once (plus one tile's rows each).
  * ``"batched"`` (GPU/TPU default): the visits ``VISIT_CHUNK`` (64) at a time, each chunk one fused op
    with its prompts' keys/values gathered (``64 x T`` columns copied per chunk: the price of batching
    without a kernel that reads a prompt's block in place), a loop over the step's
    ``ceil(visits / 64)`` chunks: a few loop steps (kernel launches) per layer instead of one per visit.

  ``tile`` trades wasted rows (a prompt with 1 active row still fills one tile) against matmul size; the
  sampler picks it from the slots per prompt of the call (1 when every prompt has one rollout).

Kernels JAX ships, and why neither is used here: ``jax.experimental.pallas.ops.gpu.decode_attention.mqa``
(Triton) computes exactly the partials (``return_residuals=True, normalize_output=False``) for a fixed
number of query rows per key/value batch entry, so it fits the response part (``groups`` rows per slot and KV
head) and the batched prompt visits (``tile * groups`` rows per visit); its prompt operand would still be the
gathered ``V x T`` copy (Triton Pallas has no scalar-prefetched index maps to read a prompt's block in place).
``jax.experimental.pallas.ops.tpu.paged_attention`` reads a per-row page table (it would let a slot's page
table point at its prompt's pages, saving memory but reading the prompt once per rollout) and returns only
the normalised output, so the two-part merge cannot be built on it. Neither was run on an accelerator
while this was written (no GPU/TPU available), so the pure-JAX ``"batched"`` path is what accelerators get;
wiring the Triton kernel in is a measured change for a machine that has one.

Layouts (shape letters: S slots, P prompts, T prompt columns, R response columns, A query heads, M KV heads,
G = A / M query heads per KV head, D head_dim): prompt keys and values ``(P, M, T, D)`` as the prefill writes
them (a visit's matmuls have ``tile * G`` rows: real GEMMs either way, and no transposed copy of the prompts);
response keys **transposed**, ``(S, M, D, R)``, values ``(S, M, R, D)``: on CPU the per-slot score matmul
(G query rows per KV head) runs 2-3x faster with the columns minor (measured on 2 cores; XLA's batched dot
otherwise relayouts or takes a slow path), and the probabilities-times-values matmul reads values as stored.

Rows with nothing visible (inactive slots) get a finite output (0); nothing reads them. The float32 matmuls
are ``attention.f32_einsum`` (on CPU, bfloat16 operands upcast exactly: XLA:CPU has no BF16 x BF16 = F32 dot).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sera_jax.models.attention import f32_einsum, target_platform

IMPLEMENTATIONS = ("auto", "ragged", "batched", "dense")


class SharedKV(NamedTuple):
    """One layer's cache of a sampling call: prompts stored once, responses per slot.

    prompt_k, prompt_v (P, M, T, D), as the prefill writes them: valid columns ``[prompt_start_P[p], T)``;
    response_k (S, M, D, R), response_v (S, M, R, D): column i is the slot's i-th response token."""

    prompt_k: jax.Array
    prompt_v: jax.Array
    response_k: jax.Array
    response_v: jax.Array


class Partials(NamedTuple):
    """A partial softmax over some key columns, per (slot, KV head, query head of the group)."""

    acc: jax.Array  # (S, M, G, D) float32, sum_j exp(score_j - m) v_j
    m: jax.Array  # (S, M, G) float32 max score (-inf when nothing was visible)
    l: jax.Array  # (S, M, G) float32 sum_j exp(score_j - m)


@functools.partial(jax.tree_util.register_dataclass, meta_fields=("tile",),
                   data_fields=("perm_S", "inv_perm_S", "row_start_P", "row_count_P", "visit_start_P",
                                "visit_end_P", "num_visits"))
@dataclasses.dataclass(frozen=True)
class Schedule:
    """The prompt part's grouping of one step (shared by all layers): see ``prompt_schedule``. A pytree whose
    ``tile`` is static."""

    perm_S: jax.Array  # sorted position i holds slot perm_S[i] (active slots by prompt, inactive last)
    inv_perm_S: jax.Array  # slot s sits at sorted position inv_perm_S[s]
    row_start_P: jax.Array  # first sorted position of prompt p's active rows
    row_count_P: jax.Array  # number of active rows of prompt p
    visit_start_P: jax.Array  # first visit of prompt p (visits are prompt-major)
    visit_end_P: jax.Array  # one past prompt p's last visit
    num_visits: jax.Array  # int32 scalar: sum_p ceil(row_count_p / tile)
    tile: int  # static rows per visit


def prompt_schedule(prompt_ids_S: jax.Array, active_S: jax.Array, num_prompts: int, tile: int) -> Schedule:
    """Sorts the active slots by prompt and cuts each prompt's rows into visits of ``tile`` rows."""
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got tile={tile}")
    key_S = jnp.where(active_S, prompt_ids_S, num_prompts).astype(jnp.int32)
    perm_S = jnp.argsort(key_S, stable=True).astype(jnp.int32)
    inv_perm_S = jnp.zeros_like(perm_S).at[perm_S].set(jnp.arange(perm_S.shape[0], dtype=jnp.int32))
    count_P = jnp.zeros((num_prompts,), jnp.int32).at[key_S].add(1, mode="drop")
    start_P = jnp.cumsum(count_P) - count_P
    visits_P = (count_P + tile - 1) // tile
    visit_end_P = jnp.cumsum(visits_P)
    return Schedule(perm_S, inv_perm_S, start_P, count_P, visit_end_P - visits_P, visit_end_P,
                    visit_end_P[-1], tile)


def max_visits(num_slots: int, num_prompts: int, tile: int) -> int:
    """Static bound on a step's visits: ``sum_p ceil(rows_p / tile)`` with ``sum_p rows_p <= S``."""
    return min(num_slots, num_slots // tile + min(num_prompts, num_slots))


def _softmax_partials(s, valid, v_blk, dims: str):
    """acc, m, l of scores ``s`` (float32) masked by ``valid``; ``dims`` is the einsum of probs x values."""
    s = jnp.where(valid, s, -jnp.inf)
    m = jnp.max(s, axis=-1)
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    p = jnp.exp(s - m_safe[..., None])
    acc = f32_einsum(dims, p.astype(v_blk.dtype), v_blk)
    return acc, m, jnp.sum(p, axis=-1)


def ring_valid(n_valid_S: jax.Array, newest_col: jax.Array, r_len: int) -> jax.Array:
    """``(S, R)``: response column j of slot s holds one of its ``n_valid_S[s]`` tokens, the newest of which
    is at ``newest_col`` (a ring: ``(newest_col - j) mod R < n_valid``)."""
    age_R = jnp.mod(newest_col - jnp.arange(r_len), r_len)
    return age_R[None, :] < n_valid_S[:, None]


def response_partials(q_SxMxGxD: jax.Array, response_k: jax.Array, response_v: jax.Array,
                      n_valid_S: jax.Array, newest_col: jax.Array) -> Partials:
    """Each slot's queries against its own ``n_valid_S`` response columns (``ring_valid``)."""
    d = q_SxMxGxD.shape[-1]
    s = f32_einsum("smgd,smdr->smgr", q_SxMxGxD, response_k.astype(q_SxMxGxD.dtype)) * d**-0.5
    valid = ring_valid(n_valid_S, newest_col, response_k.shape[-1])[:, None, None, :]
    return Partials(*_softmax_partials(s, valid, response_v.astype(q_SxMxGxD.dtype), "smgr,smrd->smgd"))


def _prompt_partials_ragged(q_sorted, prompt_k, prompt_v, prompt_start_P, sch: Schedule) -> Partials:
    """The visits as a loop with the step's own trip count; partials in sorted order."""
    s_len, n_kv, groups, d = q_sorted.shape
    tile, t_len = sch.tile, prompt_k.shape[2]
    pad = jnp.zeros((tile, n_kv, groups, d), q_sorted.dtype)
    q_pad = jnp.concatenate([q_sorted, pad])  # a prompt's last tile may run past the last row
    f32 = jnp.float32
    col_T = jnp.arange(t_len)
    # Accumulators derived from q keep its sharding (explicit-sharding meshes need that).
    zeros = jnp.zeros_like(q_pad, f32)
    init = (zeros, zeros[..., 0] - jnp.inf, zeros[..., 0])

    def visit(v, carry):
        acc_all, m_all, l_all = carry
        p = jnp.clip(jnp.searchsorted(sch.visit_end_P, v, side="right"), 0, prompt_k.shape[0] - 1)
        row0 = sch.row_start_P[p] + (v - sch.visit_start_P[p]) * tile
        q_t = jax.lax.dynamic_slice_in_dim(q_pad, row0, tile, axis=0)  # (tile, M, G, D)
        q_t = q_t.transpose(1, 0, 2, 3).reshape(n_kv, tile * groups, d)
        k_p = jax.lax.dynamic_index_in_dim(prompt_k, p, keepdims=False).astype(q_sorted.dtype)  # (M, T, D)
        v_p = jax.lax.dynamic_index_in_dim(prompt_v, p, keepdims=False).astype(q_sorted.dtype)  # (M, T, D)
        s = f32_einsum("mqd,mtd->mqt", q_t, k_p) * d**-0.5
        acc, m, l = _softmax_partials(s, (col_T >= prompt_start_P[p])[None, None], v_p, "mqt,mtd->mqd")
        acc = acc.reshape(n_kv, tile, groups, d).transpose(1, 0, 2, 3)
        m, l = m.reshape(n_kv, tile, groups).transpose(1, 0, 2), l.reshape(n_kv, tile, groups).transpose(1, 0, 2)
        mine = (row0 + jnp.arange(tile)) < sch.row_start_P[p] + sch.row_count_P[p]  # rows of prompt p

        def put(buf, new):
            old = jax.lax.dynamic_slice_in_dim(buf, row0, tile, axis=0)
            keep = mine.reshape((tile,) + (1,) * (new.ndim - 1))
            return jax.lax.dynamic_update_slice_in_dim(buf, jnp.where(keep, new, old), row0, axis=0)

        return put(acc_all, acc), put(m_all, m), put(l_all, l)

    acc, m, l = jax.lax.fori_loop(0, sch.num_visits, visit, init)
    return Partials(acc[:s_len], m[:s_len], l[:s_len])


VISIT_CHUNK = 64  # visits per batched chunk: bounds the gathered prompt keys/values to 64 prompts' worth


def _prompt_partials_batched(q_sorted, prompt_k, prompt_v, prompt_start_P, sch: Schedule,
                             chunk: int = VISIT_CHUNK) -> Partials:
    """The visits in chunks of ``chunk`` at once, keys/values gathered per visit, a loop over the step's
    ``ceil(num_visits / chunk)`` chunks; partials in sorted order."""
    s_len, n_kv, groups, d = q_sorted.shape
    n_prompts, tile, t_len = prompt_k.shape[0], sch.tile, prompt_k.shape[2]
    chunk = min(chunk, max_visits(s_len, n_prompts, tile))
    f32 = jnp.float32
    col_T = jnp.arange(t_len)

    def visits(c, carry):
        acc_all, m_all, l_all = carry
        v_V = c * chunk + jnp.arange(chunk)
        p_V = jnp.clip(jnp.searchsorted(sch.visit_end_P, v_V, side="right"), 0, n_prompts - 1)
        rows_VxT = (sch.row_start_P[p_V] + (v_V - sch.visit_start_P[p_V]) * tile)[:, None] + jnp.arange(tile)
        mine_VxT = (rows_VxT < (sch.row_start_P + sch.row_count_P)[p_V][:, None]) & (v_V < sch.num_visits)[:, None]
        q_t = jnp.take(q_sorted, jnp.clip(rows_VxT, 0, s_len - 1), axis=0)  # (V, tile, M, G, D)
        q_t = q_t.transpose(0, 2, 1, 3, 4).reshape(chunk, n_kv, tile * groups, d)
        k_V = jnp.take(prompt_k, p_V, axis=0).astype(q_sorted.dtype)  # (V, M, T, D)
        v_V_ = jnp.take(prompt_v, p_V, axis=0).astype(q_sorted.dtype)
        s = f32_einsum("vmqd,vmtd->vmqt", q_t, k_V) * d**-0.5
        valid = (col_T[None, :] >= prompt_start_P[p_V][:, None])[:, None, None, :]
        acc, m, l = _softmax_partials(s, valid, v_V_, "vmqt,vmtd->vmqd")
        acc = acc.reshape(chunk, n_kv, tile, groups, d).transpose(0, 2, 1, 3, 4).reshape(-1, n_kv, groups, d)
        m = m.reshape(chunk, n_kv, tile, groups).transpose(0, 2, 1, 3).reshape(-1, n_kv, groups)
        l = l.reshape(chunk, n_kv, tile, groups).transpose(0, 2, 1, 3).reshape(-1, n_kv, groups)
        # Every active sorted row is one valid (visit, row) pair; the rest are dropped (index s_len).
        dest = jnp.where(mine_VxT, rows_VxT, s_len).reshape(-1)
        return (acc_all.at[dest].set(acc, mode="drop"), m_all.at[dest].set(m, mode="drop"),
                l_all.at[dest].set(l, mode="drop"))

    zeros = jnp.zeros_like(q_sorted, f32)
    init = (zeros, zeros[..., 0] - jnp.inf, zeros[..., 0])
    return Partials(*jax.lax.fori_loop(0, (sch.num_visits + chunk - 1) // chunk, visits, init))


def merge(a: Partials, b: Partials) -> jax.Array:
    """``softmax over a's columns and b's columns @ values`` from the two partials, float32 (0 if neither
    part saw a column)."""
    m = jnp.maximum(a.m, b.m)
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    wa, wb = jnp.exp(a.m - m_safe), jnp.exp(b.m - m_safe)
    l = a.l * wa + b.l * wb
    acc = a.acc * wa[..., None] + b.acc * wb[..., None]
    return acc / jnp.where(l > 0, l, 1.0)[..., None]


def resolve_implementation(implementation: str, backend: str | None = None) -> str:
    """``"auto"``: ``"ragged"`` on CPU, ``"batched"`` elsewhere (``backend`` defaults to the platform traced
    for, ``attention.target_platform()``); the others as given."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r}: choose one of {', '.join(IMPLEMENTATIONS)}")
    if implementation != "auto":
        return implementation
    return "ragged" if (backend or target_platform()) == "cpu" else "batched"


def shared_prompt_attention(q_SxAxD: jax.Array, kv: SharedKV, prompt_start_P: jax.Array, prompt_ids_S: jax.Array,
                            n_valid_S: jax.Array, newest_col: jax.Array, schedule: Schedule,
                            implementation: str = "auto") -> jax.Array:
    """One decoding step's attention ``(S, A, D)`` in q's dtype (see the module docstring): slot s attends to
    prompt ``prompt_ids_S[s]``'s columns ``[prompt_start_P[p], T)`` and its own ``n_valid_S[s]`` response
    columns, the newest at ``newest_col`` (``ring_valid``). ``schedule`` must come from ``prompt_schedule``
    with the same ``prompt_ids_S``; its inactive slots skip the prompt part (their output is the response part
    alone, 0 if that is empty)."""
    impl = resolve_implementation(implementation)
    s_len, n_heads, d = q_SxAxD.shape
    n_kv = kv.prompt_k.shape[1]
    q = q_SxAxD.reshape(s_len, n_kv, n_heads // n_kv, d)
    if impl == "dense":
        return dense_reference(q_SxAxD, kv, prompt_start_P, prompt_ids_S, n_valid_S, newest_col,
                               active_S=(schedule.inv_perm_S < schedule.row_count_P.sum()))
    prompt_fn = _prompt_partials_ragged if impl == "ragged" else _prompt_partials_batched
    sorted_part = prompt_fn(jnp.take(q, schedule.perm_S, axis=0), kv.prompt_k, kv.prompt_v, prompt_start_P,
                            schedule)
    prompt_part = Partials(*(jnp.take(x, schedule.inv_perm_S, axis=0) for x in sorted_part))
    out = merge(prompt_part, response_partials(q, kv.response_k, kv.response_v, n_valid_S, newest_col))
    return out.reshape(s_len, n_heads, d).astype(q_SxAxD.dtype)


def dense_reference(q_SxAxD, kv: SharedKV, prompt_start_P, prompt_ids_S, n_valid_S, newest_col,
                    active_S=None) -> jax.Array:
    """The reference: each slot's prompt keys gathered next to its response keys, one masked float32
    softmax over all ``T + R`` columns (``active_S`` False: the prompt columns are hidden)."""
    s_len, n_heads, d = q_SxAxD.shape
    n_kv, t_len = kv.prompt_k.shape[1], kv.prompt_k.shape[2]
    r_len = kv.response_k.shape[-1]
    f32 = jnp.float32
    q = q_SxAxD.reshape(s_len, n_kv, n_heads // n_kv, d).astype(f32)
    k = jnp.concatenate([jnp.take(kv.prompt_k, prompt_ids_S, axis=0).swapaxes(2, 3), kv.response_k],
                        axis=-1).astype(f32)
    v = jnp.concatenate([jnp.take(kv.prompt_v, prompt_ids_S, axis=0), kv.response_v], axis=-2).astype(f32)
    active_S = jnp.ones((s_len,), bool) if active_S is None else active_S
    prompt_ok = (jnp.arange(t_len)[None, :] >= jnp.take(prompt_start_P, prompt_ids_S)[:, None]) & active_S[:, None]
    resp_ok = jnp.mod(newest_col - jnp.arange(r_len), r_len)[None, :] < n_valid_S[:, None]
    valid = jnp.concatenate([prompt_ok, resp_ok], axis=1)[:, None, None, :]
    s = jnp.where(valid, jnp.einsum("smgd,smdc->smgc", q, k) * d**-0.5, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - jnp.where(m == -jnp.inf, 0.0, m))
    l = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("smgc,smcd->smgd", p, v) / jnp.where(l > 0, l, 1.0)
    return out.reshape(s_len, n_heads, d).astype(q_SxAxD.dtype)


def write_response(response_k: jax.Array, response_v: jax.Array, k_SxMxD: jax.Array, v_SxMxD: jax.Array,
                   col: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes every slot's new key/value at response column ``col`` (one ``dynamic_update_slice`` each: the
    response cache is a ring indexed by decoding step, see ``ring_valid``)."""
    response_k = jax.lax.dynamic_update_slice(response_k, k_SxMxD[..., None].astype(response_k.dtype), (0, 0, 0, col))
    response_v = jax.lax.dynamic_update_slice(response_v, v_SxMxD[:, :, None].astype(response_v.dtype), (0, 0, col, 0))
    return response_k, response_v


@functools.partial(jax.jit, static_argnames=("num_prompts", "tile", "implementation"))
def step_attention(q_SxAxD, kv: SharedKV, prompt_start_P, prompt_ids_S, n_valid_S, newest_col, active_S, *,
                   num_prompts: int, tile: int, implementation: str = "auto") -> jax.Array:
    """``prompt_schedule`` + ``shared_prompt_attention`` as one jitted call (tests, benchmarks)."""
    sch = prompt_schedule(prompt_ids_S, active_S, num_prompts, tile)
    return shared_prompt_attention(q_SxAxD, kv, prompt_start_P, prompt_ids_S, n_valid_S, newest_col, sch,
                                   implementation)
