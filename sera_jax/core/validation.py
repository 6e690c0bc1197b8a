"""Input checks shared by the core functions.

Every public function checks its input where it is entered:

* shapes, dtypes and static arguments (budgets, bounds, names) always, at trace time too: a ``ValueError``;
* values of concrete (eager) arrays in NumPy: a ``ValueError`` naming the problem and the offending values;
* values of traced arrays (under ``jit``, ``vmap``, ``grad``) with ``checkify.debug_check``: inside
  ``jax.experimental.checkify.checkify`` the check runs and ``err.throw()`` raises a ``JaxRuntimeError`` with the
  same message; under plain ``jit`` it is skipped. A compiled program cannot stop with a Python error: the host
  callback that could only surfaces as ``INTERNAL: CpuCallback error`` wrapped around a traceback, and it would
  sync with the host in every hot loop. So::

      err, counts = checkify.checkify(jax.jit(lambda p: sera_jax.allocate(p, 32, n_max=16)))(p_hat)
      err.throw()  # ValueError's message, e.g. "p_hat must be probabilities in [0, 1]; found NaN ..."

``check=False`` (where a function takes it) drops the value checks, eager or traced.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def is_traced(*xs) -> bool:
    """True if any argument is a JAX tracer (we are inside jit/vmap/grad)."""
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def _shown(values: np.ndarray, limit: int = 5) -> str:
    """The first offending values, as a user would type them."""
    values = np.asarray(values).ravel()
    shown = ", ".join(f"{v:g}" if np.issubdtype(values.dtype, np.floating) else str(v) for v in values[:limit])
    return f"[{shown}{', ...' if values.size > limit else ''}]"


def require(x, is_bad: Callable, message: str, *, check: bool = True) -> None:
    """ValueError(``message``; got <the bad values>) if any entry of ``is_bad(x)`` is true.

    ``is_bad`` maps an array to a boolean mask with operators only, so one function serves NumPy (concrete ``x``)
    and jnp (traced ``x``: a ``checkify.debug_check``, see the module docstring)."""
    if not check:
        return
    if is_traced(x):
        checkify.debug_check(~jnp.any(is_bad(jnp.asarray(x))), message)
        return
    x = np.asarray(x)
    bad = np.broadcast_to(np.asarray(is_bad(x)), x.shape)
    if np.any(bad):
        raise ValueError(f"{message}; got {_shown(x[bad])}")


def require_true(ok, message: str) -> None:
    """ValueError(``message``) unless ``ok`` (a bool, or a traced boolean scalar: checked as in :func:`require`)."""
    if is_traced(ok):
        checkify.debug_check(ok, message)
    elif not bool(np.all(ok)):
        raise ValueError(message)


def describe_probabilities(name: str) -> str:
    return f"{name} must be probabilities in [0, 1]"


def check_probabilities_any(p, name: str, check: bool = True) -> None:
    """``p`` finite and in [0, 1]: eagerly a ValueError naming what was found; traced, a checkify check."""
    if not check:
        return
    if not is_traced(p):
        p = np.asarray(p)
        if not np.issubdtype(p.dtype, np.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {p.dtype}")
    problems = (("NaN or infinite values", lambda x: ~(x == x) | (abs(x) == np.inf)),
                ("values below 0", lambda x: x < 0), ("values above 1", lambda x: x > 1))
    if is_traced(p):
        for what, is_bad in problems:
            checkify.debug_check(~jnp.any(is_bad(p)), f"{describe_probabilities(name)}; found {what}")
        return
    found = [what for what, is_bad in problems if np.any(is_bad(p))]
    if found:
        raise ValueError(f"{describe_probabilities(name)}; found " + " and ".join(found))


def check_probabilities(p, name: str = "p") -> None:
    """Eager check: raises ValueError if ``p`` has NaN/inf or values outside [0, 1]."""
    check_probabilities_any(np.asarray(p), name)


def check_rank(x, rank: int, name: str) -> None:
    if np.ndim(x) != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {np.shape(x)}")


def check_int(value, name: str, minimum: int | None = None) -> int:
    """Requires a Python/NumPy integer (a static value); returns it as int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a static Python integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_real(value, name: str, low: float, high: float) -> float:
    """Requires a static Python number in [low, high] (NaN refused); returns it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a static Python number, got {value!r}")
    if not low <= float(value) <= high:
        raise ValueError(f"{name} must lie in [{low:g}, {high:g}], got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------------------------
# The flat layout (docs/method.md §6) and rollout counts, shared by layout, advantages, weights and metrics.


def check_num_prompts(num_prompts) -> int:
    return check_int(num_prompts, "num_prompts", minimum=1)


def check_prompt_ids(prompt_ids_B, num_prompts: int, check: bool = True) -> jnp.ndarray:
    """Shape (B,), integers in [0, num_prompts): an id outside would be dropped by a segment sum and weigh inf."""
    prompt_ids_B = jnp.asarray(prompt_ids_B)
    if prompt_ids_B.ndim != 1:
        raise ValueError(f"prompt_ids_B must have shape (B,), got {prompt_ids_B.shape}")
    if not jnp.issubdtype(prompt_ids_B.dtype, jnp.integer):
        raise ValueError(f"prompt_ids_B must be an integer array, got dtype {prompt_ids_B.dtype}")
    require(prompt_ids_B, lambda ids: (ids < 0) | (ids >= num_prompts),
            f"prompt_ids_B must lie in [0, num_prompts) = [0, {num_prompts})", check=check)
    return prompt_ids_B


def check_mask(mask_B, name: str, shape: tuple, check: bool = True) -> jnp.ndarray:
    """A 0/1 (or bool) mask of ``shape``."""
    mask_B = jnp.asarray(mask_B)
    if mask_B.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (one 0/1 entry a rollout), got {mask_B.shape}")
    require(mask_B, lambda m: (m != 0) & (m != 1), f"{name} must be a 0/1 mask", check=check)
    return mask_B


def check_outcomes(successes_P, counts_P, check: bool = True) -> None:
    """``counts_P >= 0`` and ``0 <= successes_P <= counts_P`` (per prompt: K successes of N rollouts)."""
    require(counts_P, lambda n: ~(n >= 0), "counts_P must be >= 0 (rollouts per prompt)", check=check)
    if not check:
        return
    if is_traced(successes_P, counts_P):
        k, n = jnp.asarray(successes_P), jnp.asarray(counts_P)
        checkify.debug_check(jnp.all((k >= 0) & (k <= n)), "successes_P must lie in [0, counts_P]")
        return
    k, n = np.broadcast_arrays(np.asarray(successes_P, np.float64), np.asarray(counts_P, np.float64))
    bad = ~((k >= 0) & (k <= n))
    if np.any(bad):
        raise ValueError(f"successes_P must lie in [0, counts_P]; got successes {_shown(k[bad])} of counts "
                         f"{_shown(n[bad])}")


def is_bad_count(n):
    """Rollout counts are 0 (no rollouts) or >= 1 (a group); NaN is bad too (it fails both comparisons)."""
    return ~((n == 0) | (n >= 1))


COUNTS_MESSAGE = "rollout counts n must be 0 (no rollouts) or >= 1"
