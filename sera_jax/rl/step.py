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

from sera_jax.models.decoder import positions_from_valid, token_logprobs


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


def response_logprobs(graphdef: nnx.GraphDef, params: Any, batch: SequenceBatch) -> jax.Array:
    """``log pi(response token t | prefix)`` for the N response positions: (B, N) float32."""
    model = nnx.merge(graphdef, params)
    positions = positions_from_valid(batch.valid_BxL)
    logp_BxL = token_logprobs(model, batch.tokens_BxL, positions, batch.valid_BxL)
    return logp_BxL[:, batch.prompt_len:]


def _apply(tx, state: TrainState, grads) -> TrainState:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1)


def sft_step(state: TrainState, batch: SequenceBatch, *, graphdef: nnx.GraphDef,
             tx: optax.GradientTransformation) -> tuple[TrainState, dict[str, jax.Array]]:
    """Supervised step: ``L = -sum_bt w_bt log pi(y_bt | prefix)`` (weights give the answer-token mean)."""

    def loss_fn(params):
        logp = response_logprobs(graphdef, params, batch)
        return -jnp.sum(batch.weights_BxR * logp)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return _apply(tx, state, grads), {"loss": loss, "grad_norm": optax.global_norm(grads)}


def policy_gradient_update(state: TrainState, batch: SequenceBatch, advantages_B: jax.Array, *,
                           graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                           microbatches: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
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
        logp = response_logprobs(graphdef, params, part)
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


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
    """``sft_step`` jitted with the model and optimizer bound, the state donated: ``fn(state, batch)``."""
    return jax.jit(functools.partial(sft_step, graphdef=graphdef, tx=tx), donate_argnums=0)


def make_policy_gradient_update(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, microbatches: int = 1):
    """``policy_gradient_update`` jitted with the model, optimizer and slicing bound, the state donated:
    ``fn(state, batch, advantages_B)``. Built once per run (or once for runs that share an optimizer)."""
    return jax.jit(functools.partial(policy_gradient_update, graphdef=graphdef, tx=tx, microbatches=microbatches),
                   donate_argnums=0)


def sequence_batch(prompt_tokens_BxT: jax.Array, prompt_lengths_B: jax.Array, response_BxR: jax.Array,
                   response_mask_BxR: jax.Array, weights_BxR: jax.Array) -> SequenceBatch:
    """Joins left-padded prompts and right-padded responses into one ``SequenceBatch``."""
    prompt_len = prompt_tokens_BxT.shape[1]
    prompt_valid = jnp.arange(prompt_len)[None, :] >= (prompt_len - prompt_lengths_B)[:, None]
    tokens = jnp.concatenate([prompt_tokens_BxT, response_BxR], axis=1).astype(jnp.int32)
    valid = jnp.concatenate([prompt_valid, response_mask_BxR.astype(bool)], axis=1)
    return SequenceBatch(tokens, valid, weights_BxR.astype(jnp.float32))
