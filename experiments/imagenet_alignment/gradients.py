"""The model side of the analysis: inference-mode forward pass, the exact likelihood cotangent (the reference
``G*`` is its VJP), and gradients ``g = J^T c`` of chunks of M cotangents reduced on the device to their Gram
matrix and dot products with a target, so that no gradient leaves the device.

A chunk of M cotangents shares one forward pass (``jax.vjp``) and vmaps the backward pass; microbatches of the P
images add up (gradients are linear in the cotangent).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.model import logits_fn
from sera_jax import core

Array = jnp.ndarray

def _interleave(x: Array, microbatches: int) -> Array:
    """``(P, ...) -> (P / u, u, ...)`` with u = ``microbatches``: microbatch m holds rows ``j u + m``.

    With P split into contiguous per-device blocks, each of d devices keeps ``1/d`` of every microbatch, so the
    reshape moves no data and each microbatch is balanced across devices.
    """
    return x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])


def forward_stats(graphdef, params, batch_stats, x_PxHxWxC: Array, labels_P: Array, *, microbatches: int,
                  chunk: int):
    """Inference-mode ``probs_PxK``, ``p_P``, predicted classes, and a chunk whose row 0 is the exact cotangent."""
    x = _interleave(x_PxHxWxC, microbatches)

    def one(m):
        return jax.nn.softmax(logits_fn(graphdef, params, batch_stats, x[:, m]), axis=-1)

    probs_by_microbatch = jax.lax.map(one, jnp.arange(microbatches))  # (microbatches, P / microbatches, K)
    probs_PxK = jnp.swapaxes(probs_by_microbatch, 0, 1).reshape(x_PxHxWxC.shape[0], -1)
    exact_MxPxK = jnp.zeros((chunk,) + probs_PxK.shape, probs_PxK.dtype).at[0].set(
        E.exact_cotangent(probs_PxK, labels_P))
    return probs_PxK, E.success_probabilities(probs_PxK, labels_P), jnp.argmax(probs_PxK, axis=1), exact_MxPxK


def vjp_gradients(graphdef, params, batch_stats, x_PxHxWxC: Array, cot_MxPxK: Array, *, microbatches: int):
    """``g_m = J^T cot_m`` for each of the M cotangents: a params pytree with a leading axis M.

    Per microbatch: one forward (``jax.vjp``), M backward passes (``vmap`` of the VJP function); gradients
    are linear in the cotangent, so the microbatches' gradients add up.
    """
    x = _interleave(x_PxHxWxC, microbatches)
    # (P / microbatches, M, microbatches, K)
    cot_by_microbatch = jnp.swapaxes(_interleave(jnp.swapaxes(cot_MxPxK, 0, 1), microbatches), 1, 2)

    def grads_of(m):
        _, vjp_fn = jax.vjp(lambda p: logits_fn(graphdef, p, batch_stats, x[:, m]), params)
        return jax.vmap(lambda c: vjp_fn(c)[0])(jnp.swapaxes(cot_by_microbatch[:, :, m], 0, 1))

    if microbatches == 1:
        return grads_of(0)

    def body(acc, m):
        return jax.tree.map(jnp.add, acc, grads_of(m)), None

    zeros = jax.tree.map(lambda p: jnp.zeros((cot_MxPxK.shape[0],) + p.shape, p.dtype), params)
    return jax.lax.scan(body, zeros, jnp.arange(microbatches))[0]


def gram_and_dots(grads_M, target) -> tuple[Array, Array, Array]:
    """``(<g_c, g_d>)_{cd}``, ``(<g_c, target>)_c`` and ``|target|^2``, summed over the pytree's leaves."""
    flat_M = jnp.concatenate([g.reshape(g.shape[0], -1) for g in jax.tree.leaves(grads_M)], axis=1)
    flat_t = jnp.concatenate([t.reshape(-1) for t in jax.tree.leaves(target)])
    dot = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)  # no TF32 on GPUs
    return dot(flat_M, flat_M.T), dot(flat_M, flat_t), dot(flat_t, flat_t)


def chunk_gradients(graphdef, params, batch_stats, x_PxHxWxC, cot_MxPxK, target, *, microbatches: int):
    """(grads_M, Gram matrix M x M, dots with ``target`` (M,), ``|target|^2``) of one chunk of M cotangents."""
    grads_M = vjp_gradients(graphdef, params, batch_stats, x_PxHxWxC, cot_MxPxK, microbatches=microbatches)
    return (grads_M,) + gram_and_dots(grads_M, target)


def per_example_grad_norms(graphdef, params, batch_stats, x_PxHxWxC: Array, cot_PxcxK: Array) -> Array:
    """``|J_i^T cot_ij|`` for every example (prompt) i and each of its c cotangents (P x c), by per-example VJPs.

    Written for one example and vmapped (the per-example-gradient route).
    """

    def one(x_HxWxC, cot_cxK):
        _, vjp_fn = jax.vjp(lambda p: logits_fn(graphdef, p, batch_stats, x_HxWxC[None])[0], params)
        grads_c = jax.vmap(lambda c: vjp_fn(c)[0])(cot_cxK)
        return jax.vmap(core.tree_norm)(grads_c)

    return jax.lax.map(lambda args: one(*args), (x_PxHxWxC, cot_PxcxK), batch_size=16)
