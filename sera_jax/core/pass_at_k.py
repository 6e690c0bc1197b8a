"""Unbiased pass@k (Chen et al. 2021), computed stably on the host in float64 (SERA.md §7).

``pass@k = 1 - C(n - c, k) / C(n, k)`` for n samples of which c are correct. The ratio is a product of
min(c, k) factors, ``prod_{j<k} (1 - c/(n-j)) = prod_{j<c} (1 - k/(n-j))``, summed in log space with log1p,
so it stays accurate for n up to 10^5 and beyond (no factorials, no cancellation).
"""

from __future__ import annotations

import numpy as np


def as_counts(x, name: str) -> np.ndarray:
    """``x`` as int64 counts; ValueError naming ``name`` for NaN/inf or fractional values, which a cast to int
    would turn silently into other counts (a NaN into a huge negative one)."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
        return x.astype(np.int64)
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"pass_at_k: {name} must be counts, got dtype {x.dtype}")
    bad = np.atleast_1d(~np.isfinite(x) | (x != np.round(x)))
    if np.any(bad):
        raise ValueError(f"pass_at_k: {name} must be whole numbers (counts); got {name} values "
                         f"{np.atleast_1d(x)[bad][:5].tolist()}")
    return x.astype(np.int64)


def _check(n, c, k) -> None:
    if np.any(n < 1) or np.any(c < 0) or np.any(c > n):
        raise ValueError("pass_at_k needs n >= 1 and 0 <= c <= n")
    if np.any(k < 1) or np.any(k > n):
        raise ValueError(f"pass_at_k needs 1 <= k <= n; got k in [{np.min(k)}, {np.max(k)}], n >= {np.min(n)}")


def _pass_at_k_scalar(n: int, c: int, k: int) -> float:
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    m, x = (c, k) if c <= k else (k, c)
    j = np.arange(m, dtype=np.float64)
    return float(-np.expm1(np.sum(np.log1p(-x / (n - j)))))


def pass_at_k(n, c, k) -> np.ndarray:
    """Unbiased pass@k for arrays (broadcast) of samples n, correct counts c and k; float64."""
    n, c, k = as_counts(n, "n"), as_counts(c, "c"), as_counts(k, "k")
    _check(n, c, k)
    n, c, k = np.broadcast_arrays(n, c, k)
    out = np.array([_pass_at_k_scalar(int(a), int(b), int(d)) for a, b, d in zip(n.ravel(), c.ravel(), k.ravel())])
    return out.reshape(n.shape)


def pass_at_k_curve(n: int, correct, ks) -> np.ndarray:
    """pass@k for every k in ``ks`` and every problem (prompt) in ``correct`` (shape (P,)), n samples each:
    (P, len(ks)).

    One cumulative sum over j gives all k at once: ``log ratio(k) = sum_{j<k} log1p(-c / (n - j))``.
    """
    correct, ks = as_counts(correct, "correct"), as_counts(ks, "ks")
    n = int(as_counts(n, "n"))
    _check(np.asarray(n), correct, ks)
    j = np.arange(n, dtype=np.float64)
    c = correct[:, None].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.log1p(-np.minimum(c / (n - j[None, :]), 1.0))  # -inf once n - j <= c: pass@k = 1
    log_ratio = np.cumsum(terms, axis=1)[:, ks - 1]
    out = -np.expm1(log_ratio)
    return np.where(correct[:, None] == 0, 0.0, out)


def mean_pass_at_k(n: int, correct, ks) -> np.ndarray:
    """Mean over problems of pass@k, for each k in ``ks``."""
    return pass_at_k_curve(n, correct, ks).mean(axis=0)
