"""Jitted autoregressive sampler over the flat rollout batch of docs/method.md §6: prompts cached once, a fixed set of
decoding slots refilled as rollouts end (continuous batching), static shapes throughout.

Inputs: P prompts ``prompt_tokens_PxT`` **left-padded** (real tokens end at column T - 1) with lengths
``prompt_lengths_P``, and a flat ``prompt_ids_B`` giving each of the B rollouts its prompt. B is static; how
many rollouts each prompt gets changes freely from step to step without recompiling. Right-padded prompts
can be converted with ``left_align``.

Work plan:

1. Prefill the P prompts once. Their keys/values are the only copy of the prompt part of the cache
   (``decode_attention.SharedKV``); each of the ``num_slots`` decoding slots (default B) holds only its own
   rollout's response cache, R = ``max_new_tokens`` columns.
2. Slots take the pending rollouts in order (sorted by prompt, so that the slots of a step share few
   prompts). A slot's first token comes from its prompt's prefill logits. Each ``lax.while_loop`` iteration
   feeds every active slot's last token through the model (``Decoder.decode_shared``: the prompt part of
   attention is one batched matmul per prompt over the rows of its rollouts, merged with each slot's
   response part by log-sum-exp; see ``sera_jax.models.decode_attention``), draws the next token, and
   refills the slots whose rollout ended (stop token or the cap) with the next pending rollouts. The loop
   ends when no rollout is pending or running, so with ``num_slots < B`` the number of slot-steps follows
   the sum of response lengths rather than B times the longest.
3. Results are written by rollout index. Rollouts are keyed by (prompt, rank): row b of prompt i is that
   prompt's rollout j = ``rank_offset_P[i]`` + (the number of rows of prompt i before b in ``prompt_ids_B``),
   and its token t is drawn with Gumbel noise from ``fold_in(fold_in(fold_in(key, i), j), t)``. A rollout's tokens
   are a function of (key, its prompt, its rank, the model): not of the slot, the step, the slot count, the
   pending order or the sharding that ran it, nor of the other rows of the call (tested). Common random
   numbers: with one key, rollout j of prompt i is the same whatever the counts of a call, so methods that
   allocate differently share the rollouts of the ranks they both draw, and ``rank_offset_P`` (default 0)
   lets a second call continue the ranks of a first (a pilot's n0 rollouts, then the rest: offset n0).

Each step is a module-level stage that a test can call on its own: ``prefill`` (1), ``empty_slots`` and
``refill_slots`` (the slot refill, drawing each new rollout's first token with ``draw_tokens``), ``decode_step``
(one loop iteration; ``still_decoding`` is the loop's condition) and ``finish`` (3); ``sample`` composes them. The
loop's state is ``Slots`` and ``Drawn``; what it reads and never changes is one ``Decoding``.

Outputs (``SampleOutput``): response tokens (stop token included, PAD after it), a mask, lengths,
``finished_B`` (ended with a stop token; False means truncated), and two log-probs per sampled token:

- ``logp_policy_BxR``: log pi_theta(token) under the raw policy, temperature 1, no top-p: the quantity the
  RL loss and importance ratios use;
- ``logp_sample_BxR``: log of the probability the token was actually drawn with (temperature and top-p
  applied); 0 for greedy decoding (``greedy=True``), whose draw is deterministic.

Greedy decoding is asked for with ``greedy=True`` (the temperature is then ignored); a temperature <= 0 or NaN
is a ValueError, not greedy. Prompt lengths must be in [1, T]. Concrete inputs are checked before the call
(``SampleFn`` checks them before jit); traced ones by a run-time check (``sera_jax.core.validation``) that raises
the same ValueError when the program runs (``check=False`` drops it).

The model is handled functionally: pass ``nnx.split(model)`` (graphdef, state); ``nnx.merge`` happens
inside the jitted function. ``make_sample_fn`` jits with optional ``in_shardings``/``out_shardings``; shard
the flat B axis (``prompt_ids_B`` and the outputs) over the data axis and replicate the prompts and state.
The call is one global program (sharded equals unsharded exactly): the slots and their response caches are
split like the rollout axis (``slot_sharding``, which ``make_sample_fn`` reads from ``in_shardings`` or from
``prompt_ids_B``'s own sharding), the prompts are prefilled split the same way and their cache is then
gathered, so every device holds all P prompts' keys/values (a slot may run any prompt's rollout).

Costs per call: prompt cache ``2 * n_layers * P * T * n_kv_heads * head_dim`` values, response caches
``2 * n_layers * num_slots * R * n_kv_heads * head_dim`` (previously every row held its own copy of its
prompt: ``B * (T + R)``). Per iteration: the model on ``num_slots`` tokens, each active prompt's cache read
once, every slot's R response columns (masked), a draw over the vocabulary (a second one for the refilled
slots, on iterations where some rollout ended and others are pending). Trade-off of ``num_slots``:
fewer slots waste less on finished rollouts (a CPU's cost is per slot), more slots run more rollouts per
iteration (an accelerator's step costs about the same at any small slot count).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sera_jax.core import validation
from sera_jax.models import decode_attention
from sera_jax.models.decoder import Decoder, init_cache


class SampleOutput(NamedTuple):
    """Rollouts of one sampling call (R = max_new_tokens response slots)."""

    tokens_BxR: jax.Array  # int32 sampled tokens; PAD after the stop token / after the end
    mask_BxR: jax.Array  # bool, True on generated tokens (the stop token included)
    lengths_B: jax.Array  # int32 number of generated tokens (= mask_BxR.sum(1))
    finished_B: jax.Array  # bool, True iff the row emitted a stop token (False: truncated at N)
    logp_policy_BxR: jax.Array  # float32 log pi_theta(token), temperature 1, no top-p; 0 where masked
    logp_sample_BxR: jax.Array  # float32 log-prob under the sampling distribution; 0 where masked


def left_align(tokens_PxT: jax.Array, lengths_P: jax.Array, pad_id: int = 0) -> jax.Array:
    """Right-padded prompts -> left-padded ones (each row's first ``length`` tokens moved to the end)."""
    t = tokens_PxT.shape[1]
    src_PxT = jnp.arange(t)[None, :] - (t - lengths_P[:, None])
    gathered = jnp.take_along_axis(tokens_PxT, jnp.clip(src_PxT, 0, t - 1), axis=1)
    return jnp.where(src_PxT >= 0, gathered, pad_id)


def sampling_logprobs(logits_V: jax.Array, temperature: jax.Array, top_p: float) -> jax.Array:
    """Log-probabilities ``(V,)`` of the sampling distribution of one row: softmax(logits / temperature)
    restricted to the top-p nucleus (the smallest set of most likely tokens whose mass reaches top_p; a
    token is kept iff the mass of the tokens ranked above it is < top_p, as HF's TopPLogitsWarper does)
    and renormalised. ``top_p`` is static; ``top_p >= 1`` skips the sort. Requires temperature > 0."""
    logp_V = jax.nn.log_softmax(logits_V.astype(jnp.float32) / temperature)
    if top_p >= 1.0:
        return logp_V
    order_V = jnp.argsort(-logp_V)
    sorted_p = jnp.exp(logp_V[order_V])
    mass_above = jnp.cumsum(sorted_p) - sorted_p
    keep_V = jnp.zeros(logp_V.shape, bool).at[order_V].set(mass_above < top_p)
    return jax.nn.log_softmax(jnp.where(keep_V, logp_V, -jnp.inf))


def sample_token(
    gumbel_V: jax.Array, logits_V: jax.Array, temperature: jax.Array, top_p: float, greedy: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One row's next token and its (policy, sampling) log-probs; ``greedy`` (static) takes the argmax and
    ignores ``temperature``, which otherwise must be > 0 (checked by the caller).

    Gumbel-max: ``argmax(log q + g)`` with i.i.d. standard Gumbel noise ``gumbel_V`` is an exact draw from
    the sampling distribution q. Written for one row; vmapped over the batch."""
    logp_policy_V = jax.nn.log_softmax(logits_V.astype(jnp.float32))
    if greedy:
        token = jnp.argmax(logits_V)
        return token, logp_policy_V[token], jnp.zeros((), jnp.float32)
    logp_sample_V = sampling_logprobs(logits_V, temperature, top_p)
    token = jnp.argmax(logp_sample_V + gumbel_V)
    return token, logp_policy_V[token], logp_sample_V[token]


def check_sample_arguments(max_new_tokens: int, top_p: float, prompt_tokens_PxT: jax.Array,
                           prompt_lengths_P: jax.Array) -> None:
    """ValueError naming the bad argument of a sampling call."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got max_new_tokens={max_new_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got top_p={top_p}")
    if prompt_tokens_PxT.ndim != 2 or prompt_lengths_P.shape != prompt_tokens_PxT.shape[:1]:
        raise ValueError(
            f"prompt_tokens_PxT {prompt_tokens_PxT.shape} and prompt_lengths_P {prompt_lengths_P.shape} "
            "must be (P, T) and (P,)"
        )
    if not np.issubdtype(prompt_lengths_P.dtype, np.integer):
        raise ValueError(f"prompt_lengths_P must be integers, got dtype {prompt_lengths_P.dtype}")


def check_prompt_lengths(prompt_lengths_P: Any, prompt_len: int) -> None:
    """ValueError unless every length is in [1, T]: a length of 0 has no last token to continue, and one
    outside the array would read padding (or nothing) as prompt; both used to sample silently."""
    lengths_P = np.asarray(prompt_lengths_P)
    bad = np.flatnonzero((lengths_P < 1) | (lengths_P > prompt_len))
    if bad.size:
        shown = ", ".join(f"prompt_lengths_P[{i}]={lengths_P[i]}" for i in bad[:5])
        raise ValueError(f"prompt_lengths_P must be in [1, T={prompt_len}] (T: the columns of prompt_tokens_PxT); "
                         f"got {shown}" + (f" ({bad.size} bad in all)" if bad.size > 5 else ""))


def check_temperature(temperature: Any) -> None:
    """ValueError unless ``temperature`` is finite and > 0: 0 is not a way to ask for greedy decoding."""
    t = np.asarray(temperature, np.float64)
    if not (np.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be finite and > 0, got temperature={float(t)}; "
                         "for greedy decoding pass greedy=True")


def check_sample_values(prompt_lengths_P: Any, temperature: Any, prompt_len: int, *, greedy: bool) -> None:
    """The value checks of a sampling call: eagerly for concrete inputs, under jit as a run-time check that
    raises the same ValueError when the program runs (as ``sera_jax.core.validation`` does)."""
    if np.shape(temperature) != ():
        raise ValueError(f"temperature must be a scalar, got shape {np.shape(temperature)}")

    def host_check(lengths_P, temp):
        check_prompt_lengths(lengths_P, prompt_len)
        if not greedy:
            check_temperature(temp)

    if validation.is_traced(prompt_lengths_P, temperature):
        jax.debug.callback(host_check, prompt_lengths_P, temperature)
    else:
        host_check(prompt_lengths_P, temperature)


def rollout_ranks(prompt_ids_B: jax.Array, num_prompts: int) -> jax.Array:
    """Rank of each row among the rows of its prompt, in row order: row b is row ``rank_B[b]`` (from 0) of prompt
    ``prompt_ids_B[b]``. Any layout: a prompt's rows need not be contiguous."""
    batch = prompt_ids_B.shape[0]
    order_B = jnp.argsort(prompt_ids_B, stable=True)
    counts_P = jnp.zeros((num_prompts,), jnp.int32).at[prompt_ids_B].add(1)
    starts_P = jnp.cumsum(counts_P) - counts_P
    ranks_sorted_B = jnp.arange(batch, dtype=jnp.int32) - starts_P[prompt_ids_B[order_B]]
    return jnp.zeros((batch,), jnp.int32).at[order_B].set(ranks_sorted_B)


def check_rank_offset(rank_offset_P: Any, num_prompts: int) -> None:
    """ValueError unless ``rank_offset_P`` is P integers (its values >= 0 are checked where they can be read)."""
    if not hasattr(rank_offset_P, "dtype"):
        rank_offset_P = np.asarray(rank_offset_P)
    shape, dtype = np.shape(rank_offset_P), rank_offset_P.dtype
    if shape != (num_prompts,) or not np.issubdtype(dtype, np.integer):
        raise ValueError(f"rank_offset_P must be {num_prompts} integers (one per prompt of prompt_tokens_PxT), got "
                         f"shape {shape}, dtype {dtype}")
    if not validation.is_traced(rank_offset_P) and getattr(rank_offset_P, "is_fully_addressable", True):
        values = np.asarray(rank_offset_P)
        if values.size and values.min() < 0:
            raise ValueError(f"rank_offset_P must be >= 0, got rank_offset_P[{int(np.argmin(values))}]="
                             f"{int(values.min())}")


def default_prompt_tile(num_slots: int, num_prompts: int) -> int:
    """Rows per prompt-attention visit: the power of two <= the slots per prompt of the call, in [1, 16]."""
    per_prompt = max(1, min(16, num_slots // max(num_prompts, 1)))
    return 1 << (per_prompt.bit_length() - 1)


class SlotLayout(NamedTuple):
    """How a call lays out its prompts and slots: ``sharding`` is the rollout axis's ``NamedSharding`` (``sample``'s
    ``slot_sharding``; None leaves the layout to XLA) and ``shards`` the number of devices it splits over."""

    sharding: jax.sharding.Sharding | None
    shards: int

    @classmethod
    def of(cls, slot_sharding: jax.sharding.Sharding | None) -> "SlotLayout":
        shards = 1 if slot_sharding is None else int(np.prod([slot_sharding.mesh.shape[a]
                                                               for a in _axes(slot_sharding)]))
        return cls(slot_sharding, shards)

    def split(self, tree: Any, size: int) -> Any:
        """``tree`` (leading axis of ``size``: prompts or slots) split over the data axis like the rollouts, when
        ``size`` splits evenly; else left as it is."""
        if self.sharding is None or size % self.shards:
            return tree
        return jax.tree.map(lambda x: _lay_out(x, self.sharding), tree)

    def replicated(self, x: jax.Array) -> jax.Array:
        """``x`` on every device of the layout's mesh (unchanged without a layout)."""
        if self.sharding is None:
            return x
        return _lay_out(x, jax.sharding.NamedSharding(self.sharding.mesh, jax.sharding.PartitionSpec()))


class Slots(NamedTuple):
    """The decoding slots (S of them): the rollout each runs (``roll_S``; B: none), the tokens of it drawn so far
    (``t_S``), its last token (``token_S``, fed at the next step), whether it still runs (``active_S``), and the
    position in the pending order of the next rollout to start (``next_i``, a scalar)."""

    roll_S: jax.Array
    t_S: jax.Array
    token_S: jax.Array
    active_S: jax.Array
    next_i: jax.Array


class Drawn(NamedTuple):
    """What a call has drawn, written by rollout (R = max_new_tokens columns): tokens (PAD where none), the two
    log-probs of each token, and, for the rollouts that ended, their lengths and whether a stop token ended them."""

    tokens_BxR: jax.Array
    logp_policy_BxR: jax.Array
    logp_sample_BxR: jax.Array
    lengths_B: jax.Array
    finished_B: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class Decoding:
    """What the stages after the prefill read and never change, for one call: the model, the rollouts (their
    prompts ``prompt_ids_B``, the order ``order_B`` in which they take free slots, their keys ``row_keys_B``), the
    prompts (lengths, left padding, next-token logits from the prefill), the draw's settings (``temperature``
    traced; ``top_p``, ``greedy`` static; ``stop_ids``) and the static shape of the loop (``max_new_tokens``,
    ``num_slots``, ``tile``, ``attention``, ``layout``)."""

    model: Any  # the merged Decoder; only ``decode_step`` runs it
    prompt_ids_B: jax.Array
    order_B: jax.Array
    row_keys_B: jax.Array
    prompt_lengths_P: jax.Array
    pad_P: jax.Array
    prompt_logits_PxV: jax.Array
    temperature: jax.Array
    stop_ids: jax.Array
    top_p: float
    greedy: bool
    max_new_tokens: int
    num_slots: int
    tile: int
    attention: str
    layout: SlotLayout

    @property
    def batch(self) -> int:
        return self.prompt_ids_B.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.prompt_lengths_P.shape[0]


def prefill(model: Decoder, prompt_tokens_PxT: jax.Array, prompt_lengths_P: jax.Array,
            layout: SlotLayout) -> tuple[jax.Array, Any, jax.Array]:
    """Stage 1, the prefill: each of the P left-padded prompts runs through the model once (split over the data
    axis like the rollouts: each device prefills its share, then the caches are gathered); its keys/values stay
    the only copy of the prompt part of the cache. Left padding puts every prompt's last token in the last
    column, so only that column's logits are computed. Returns ``(prompt_logits_PxV, cache_P, pad_P)``: each
    prompt's next-token logits and its cache, both on every device, and its left padding (T - length)."""
    n_prompts, prompt_len = prompt_tokens_PxT.shape
    pad_P = (prompt_len - prompt_lengths_P).astype(jnp.int32)
    col_T = jnp.arange(prompt_len)
    positions_PxT = jnp.maximum(col_T[None, :] - pad_P[:, None], 0)
    cache_P = init_cache(model.cfg, n_prompts, prompt_len)
    logits_Px1xV, cache_P = model.decode(layout.split(prompt_tokens_PxT, n_prompts),
                                         layout.split(positions_PxT, n_prompts), cache_P, 0, pad_P, last_only=True)
    prompt_logits_PxV = layout.replicated(logits_Px1xV[:, 0])
    cache_P = jax.tree.map(layout.replicated, cache_P)
    return prompt_logits_PxV, cache_P, pad_P


def empty_slots(cfg: Any, cache_P: Any, prompt_logits_PxV: jax.Array, *, num_slots: int, batch: int,
                max_new_tokens: int, layout: SlotLayout) -> tuple[Slots, tuple]:
    """The slots before any rollout starts: every slot free (running rollout B, none), and the caches the loop
    decodes with (``decode_attention.SharedKV`` per layer: the prompts' keys/values, shared, and each slot's own
    empty response cache of R = ``max_new_tokens`` columns). Returns ``(slots, caches)``.

    Made from the prefill's output, the zeros are allocated after it (XLA would otherwise schedule them early
    and the response caches would sit beside the prefill's activations: x * 0 is not folded for floats)."""
    after_prefill = (jnp.nan_to_num(prompt_logits_PxV[0, 0]) * 0).astype(jnp.int32)

    def slot_zeros(*shape, dtype=jnp.int32):
        return layout.split(jnp.zeros((num_slots,) + shape, dtype) + after_prefill.astype(dtype), num_slots)

    dtype = jnp.dtype(cfg.dtype)
    caches = tuple(
        decode_attention.SharedKV(k, v, slot_zeros(cfg.n_kv_heads, cfg.head_dim, max_new_tokens, dtype=dtype),
                                  slot_zeros(cfg.n_kv_heads, max_new_tokens, cfg.head_dim, dtype=dtype))
        for k, v in zip(cache_P.k, cache_P.v))
    slots = Slots(slot_zeros() + batch, slot_zeros(), slot_zeros(), slot_zeros(dtype=bool), jnp.int32(0))
    return slots, caches


def empty_drawn(batch: int, max_new_tokens: int, pad_id: int) -> Drawn:
    """Nothing drawn yet: PAD tokens, zero log-probs and lengths, no rollout finished."""
    resp = max_new_tokens
    return Drawn(jnp.full((batch, resp), pad_id, jnp.int32), jnp.zeros((batch, resp), jnp.float32),
                 jnp.zeros((batch, resp), jnp.float32), jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool))


def rollout_keys(key: jax.Array, prompt_ids_B: jax.Array, num_prompts: int,
                 rank_offset_P: jax.Array | None = None) -> jax.Array:
    """Each row's key: row b is rollout j = offset + rank of its prompt i, keyed ``fold_in(fold_in(key, i), j)``
    whatever the other rows of the call."""
    rank_B = rollout_ranks(prompt_ids_B, num_prompts)
    if rank_offset_P is not None:
        rank_B = rank_B + jnp.take(jnp.asarray(rank_offset_P, jnp.int32), prompt_ids_B)
    return jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(key, i), j))(prompt_ids_B, rank_B)


def token_noise(row_keys_B: jax.Array, roll_S: jax.Array, t_S: jax.Array, vocab: int) -> jax.Array:
    """Gumbel noise ``(S, V)`` of token t of each slot's rollout r: from ``fold_in(row_keys_B[r], t)``, whichever
    slot runs it (a free slot, r = B, reads the last row's key; its draw is dropped)."""
    batch = row_keys_B.shape[0]
    keys_S = row_keys_B[jnp.clip(roll_S, 0, batch - 1)]
    return jax.vmap(lambda k, t: jax.random.gumbel(jax.random.fold_in(k, t), (vocab,), jnp.float32))(keys_S, t_S)


def draw_tokens(dec: Decoding, logits_SxV: jax.Array, roll_S: jax.Array, t_S: jax.Array, valid_S: jax.Array,
                drawn: Drawn) -> tuple[jax.Array, jax.Array, Drawn]:
    """Token ``t_S`` of each valid slot's rollout (``sample_token`` per slot, vmapped), recorded at (rollout, t).
    Returns the tokens, which rollouts ended (a stop token, or the R-th token), and the records: an ended
    rollout's length is t + 1 and it is finished iff a stop token ended it. Invalid slots write nothing."""
    batch, resp = dec.batch, dec.max_new_tokens
    sample_rows = jax.vmap(functools.partial(sample_token, greedy=dec.greedy), in_axes=(0, 0, None, None))
    noise_SxV = token_noise(dec.row_keys_B, roll_S, t_S, dec.prompt_logits_PxV.shape[-1])
    token_S, logp_pol_S, logp_smp_S = sample_rows(noise_SxV, logits_SxV, dec.temperature, dec.top_p)
    token_S = token_S.astype(jnp.int32)
    row_S = jnp.where(valid_S, roll_S, batch)  # out of bounds: dropped
    col_S = jnp.clip(t_S, 0, resp - 1)
    stopped_S = jnp.isin(token_S, dec.stop_ids)
    ended_S = valid_S & (stopped_S | (t_S + 1 >= resp))
    end_row_S = jnp.where(ended_S, roll_S, batch)
    drawn = Drawn(drawn.tokens_BxR.at[row_S, col_S].set(token_S, mode="drop"),
                  drawn.logp_policy_BxR.at[row_S, col_S].set(logp_pol_S, mode="drop"),
                  drawn.logp_sample_BxR.at[row_S, col_S].set(logp_smp_S, mode="drop"),
                  drawn.lengths_B.at[end_row_S].set(t_S + 1, mode="drop"),
                  drawn.finished_B.at[end_row_S].set(stopped_S, mode="drop"))
    return token_S, ended_S, drawn


def refill_slots(dec: Decoding, slots: Slots, drawn: Drawn) -> tuple[Slots, Drawn]:
    """The slot refill: free slots take the next pending rollouts (in ``dec.order_B``) and draw their first token
    from their prompt's prefill logits; a rollout whose first token ends it leaves its slot free again."""
    batch = dec.batch
    roll_S, t_S, token_S, active_S, next_i = slots
    free_S = ~active_S
    cand_S = next_i + jnp.cumsum(free_S.astype(jnp.int32)) - 1
    gets_S = free_S & (cand_S < batch)
    new_roll_S = jnp.take(dec.order_B, jnp.clip(cand_S, 0, batch - 1))
    logits_SxV = jnp.take(dec.prompt_logits_PxV, jnp.take(dec.prompt_ids_B, new_roll_S), axis=0)
    first_S, ended_S, drawn = draw_tokens(dec, logits_SxV, new_roll_S, jnp.zeros_like(t_S), gets_S, drawn)
    slots = Slots(jnp.where(gets_S, new_roll_S, jnp.where(active_S, roll_S, batch)),
                  jnp.where(gets_S, 1, t_S),
                  jnp.where(gets_S, first_S, token_S),
                  active_S | (gets_S & ~ended_S),
                  next_i + jnp.sum(gets_S, dtype=jnp.int32))
    return slots, drawn


def lay_out_slots(dec: Decoding, slots: Slots) -> Slots:
    """``slots`` with its per-slot arrays split like the rollouts (``next_i`` is a scalar)."""
    return Slots(*dec.layout.split(tuple(slots[:4]), dec.num_slots), slots.next_i)


def decode_step(dec: Decoding, carry: tuple) -> tuple:
    """The decoding step, one ``lax.while_loop`` iteration over ``carry = (step, slots, caches, drawn)``: every
    active slot feeds its last token (token t - 1 of its rollout, at RoPE position length + t - 1) through
    ``Decoder.decode_shared`` and draws its token t; then, with fewer slots than rollouts, the slots whose
    rollout ended are refilled (``refill_slots``). An active slot feeds one token per iteration, so its t fed
    tokens are the newest t columns of its response cache's ring."""
    step, slots, caches, drawn = carry
    roll_S, t_S, token_S, active_S, next_i = slots
    batch = dec.batch
    ids_S = jnp.take(dec.prompt_ids_B, jnp.clip(roll_S, 0, batch - 1))
    schedule = decode_attention.prompt_schedule(ids_S, active_S, dec.num_prompts, dec.tile)
    positions_S = jnp.take(dec.prompt_lengths_P, ids_S) + t_S - 1
    logits_SxV, caches = dec.model.decode_shared(token_S, positions_S, caches, dec.pad_P, ids_S, t_S,
                                                 jnp.mod(step, dec.max_new_tokens), schedule, dec.attention)
    token_S, ended_S, drawn = draw_tokens(dec, logits_SxV, roll_S, t_S, active_S, drawn)
    slots = Slots(roll_S, t_S + active_S, token_S, active_S & ~ended_S, next_i)
    if dec.num_slots < batch:  # with a slot per rollout every rollout starts before the loop: nothing to refill
        slots, drawn = jax.lax.cond((slots.next_i < batch) & jnp.any(~slots.active_S),
                                    functools.partial(refill_slots, dec), lambda *a: a, slots, drawn)
    caches = tuple(kv._replace(response_k=dec.layout.split(kv.response_k, dec.num_slots),
                               response_v=dec.layout.split(kv.response_v, dec.num_slots))
                   for kv in caches)
    return step + 1, lay_out_slots(dec, slots), caches, drawn


def still_decoding(dec: Decoding, carry: tuple) -> jax.Array:
    """The loop's condition: some rollout is running or pending."""
    _, slots, _, _ = carry
    return jnp.any(slots.active_S) | (slots.next_i < dec.batch)


def finish(drawn: Drawn) -> SampleOutput:
    """The call's result from its records: the mask of generated tokens follows from the lengths."""
    resp = drawn.tokens_BxR.shape[1]
    mask_BxR = jnp.arange(resp)[None, :] < drawn.lengths_B[:, None]
    return SampleOutput(drawn.tokens_BxR, mask_BxR, drawn.lengths_B, drawn.finished_B, drawn.logp_policy_BxR,
                        drawn.logp_sample_BxR)


def sample(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens_PxT: jax.Array,
    prompt_lengths_P: jax.Array,
    prompt_ids_B: jax.Array,
    key: jax.Array,
    temperature: jax.Array | float = 1.0,
    stop_tokens: jax.Array | tuple[int, ...] = (),
    rank_offset_P: jax.Array | None = None,
    *,
    max_new_tokens: int,
    top_p: float = 1.0,
    pad_id: int = 0,
    num_slots: int | None = None,
    prompt_tile: int | None = None,
    attention: str = "auto",
    pending_order_B: jax.Array | None = None,
    slot_sharding: jax.sharding.Sharding | None = None,
    greedy: bool = False,
    check: bool = True,
) -> SampleOutput:
    """Sample ``max_new_tokens`` (at most) for each of the B rollout rows; see the module docstring.

    ``prompt_tokens_PxT`` must be left-padded; ``prompt_lengths_P`` in [1, T]; ``stop_tokens`` a (possibly
    empty) list of ids that end a row (kept as the row's last token). ``rank_offset_P`` (P integers >= 0,
    default 0): the rank of each prompt's first row in this call (rollouts are keyed by (prompt, rank)).
    ``temperature`` may be traced;
    ``max_new_tokens``, ``top_p``, ``pad_id``, ``num_slots`` (decoding slots, default and at most B),
    ``prompt_tile`` (rows per prompt-attention visit, default ``default_prompt_tile``) and ``attention``
    (``decode_attention.IMPLEMENTATIONS``) are static. ``pending_order_B`` (a permutation of ``range(B)``,
    default: the rollouts sorted by prompt) is the order in which rollouts take free slots; it changes which
    slot runs a rollout and when, never the result (tested). ``slot_sharding`` (static): how to split the
    slot axis (the rollout axis's ``NamedSharding``; ``make_sample_fn`` passes it), None to leave it to XLA.
    ``greedy`` (static): argmax decoding, ``temperature`` ignored; otherwise ``temperature`` must be > 0.
    ``check`` (static): False drops the value checks (lengths, temperature; a run-time check under jit).
    """
    check_sample_arguments(max_new_tokens, top_p, prompt_tokens_PxT, prompt_lengths_P)
    if rank_offset_P is not None:
        check_rank_offset(rank_offset_P, prompt_tokens_PxT.shape[0])
    if check:
        check_sample_values(prompt_lengths_P, temperature, prompt_tokens_PxT.shape[1], greedy=greedy)
    if num_slots is not None and num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got num_slots={num_slots}")
    if prompt_tile is not None and prompt_tile < 1:
        raise ValueError(f"prompt_tile must be >= 1, got prompt_tile={prompt_tile}")
    decode_attention.resolve_implementation(attention)
    model: Decoder = nnx.merge(graphdef, state)
    n_prompts = prompt_tokens_PxT.shape[0]
    batch = prompt_ids_B.shape[0]
    n_slots = min(num_slots or batch, batch)
    prompt_ids_B = prompt_ids_B.astype(jnp.int32)
    prompt_lengths_P = prompt_lengths_P.astype(jnp.int32)
    # Slot arrays are split like the rollout axis (each device holds its share of the response caches); XLA's
    # propagation alone replicates them (the slots' rollouts are chosen by data).
    layout = SlotLayout.of(slot_sharding)

    prompt_logits_PxV, cache_P, pad_P = prefill(model, prompt_tokens_PxT, prompt_lengths_P, layout)
    slots, caches = empty_slots(model.cfg, cache_P, prompt_logits_PxV, num_slots=n_slots, batch=batch,
                                max_new_tokens=max_new_tokens, layout=layout)
    order_B = (jnp.argsort(prompt_ids_B, stable=True) if pending_order_B is None else pending_order_B).astype(jnp.int32)
    dec = Decoding(model=model, prompt_ids_B=prompt_ids_B, order_B=order_B,
                   row_keys_B=rollout_keys(key, prompt_ids_B, n_prompts, rank_offset_P),
                   prompt_lengths_P=prompt_lengths_P, pad_P=pad_P, prompt_logits_PxV=prompt_logits_PxV,
                   temperature=jnp.asarray(temperature, jnp.float32),
                   stop_ids=jnp.asarray(stop_tokens, jnp.int32).reshape(-1), top_p=top_p, greedy=greedy,
                   max_new_tokens=max_new_tokens, num_slots=n_slots,
                   tile=prompt_tile or default_prompt_tile(n_slots, n_prompts), attention=attention, layout=layout)
    slots, drawn = refill_slots(dec, slots, empty_drawn(batch, max_new_tokens, pad_id))
    carry = (jnp.int32(0), lay_out_slots(dec, slots), caches, drawn)
    _, _, _, drawn = jax.lax.while_loop(functools.partial(still_decoding, dec), functools.partial(decode_step, dec),
                                        carry)
    return finish(drawn)


def _lay_out(x: jax.Array, sharding: jax.sharding.NamedSharding) -> jax.Array:
    """``x`` with a sharding constraint (a hint to XLA's propagation) on a mesh with automatic axes (the
    project's default, ``mesh.axis_types="auto"``); unchanged on one with explicit axes, where the types decide
    (the slot loop's scans and sorts need its small arrays replicated there)."""
    if any(t == jax.sharding.AxisType.Explicit for t in getattr(sharding.mesh, "axis_types", ())):
        return x
    return jax.lax.with_sharding_constraint(x, sharding)


def _axes(sharding: jax.sharding.NamedSharding) -> tuple[str, ...]:
    """The mesh axes the leading dimension of ``sharding`` is split over."""
    first = tuple(sharding.spec)[0] if len(sharding.spec) else None
    return () if first is None else ((first,) if isinstance(first, str) else tuple(first))


def rows_sharding(prompt_ids_B: Any) -> jax.sharding.NamedSharding | None:
    """The ``NamedSharding`` of the rollout axis as ``prompt_ids_B`` (an array or ``ShapeDtypeStruct``) is laid
    out, or None when it is not split over several devices: what the sampler lays its slots out by."""
    sharding = getattr(prompt_ids_B, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or sharding.num_devices == 1:
        return None
    spec = tuple(sharding.spec) + (None,)
    return None if spec[0] is None else jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(spec[0]))


class SampleFn:
    """``make_sample_fn``'s result: ``jax.jit`` of ``sample`` with ``slot_sharding`` bound to the rollout axis's
    sharding (from ``in_shardings``, else from the ``prompt_ids_B`` of each call: one jitted function per
    layout), so that the slots' caches are split over the data axis like the rollouts rather than left to
    XLA's propagation. Call it, or ``.lower`` it, like the jitted function; ``jitted`` gives the jitted function
    itself (for ``jax.export``, which takes only those)."""

    def __init__(self, fn, in_shardings: Any, out_shardings: Any):
        self._fn = fn
        self._kwargs = {}
        if in_shardings is not None:
            self._kwargs["in_shardings"] = in_shardings
        if out_shardings is not None:
            self._kwargs["out_shardings"] = out_shardings
        self._fixed = in_shardings is not None
        self._in_shardings = None if in_shardings is None else tuple(in_shardings)
        self._rows = None if in_shardings is None else rows_sharding(jax.ShapeDtypeStruct((0,), jnp.int32,
                                                                                          sharding=in_shardings[3]))
        self._jitted: dict[Any, Any] = {}

    def _jit(self, args, check: bool):
        rows = self._rows if self._fixed else rows_sharding(args[3])
        num_args = len(args)  # 7, or 8 with rank_offset_P
        if (rows, check, num_args) not in self._jitted:
            kwargs = dict(self._kwargs)
            if self._in_shardings is not None:
                kwargs["in_shardings"] = self._shardings_of(num_args)
            self._jitted[rows, check, num_args] = jax.jit(
                functools.partial(self._fn, slot_sharding=rows, check=check), **kwargs)
        return self._jitted[rows, check, num_args]

    def _shardings_of(self, num_args: int) -> tuple:
        """``in_shardings`` for a call of ``num_args`` arguments: seven given and ``rank_offset_P`` passed, it is
        laid out like ``prompt_lengths_P`` (one value per prompt); eight given and seven passed, the last dropped."""
        shardings = self._in_shardings
        if num_args == len(shardings) + 1 == 8:
            return shardings + (shardings[2],)
        return shardings[:num_args]

    def __call__(self, *args) -> SampleOutput:
        return self._jit(args, check=not self._checked_here(args))(*args)

    def jitted(self, *args, check: bool = False):
        """The ``jax.jit`` function that a call with ``args`` runs, for APIs that take only a jitted function
        (``jax.export.export(fn.jitted(*args), ...)(*args)``). ``args`` are the call's (arrays or
        ``jax.ShapeDtypeStruct``s); only their number and layout are read, not their values. ``check``: with the
        run-time value checks (a host callback, which ``__call__`` adds when the values cannot be read here);
        False, the default, is what ``lower`` compiles."""
        return self._jit(args, check)

    def lower(self, *args):
        return self.jitted(*args).lower(*args)

    def _checked_here(self, args) -> bool:
        """Checks the values of concrete arguments before jit, so that a bad call raises a plain ValueError;
        False when they cannot be read here (another host's arrays), and the jitted call checks at run time."""
        tokens, lengths = args[1], args[2]
        temperature = args[5] if len(args) > 5 else 1.0
        offsets = args[7] if len(args) > 7 else None
        if not all(getattr(x, "is_fully_addressable", True) and not validation.is_traced(x)
                   for x in (tokens, lengths, temperature, offsets)):
            return False
        tokens, lengths = (x if hasattr(x, "shape") else np.asarray(x) for x in (tokens, lengths))
        kw = self._fn.keywords
        check_sample_arguments(kw["max_new_tokens"], kw["top_p"], tokens, lengths)
        if offsets is not None:
            check_rank_offset(offsets, tokens.shape[0])
        check_sample_values(lengths, temperature, tokens.shape[1], greedy=kw["greedy"])
        return True

    def _cache_size(self) -> int:
        return sum(f._cache_size() for f in self._jitted.values())


def make_sample_fn(
    graphdef: nnx.GraphDef,
    *,
    max_new_tokens: int,
    top_p: float = 1.0,
    pad_id: int = 0,
    num_slots: int | None = None,
    prompt_tile: int | None = None,
    attention: str = "auto",
    greedy: bool = False,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> SampleFn:
    """``jax.jit`` of ``sample`` with the static arguments bound (a ``SampleFn``). The result is called as
    ``fn(state, prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, key, temperature, stop_tokens)``, optionally
    with an eighth argument ``rank_offset_P`` (each prompt's first rank in this call, default 0); shardings (if
    given) are for those seven arguments (``rank_offset_P`` is laid out like ``prompt_lengths_P``; or give eight)
    / the ``SampleOutput``. ``greedy=True``: argmax decoding (the temperature argument is ignored)."""
    fn = functools.partial(sample, graphdef, max_new_tokens=max_new_tokens, top_p=top_p, pad_id=pad_id,
                           num_slots=num_slots, prompt_tile=prompt_tile, attention=attention, greedy=greedy)
    return SampleFn(fn, in_shardings, out_shardings)
