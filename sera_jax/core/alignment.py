"""Gradient-alignment metrics over pytrees (docs/method.md §7)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jnp.ndarray


def _leaves(tree, name: str) -> list:
    """The tree's leaves, each a numeric array (a string or None in a parameter tree is a mistake, not a zero)."""
    leaves = jax.tree.leaves(tree)
    for leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:
            dtype = np.asarray(leaf).dtype
        if not (np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)):
            raise ValueError(f"{name}'s leaves must be numeric arrays, got a leaf of type {type(leaf).__name__}")
    return leaves


def _paired_leaves(a, b, names: tuple[str, str] = ("a", "b")) -> list[tuple]:
    """The leaves of two trees that must match: same structure (zip would silently drop the extra leaves) and
    shapes (broadcasting would silently inflate a dot product)."""
    both = " and ".join(names)
    if jax.tree.structure(a) != jax.tree.structure(b):
        raise ValueError(f"{both} must have the same tree structure, got {jax.tree.structure(a)} and "
                         f"{jax.tree.structure(b)}")
    pairs = list(zip(_leaves(a, names[0]), _leaves(b, names[1])))
    for x, y in pairs:
        if jnp.shape(x) != jnp.shape(y):
            raise ValueError(f"{both} must have the same shapes leaf by leaf, got {jnp.shape(x)} and {jnp.shape(y)}")
    return pairs


def tree_dot(a, b) -> Array:
    """Sum over leaves of <a, b> (trees of the same structure and shapes)."""
    return sum(jnp.vdot(x, y).real for x, y in _paired_leaves(a, b))


def tree_norm(a) -> Array:
    """``sqrt(<a, a>)`` over the whole tree."""
    return jnp.sqrt(sum(jnp.vdot(x, x).real for x in _leaves(a, "a")))


def cosine_similarity(a, b, eps: float = 1e-30) -> Array:
    """``<a, b> / (|a| |b|)`` over whole pytrees (0 if either is zero)."""
    dot = tree_dot(a, b)
    den = tree_norm(a) * tree_norm(b)
    return jnp.where(den > eps, dot / jnp.maximum(den, eps), 0.0)


def relative_error(estimate, target, eps: float = 1e-30) -> Array:
    """``|estimate - target| / |target|`` over whole pytrees."""
    _paired_leaves(estimate, target, ("estimate", "target"))
    diff = jax.tree.map(jnp.subtract, estimate, target)
    return tree_norm(diff) / jnp.maximum(tree_norm(target), eps)
