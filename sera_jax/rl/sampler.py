"""Jitted autoregressive sampler with a KV cache over the flat rollout batch of SERA.md §6.

Inputs: P prompts ``prompt_tokens_PxT`` **left-padded** (real tokens end at column T - 1) with lengths
``prompt_lengths_P``, and a flat ``prompt_ids_B`` giving each of the B rollout rows its prompt. B is static;
how many rows each prompt gets changes freely from step to step without recompiling.

Why left padding: every row's prompt ends in the same cache slot T - 1, so decoding step t writes slot
``T + t`` for all rows at once (one ``dynamic_update_slice``), while RoPE positions stay per-row
(``length + t``). Right-padded prompts can be converted with ``left_align``.

Work plan: prefill the P prompts once (not once per rollout), then gather the prompt caches and last
logits to the B rows by ``prompt_ids_B``; decode all B rows in a ``lax.while_loop`` that stops when every
row has emitted a stop token or ``max_new_tokens`` is reached. Step t draws Gumbel noise of shape (B, V)
from ``fold_in(key, t)``: results are a function of (key, B, inputs), identical however B is sharded.

Outputs (``SampleOutput``): response tokens (stop token included, PAD after it), a mask, lengths,
``finished_B`` (ended with a stop token; False means truncated), and two log-probs per sampled token:

- ``logp_policy_BxR``: log pi_theta(token) under the raw policy, temperature 1, no top-p: the quantity the
  RL loss and importance ratios use;
- ``logp_sample_BxR``: log of the probability the token was actually drawn with (temperature and top-p
  applied); 0 for greedy decoding (temperature 0), whose draw is deterministic.

The model is handled functionally: pass ``nnx.split(model)`` (graphdef, state); ``nnx.merge`` happens
inside the jitted function. ``make_sample_fn`` jits with optional ``in_shardings``/``out_shardings``; shard
the flat B axis (``prompt_ids_B`` and the outputs) over the data axis and replicate the prompts and state.
With replicated prompts every device prefills all P prompts (P x T tokens, small next to B x R decoded
ones) and gathers its own rows locally; sharding P as well turns that gather into an all-gather.

Costs: the cache holds ``2 * n_layers * B * (T + R) * n_kv_heads * head_dim`` values and every step
attends over all T + R slots (static shapes), so for long responses sample B in micro-batches.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sera_jax.models.decoder import Decoder, KVCache, init_cache


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
    gumbel_V: jax.Array, logits_V: jax.Array, temperature: jax.Array, top_p: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One row's next token and its (policy, sampling) log-probs; temperature <= 0 means greedy.

    Gumbel-max: ``argmax(log q + g)`` with i.i.d. standard Gumbel noise ``gumbel_V`` is an exact draw from
    the sampling distribution q. Written for one row; vmapped over the batch."""
    logp_policy_V = jax.nn.log_softmax(logits_V.astype(jnp.float32))
    greedy = temperature <= 0
    logp_sample_V = sampling_logprobs(logits_V, jnp.where(greedy, 1.0, temperature), top_p)
    token = jnp.where(greedy, jnp.argmax(logits_V), jnp.argmax(logp_sample_V + gumbel_V))
    return token, logp_policy_V[token], jnp.where(greedy, 0.0, logp_sample_V[token])


def _gather_rows(cache_P: KVCache, prompt_ids_B: jax.Array, extra: int) -> KVCache:
    """Cache rows of each rollout's prompt, with ``extra`` empty slots appended for the response."""
    def grow(x_PxAxSxD):
        rows = jnp.take(x_PxAxSxD, prompt_ids_B, axis=0)
        return jnp.pad(rows, ((0, 0), (0, 0), (0, extra), (0, 0)))

    return jax.tree.map(grow, cache_P)


def sample(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens_PxT: jax.Array,
    prompt_lengths_P: jax.Array,
    prompt_ids_B: jax.Array,
    key: jax.Array,
    temperature: jax.Array | float = 1.0,
    stop_tokens: jax.Array | tuple[int, ...] = (),
    *,
    max_new_tokens: int,
    top_p: float = 1.0,
    pad_id: int = 0,
) -> SampleOutput:
    """Sample ``max_new_tokens`` (at most) for each of the B rollout rows; see the module docstring.

    ``prompt_tokens_PxT`` must be left-padded; ``prompt_lengths_P`` in [1, T]; ``stop_tokens`` a (possibly
    empty) list of ids that end a row (kept as the row's last token). ``temperature`` may be traced;
    ``max_new_tokens``, ``top_p`` and ``pad_id`` are static.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got max_new_tokens={max_new_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got top_p={top_p}")
    if prompt_tokens_PxT.ndim != 2 or prompt_lengths_P.shape != prompt_tokens_PxT.shape[:1]:
        raise ValueError(
            f"prompt_tokens_PxT {prompt_tokens_PxT.shape} and prompt_lengths_P {prompt_lengths_P.shape} "
            "must be (P, T) and (P,)"
        )
    model: Decoder = nnx.merge(graphdef, state)
    n_prompts, prompt_len = prompt_tokens_PxT.shape
    batch = prompt_ids_B.shape[0]
    stop_ids = jnp.asarray(stop_tokens, jnp.int32).reshape(-1)
    temperature = jnp.asarray(temperature, jnp.float32)

    # Prefill each prompt once.
    pad_P = (prompt_len - prompt_lengths_P).astype(jnp.int32)
    col_T = jnp.arange(prompt_len)
    positions_PxT = jnp.maximum(col_T[None, :] - pad_P[:, None], 0)
    cache_P = init_cache(model.cfg, n_prompts, prompt_len)
    # Left padding puts every prompt's last token in the last column: only its logits are needed. A
    # prompt's valid slots are [pad, T).
    logits_Px1xV, cache_P = model.decode(prompt_tokens_PxT, positions_PxT, cache_P, 0, pad_P, last_only=True)

    # Fan out to the rollout rows.
    cache = _gather_rows(cache_P, prompt_ids_B, max_new_tokens)
    logits_BxV = jnp.take(logits_Px1xV[:, 0], prompt_ids_B, axis=0)
    lengths_B = jnp.take(prompt_lengths_P, prompt_ids_B)
    # Row b's valid slots: its prompt [T - length, T), then the response slots written so far (causality
    # hides the unwritten ones), one span starting at T - length.
    kv_start_B = (prompt_len - lengths_B).astype(jnp.int32)
    sample_rows = jax.vmap(sample_token, in_axes=(0, 0, None, None))

    def draw(t, logits_BxV, done_B, out):
        """Sample step t for every row and record it (rows already done record PAD, mask 0)."""
        tokens_BxR, logp_pol_BxR, logp_smp_BxR = out
        # One threefry call per step for the whole batch (per-row keys would cost one each, mostly at
        # compile time); threefry is partitionable, so the noise does not depend on the sharding.
        gumbel_BxV = jax.random.gumbel(jax.random.fold_in(key, t), logits_BxV.shape, jnp.float32)
        token_B, logp_pol_B, logp_smp_B = sample_rows(gumbel_BxV, logits_BxV, temperature, top_p)
        token_B = jnp.where(done_B, pad_id, token_B).astype(jnp.int32)

        def write(buf, col):
            return jax.lax.dynamic_update_slice(buf, col[:, None], (0, t))

        out = (
            write(tokens_BxR, token_B),
            write(logp_pol_BxR, jnp.where(done_B, 0.0, logp_pol_B)),
            write(logp_smp_BxR, jnp.where(done_B, 0.0, logp_smp_B)),
        )
        active_B = ~done_B
        return token_B, active_B, done_B | jnp.isin(token_B, stop_ids), out

    def body(carry):
        t, token_B, cache, done_B, n_gen_B, out = carry
        # Feed the token drawn at step t - 1 (slot prompt_len + t - 1, position length + t - 1) ...
        slot = prompt_len + t - 1
        positions_Bx1 = (lengths_B + t - 1)[:, None]
        logits_Bx1xV, cache = model.decode(token_B[:, None], positions_Bx1, cache, slot, kv_start_B)
        # ... then draw step t.
        token_B, active_B, done_B, out = draw(t, logits_Bx1xV[:, 0], done_B, out)
        return t + 1, token_B, cache, done_B, n_gen_B + active_B, out

    def cond(carry):
        t, done_B = carry[0], carry[3]
        return (t < max_new_tokens) & ~jnp.all(done_B)

    out = (
        jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
        jnp.zeros((batch, max_new_tokens), jnp.float32),
        jnp.zeros((batch, max_new_tokens), jnp.float32),
    )
    done_B = jnp.zeros((batch,), bool)
    token_B, active_B, done_B, out = draw(0, logits_BxV, done_B, out)
    carry = (jnp.int32(1), token_B, cache, done_B, active_B.astype(jnp.int32), out)
    _, _, _, done_B, n_gen_B, (tokens_BxR, logp_pol_BxR, logp_smp_BxR) = jax.lax.while_loop(cond, body, carry)
    mask_BxR = jnp.arange(max_new_tokens)[None, :] < n_gen_B[:, None]
    return SampleOutput(tokens_BxR, mask_BxR, n_gen_B, done_B, logp_pol_BxR, logp_smp_BxR)


def make_sample_fn(
    graphdef: nnx.GraphDef,
    *,
    max_new_tokens: int,
    top_p: float = 1.0,
    pad_id: int = 0,
    in_shardings: Any = None,
    out_shardings: Any = None,
):
    """``jax.jit`` of ``sample`` with the static arguments bound. The result is called as
    ``fn(state, prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, key, temperature, stop_tokens)``;
    shardings (if given) are for those seven arguments / the ``SampleOutput``."""
    fn = functools.partial(sample, graphdef, max_new_tokens=max_new_tokens, top_p=top_p, pad_id=pad_id)
    kwargs = {}
    if in_shardings is not None:
        kwargs["in_shardings"] = in_shardings
    if out_shardings is not None:
        kwargs["out_shardings"] = out_shardings
    return jax.jit(fn, **kwargs)
