"""Input checks shared by the core functions.

Concrete (eager) inputs are checked in NumPy and raise ``ValueError`` naming the problem. Traced inputs
cannot raise at trace time, so functions that take them run :func:`runtime_check` instead: a host callback
that raises the same ``ValueError`` when the compiled program runs (surfacing as a ``JaxRuntimeError`` whose
message contains it). Pass ``check=False`` to the public functions to drop the callback in hot loops whose
inputs are valid by construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Error codes of probability arrays (bit flags so several problems can be reported together).
_NAN, _BELOW, _ABOVE = 1, 2, 4


def is_traced(*xs) -> bool:
    """True if any argument is a JAX tracer (we are inside jit/vmap/grad)."""
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def probability_error_code(p: jnp.ndarray) -> jnp.ndarray:
    """Bit flags: 1 if any entry is NaN/inf, 2 if any is < 0, 4 if any is > 1 (0 means valid)."""
    p = jnp.asarray(p)
    nonfinite = jnp.any(~jnp.isfinite(p))
    below = jnp.any(p < 0)
    above = jnp.any(p > 1)
    return (nonfinite * _NAN + below * _BELOW + above * _ABOVE).astype(jnp.int32)


def describe_probability_error(code: int, name: str) -> str:
    problems = []
    if code & _NAN:
        problems.append("NaN or infinite values")
    if code & _BELOW:
        problems.append("values below 0")
    if code & _ABOVE:
        problems.append("values above 1")
    return f"{name} must be probabilities in [0, 1]; found " + " and ".join(problems)


def check_probabilities(p, name: str = "p") -> None:
    """Eager check: raises ValueError if ``p`` has NaN/inf or values outside [0, 1]."""
    p = np.asarray(p)
    if not np.issubdtype(p.dtype, np.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {p.dtype}")
    code = int(np.any(~np.isfinite(p))) * _NAN + int(np.any(p < 0)) * _BELOW + int(np.any(p > 1)) * _ABOVE
    if code:
        raise ValueError(describe_probability_error(code, name))


def runtime_check(p: jnp.ndarray, name: str) -> None:
    """Under jit: raise (at run time) if ``p`` is not a valid probability array."""

    def _raise_if_bad(code):
        code = int(code)
        if code:
            raise ValueError(describe_probability_error(code, name))

    jax.debug.callback(_raise_if_bad, probability_error_code(p))


def check_probabilities_any(p, name: str, check: bool = True) -> None:
    """Eager ValueError for concrete ``p``; a run-time check for traced ``p`` (unless ``check`` is False)."""
    if not check:
        return
    if is_traced(p):
        runtime_check(p, name)
    else:
        check_probabilities(p, name)


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
