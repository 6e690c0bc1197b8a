"""Gradient-alignment metrics over pytrees (docs/method.md §7)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jnp.ndarray


def tree_dot(a, b) -> Array:
    """Sum over leaves of <a, b>."""
    return sum(jnp.vdot(x, y).real for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def tree_norm(a) -> Array:
    return jnp.sqrt(tree_dot(a, a))


def cosine_similarity(a, b, eps: float = 1e-30) -> Array:
    """``<a, b> / (|a| |b|)`` over whole pytrees (0 if either is zero)."""
    den = tree_norm(a) * tree_norm(b)
    return jnp.where(den > eps, tree_dot(a, b) / jnp.maximum(den, eps), 0.0)


def relative_error(estimate, target, eps: float = 1e-30) -> Array:
    """``|estimate - target| / |target|`` over whole pytrees."""
    diff = jax.tree.map(jnp.subtract, estimate, target)
    return tree_norm(diff) / jnp.maximum(tree_norm(target), eps)
