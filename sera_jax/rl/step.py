"""Train state and the jitted update steps shared by every decoder task: SFT and the RL policy gradient.

Sequences are ``[prompt (left-padded to T) | response (R tokens, right-padded)]`` of length L = T + R. The RL
update takes them in one of two layouts with the same loss:

- ``SequenceBatch``: every rollout joined to its own copy of the prompt (B rows of L tokens);
- ``SharedPromptBatch``: each of the P prompts once and each rollout's response (``prompt_ids_B`` says whose).
  The update runs each prompt through the model once, keeps its keys/values and last hidden state (the
  ``Prefix``), and runs every response against its prompt's cached keys/values: B x R + P x T tokens through
  the model instead of B x (T + R). Gradients reach the prompt pass through the prefix (its cotangent is
  summed over the rollouts and micro-batches, then pulled back once). RL batches hold several rollouts per
  prompt (SERA gives some prompts many), so this is the trainer's layout (``rl.share_prompts``).

The model is handled functionally: ``graphdef`` is static, the ``TrainState`` pytree carries the
parameters and optimizer state (checkpointable, shardable, donated to the step).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sera_jax.models.decoder import KVCache, gather_logprobs, init_cache, positions_from_valid


class TrainState(NamedTuple):
    params: Any  # nnx.State of the model's parameters
    opt_state: Any
    step: jax.Array  # int32 scalar


class SequenceBatch(NamedTuple):
    """A batch of full sequences with per-token loss weights on the response part."""

    tokens_BxL: jax.Array  # int32 [prompt | response]
    valid_BxL: jax.Array  # bool: real tokens (prompt and generated ones)
    weights_BxR: jax.Array  # float32 loss weight of each response token (0 on padding)

    @property
    def prompt_len(self) -> int:
        """T, static: L - R from the shapes."""
        return self.tokens_BxL.shape[1] - self.weights_BxR.shape[1]


class RolloutRows(NamedTuple):
    """The per-rollout rows of a ``SharedPromptBatch`` (what micro-batches slice)."""

    prompt_ids_B: jax.Array  # int32 prompt of each rollout
    response_BxR: jax.Array  # int32 response tokens (right-padded)
    response_mask_BxR: jax.Array  # bool: generated tokens
    weights_BxR: jax.Array  # float32 loss weight of each response token (0 on padding)


class SharedPromptBatch(NamedTuple):
    """An RL update batch that stores each prompt once (see the module docstring)."""

    prompt_tokens_PxT: jax.Array  # int32, left-padded
    prompt_lengths_P: jax.Array  # int32 in [1, T]
    rows: RolloutRows


class Prefix(NamedTuple):
    """The prompt pass of a ``SharedPromptBatch``: every layer's keys/values of the P prompts ``(P, M, T, D)``
    and the final hidden state of each prompt's last token ``(P, D)`` (it predicts the first response token)."""

    cache: KVCache
    last_hidden_PxD: jax.Array


def make_optimizer(learning_rate: float | optax.Schedule, *, b1: float = 0.9, b2: float = 0.999,
                   weight_decay: float = 0.0, grad_clip: float | None = 1.0) -> optax.GradientTransformation:
    """AdamW with optional global-norm clipping (MaxRL's optimiser for mazes and math). Build it once per run
    and bind it where the step is built (``make_sft_step``, ``make_policy_gradient_update``)."""
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def create_train_state(model: nnx.Module, tx: optax.GradientTransformation) -> tuple[nnx.GraphDef, TrainState]:
    graphdef, params = nnx.split(model)
    params = jax.tree.map(jnp.copy, params)  # the train step donates its state: never alias the model's arrays
    return graphdef, TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))


def head_logprobs(model, h_BxRxD: jax.Array, targets_BxR: jax.Array, chunk_size: int = 0) -> jax.Array:
    """``log softmax(h @ head)[target]`` (B, R) float32, ``chunk_size`` positions at a time under
    ``jax.checkpoint`` when ``chunk_size > 0``: neither pass then holds the ``(B, R, V)`` logits at once (a
    150k-token vocabulary at 2,048 response tokens would need 1.2 GiB per rollout in float32)."""
    head_DxV = model.head_matrix()

    def chunk_logprobs(h, targets):
        return gather_logprobs((h @ head_DxV).astype(jnp.float32), targets)

    b, r = targets_BxR.shape
    if not chunk_size or chunk_size >= r:
        return chunk_logprobs(h_BxRxD, targets_BxR)
    n = -(-r // chunk_size)
    pad = n * chunk_size - r
    h = jnp.pad(h_BxRxD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk_size, -1).swapaxes(0, 1)
    tg = jnp.pad(targets_BxR, ((0, 0), (0, pad))).reshape(b, n, chunk_size).swapaxes(0, 1)
    logp = jax.lax.map(jax.checkpoint(lambda args: chunk_logprobs(*args)), (h, tg))  # (n, B, chunk)
    return logp.swapaxes(0, 1).reshape(b, -1)[:, :r]


def response_logprobs(graphdef: nnx.GraphDef, params: Any, batch: SequenceBatch,
                      chunk_size: int = 0) -> jax.Array:
    """``log pi(response token t | prefix)`` for the R response positions: (B, R) float32; 0 where the
    token or its predecessor is padding. Only the R positions that predict response tokens go through the
    output projection (``head_logprobs``, ``chunk_size`` at a time)."""
    model = nnx.merge(graphdef, params)
    valid_BxL = batch.valid_BxL.astype(bool)
    h_BxLxD = model.hidden_states(batch.tokens_BxL, positions_from_valid(valid_BxL), valid_BxL)
    t = batch.prompt_len
    h_BxRxD = h_BxLxD[:, t - 1:-1]  # position t - 1 + r predicts response token r
    logp_BxR = head_logprobs(model, h_BxRxD, batch.tokens_BxL[:, t:], chunk_size)
    scored_BxR = valid_BxL[:, t:] & valid_BxL[:, t - 1:-1]
    return jnp.where(scored_BxR, logp_BxR, 0.0)


def prompt_prefix(graphdef: nnx.GraphDef, params: Any, prompt_tokens_PxT: jax.Array,
                  prompt_lengths_P: jax.Array) -> Prefix:
    """The prompt pass of a prompt-shared update: each left-padded prompt once through the model."""
    model = nnx.merge(graphdef, params)
    n_prompts, t = prompt_tokens_PxT.shape
    pad_P = (t - prompt_lengths_P).astype(jnp.int32)
    positions_PxT = jnp.maximum(jnp.arange(t)[None, :] - pad_P[:, None], 0)
    h_PxTxD, cache = model.extend_hidden(prompt_tokens_PxT, positions_PxT, init_cache(model.cfg, n_prompts, t), 0,
                                         pad_P)
    return Prefix(cache, h_PxTxD[:, -1])


def shared_response_logprobs(graphdef: nnx.GraphDef, params: Any, prefix: Prefix, prompt_lengths_P: jax.Array,
                             rows: RolloutRows, chunk_size: int = 0) -> jax.Array:
    """``response_logprobs`` of the joined sequences, from the prompt pass: response token 0 is predicted by
    the prompt's last hidden state, token r > 0 by response position r - 1, which attends to its prompt's
    cached keys/values (gathered to the rollout's row) and the response before it. (B, R) float32."""
    model = nnx.merge(graphdef, params)
    ids_B = rows.prompt_ids_B
    t, r = prefix.cache.k[0].shape[2], rows.response_BxR.shape[1]
    h_BxRxD = jnp.take(prefix.last_hidden_PxD, ids_B, axis=0)[:, None]
    if r > 1:
        def grow(x_PxMxTxD):  # the rollout's copy of its prompt's slots, then R - 1 response slots
            return jnp.pad(jnp.take(x_PxMxTxD, ids_B, axis=0), ((0, 0), (0, 0), (0, r - 1), (0, 0)))

        cache_B = jax.tree.map(grow, prefix.cache)
        lengths_B = jnp.take(prompt_lengths_P, ids_B).astype(jnp.int32)
        positions_BxQ = lengths_B[:, None] + jnp.arange(r - 1)[None, :]
        h_rest, _ = model.extend_hidden(rows.response_BxR[:, :-1], positions_BxQ, cache_B, t, t - lengths_B)
        h_BxRxD = jnp.concatenate([h_BxRxD, h_rest], axis=1)
    logp_BxR = head_logprobs(model, h_BxRxD, rows.response_BxR, chunk_size)
    mask = rows.response_mask_BxR.astype(bool)
    scored_BxR = mask & jnp.pad(mask[:, :-1], ((0, 0), (1, 0)), constant_values=True)
    return jnp.where(scored_BxR, logp_BxR, 0.0)


def _apply(tx, state: TrainState, grads) -> TrainState:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1)


def sft_step(state: TrainState, batch: SequenceBatch, *, graphdef: nnx.GraphDef,
             tx: optax.GradientTransformation, logprob_chunk: int = 0) -> tuple[TrainState, dict[str, jax.Array]]:
    """Supervised step: ``L = -sum_bt w_bt log pi(y_bt | prefix)`` (weights give the answer-token mean)."""

    def loss_fn(params):
        logp = response_logprobs(graphdef, params, batch, logprob_chunk)
        return -jnp.sum(batch.weights_BxR * logp)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return _apply(tx, state, grads), {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def policy_gradient_update(state: TrainState, batch: SequenceBatch | SharedPromptBatch, advantages_B: jax.Array, *,
                           graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                           microbatches: int = 1, logprob_chunk: int = 0) -> tuple[TrainState, dict[str, jax.Array]]:
    """On-policy policy-gradient step: ``L = -sum_bt w_bt A_b log pi(y_bt | prefix)``.

    One update per batch of fresh samples (MaxRL's setting), so the importance ratio is 1 and the
    surrogate's gradient is the estimator ``sum_b w_b A_b grad log pi(y_b)`` of docs/method.md §2 and §4.

    ``microbatches = M > 1`` accumulates the gradient over M slices of the rollouts (rows m, m + M, m + 2M,
    ..., so every device's shard of the flat layout contributes to every slice) in a loop, holding the
    activations of B / M rollouts at a time. The weights ``w_bt`` are already normalised over the whole
    batch, so the summed slice losses are the full loss and the update is the same (up to float summation
    order). B must be divisible by M. A ``SharedPromptBatch`` runs its prompt pass once, before the slices;
    the slices accumulate the prefix's cotangent, pulled back through the prompt pass once at the end.
    """
    shared = isinstance(batch, SharedPromptBatch)
    if shared:
        prefix, prefix_vjp = jax.vjp(
            lambda params: prompt_prefix(graphdef, params, batch.prompt_tokens_PxT, batch.prompt_lengths_P),
            state.params)
        rows = batch.rows

        def logprobs(params, prefix, part):
            return shared_response_logprobs(graphdef, params, prefix, batch.prompt_lengths_P, part, logprob_chunk)
    else:
        prefix, rows = None, batch

        def logprobs(params, prefix, part):
            return response_logprobs(graphdef, params, part, logprob_chunk)

    def loss_fn(params, prefix, part, adv_B: jax.Array):
        logp = logprobs(params, prefix, part)
        return -jnp.sum(part.weights_BxR * adv_B[:, None] * logp), logp

    def slice_terms(params, prefix, part, adv_B: jax.Array):
        (loss, logp), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(params, prefix, part, adv_B)
        mask = part.weights_BxR != 0
        return grads, loss, -jnp.sum(jnp.where(mask, logp, 0.0)), jnp.sum(mask)

    num_rows = advantages_B.shape[0]
    if microbatches == 1:
        grads, loss, neg_logp, tokens = slice_terms(state.params, prefix, rows, advantages_B)
    else:
        if num_rows % microbatches:
            raise ValueError(f"policy_gradient_update: {num_rows} rollouts do not split into microbatches={microbatches}")
        # (B, ...) -> (B / M, M, ...); slice m is [:, m].
        parts = jax.tree.map(lambda x: x.reshape(num_rows // microbatches, microbatches, *x.shape[1:]),
                             (rows, advantages_B))

        def body(m, carry):
            part, adv_B = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, m, axis=1, keepdims=False), parts)
            terms = slice_terms(state.params, prefix, part, adv_B)
            return jax.tree.map(jnp.add, carry, terms)

        zeros = ((jax.tree.map(jnp.zeros_like, state.params), jax.tree.map(jnp.zeros_like, prefix)),
                 jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
        grads, loss, neg_logp, tokens = jax.lax.fori_loop(0, microbatches, body, zeros)
    grads, prefix_grads = grads
    if shared:
        grads = jax.tree.map(jnp.add, grads, prefix_vjp(prefix_grads)[0])
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "neg_logp_per_token": neg_logp / jnp.maximum(tokens, 1)}
    return _apply(tx, state, grads), metrics


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, logprob_chunk: int = 0):
    """``sft_step`` jitted with the model and optimizer bound, the state donated: ``fn(state, batch)``."""
    return jax.jit(functools.partial(sft_step, graphdef=graphdef, tx=tx, logprob_chunk=logprob_chunk),
                   donate_argnums=0)


def make_policy_gradient_update(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, microbatches: int = 1,
                                logprob_chunk: int = 0):
    """``policy_gradient_update`` jitted with the model, optimizer and memory knobs bound, the state donated:
    ``fn(state, batch, advantages_B)``. Built once per run (or once for runs that share an optimizer)."""
    return jax.jit(functools.partial(policy_gradient_update, graphdef=graphdef, tx=tx, microbatches=microbatches,
                                     logprob_chunk=logprob_chunk), donate_argnums=0)


def sequence_batch(prompt_tokens_BxT: jax.Array, prompt_lengths_B: jax.Array, response_BxR: jax.Array,
                   response_mask_BxR: jax.Array, weights_BxR: jax.Array) -> SequenceBatch:
    """Joins left-padded prompts and right-padded responses into one ``SequenceBatch``."""
    prompt_len = prompt_tokens_BxT.shape[1]
    prompt_valid = jnp.arange(prompt_len)[None, :] >= (prompt_len - prompt_lengths_B)[:, None]
    tokens = jnp.concatenate([prompt_tokens_BxT, response_BxR], axis=1).astype(jnp.int32)
    valid = jnp.concatenate([prompt_valid, response_mask_BxR.astype(bool)], axis=1)
    return SequenceBatch(tokens, valid, weights_BxR.astype(jnp.float32))
