"""Train state and the jitted update steps shared by every decoder task: SFT and the RL policy gradient.

Sequences are ``[prompt (left-padded to T) | response (R tokens, right-padded)]`` of length L = T + R.
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

from sera_jax.models.decoder import gather_logprobs, positions_from_valid


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


def response_logprobs(graphdef: nnx.GraphDef, params: Any, batch: SequenceBatch,
                      chunk_size: int = 0) -> jax.Array:
    """``log pi(response token t | prefix)`` for the R response positions: (B, R) float32; 0 where the
    token or its predecessor is padding.

    Only the R positions that predict response tokens go through the output projection, and with
    ``chunk_size > 0`` they do so ``chunk_size`` at a time under ``jax.checkpoint``: neither pass then holds
    the ``(B, R, V)`` logits at once (a 150k-token vocabulary at 2,048 response tokens would need 1.2 GiB per
    rollout in float32). The result is the same.
    """
    model = nnx.merge(graphdef, params)
    valid_BxL = batch.valid_BxL.astype(bool)
    h_BxLxD = model.hidden_states(batch.tokens_BxL, positions_from_valid(valid_BxL), valid_BxL)
    t = batch.prompt_len
    h_BxRxD = h_BxLxD[:, t - 1:-1]  # position t - 1 + r predicts response token r
    targets_BxR = batch.tokens_BxL[:, t:]
    head_DxV = model.head_matrix()

    def chunk_logprobs(h, targets):
        return gather_logprobs((h @ head_DxV).astype(jnp.float32), targets)

    b, r = targets_BxR.shape
    if not chunk_size or chunk_size >= r:
        logp_BxR = chunk_logprobs(h_BxRxD, targets_BxR)
    else:
        n = -(-r // chunk_size)
        pad = n * chunk_size - r
        h = jnp.pad(h_BxRxD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk_size, -1).swapaxes(0, 1)
        tg = jnp.pad(targets_BxR, ((0, 0), (0, pad))).reshape(b, n, chunk_size).swapaxes(0, 1)
        logp = jax.lax.map(jax.checkpoint(lambda args: chunk_logprobs(*args)), (h, tg))  # (n, B, chunk)
        logp_BxR = logp.swapaxes(0, 1).reshape(b, -1)[:, :r]
    scored_BxR = valid_BxL[:, t:] & valid_BxL[:, t - 1:-1]
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
    return _apply(tx, state, grads), {"loss": loss, "grad_norm": optax.global_norm(grads)}


def policy_gradient_update(state: TrainState, batch: SequenceBatch, advantages_B: jax.Array, *,
                           graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                           microbatches: int = 1, logprob_chunk: int = 0) -> tuple[TrainState, dict[str, jax.Array]]:
    """On-policy policy-gradient step: ``L = -sum_bt w_bt A_b log pi(y_bt | prefix)``.

    One update per batch of fresh samples (MaxRL's setting), so the importance ratio is 1 and the
    surrogate's gradient is the estimator ``sum_b w_b A_b grad log pi(y_b)`` of SERA.md §2 and §4.

    ``microbatches = M > 1`` accumulates the gradient over M slices of the batch (rows m, m + M, m + 2M, ...,
    so every device's shard of the flat layout contributes to every slice) in a loop, holding the
    activations of B / M rollouts at a time. The weights ``w_bt`` are already normalised over the whole
    batch, so the summed slice losses are the full loss and the update is the same (up to float summation
    order). B must be divisible by M.
    """

    def loss_fn(params, part: SequenceBatch, adv_B: jax.Array):
        logp = response_logprobs(graphdef, params, part, logprob_chunk)
        return -jnp.sum(part.weights_BxR * adv_B[:, None] * logp), logp

    def slice_terms(params, part: SequenceBatch, adv_B: jax.Array):
        (loss, logp), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, part, adv_B)
        mask = part.weights_BxR != 0
        return grads, loss, -jnp.sum(jnp.where(mask, logp, 0.0)), jnp.sum(mask)

    num_rows = advantages_B.shape[0]
    if microbatches == 1:
        grads, loss, neg_logp, tokens = slice_terms(state.params, batch, advantages_B)
    else:
        if num_rows % microbatches:
            raise ValueError(f"policy_gradient_update: {num_rows} rollouts do not split into microbatches={microbatches}")
        # (B, ...) -> (B / M, M, ...); slice m is [:, m].
        parts = jax.tree.map(lambda x: x.reshape(num_rows // microbatches, microbatches, *x.shape[1:]),
                             (batch, advantages_B))

        def body(m, carry):
            part, adv_B = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, m, axis=1, keepdims=False), parts)
            terms = slice_terms(state.params, part, adv_B)
            return jax.tree.map(jnp.add, carry, terms)

        zeros = (jax.tree.map(jnp.zeros_like, state.params), jnp.zeros((), jnp.float32),
                 jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
        grads, loss, neg_logp, tokens = jax.lax.fori_loop(0, microbatches, body, zeros)
    metrics = {"loss": loss, "grad_norm": optax.global_norm(grads),
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
