"""Unbiased pass@k (Chen et al. 2021), computed stably on the host in float64 (docs/method.md §7).

``pass@k = 1 - C(n - c, k) / C(n, k)`` for n samples of which c are correct. The ratio is a product of
min(c, k) factors, ``prod_{j<k} (1 - c/(n-j)) = prod_{j<c} (1 - k/(n-j))``, summed in log space with log1p,
so it stays accurate for n up to 10^5 and beyond (no factorials, no cancellation).

Beside it, the SERA authors' maze estimator (``bootstrap_pass_at_k_curve``): a seeded bootstrap of each prompt's
ordered samples, ``(1/R) sum_r 1[draw r of k samples with replacement holds a correct one]``, k = 1 as c / n; its
mean over seeds is ``1 - (1 - c/n)^k`` (``with_replacement_pass_at_k``), below the unbiased value.
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


# -- the SERA authors' maze pass@k: a seeded bootstrap ------------------------------------------------------------
#
# Their maze runs report pass@k as a bootstrap (ChenZihao0121/SERA @ 3252ed5: ``evaluation/passk.py``
# ``maze_pass_at_k``, restating their trainer's ``verl/trainer/ppo/metric_utils.py`` ``bootstrap_metric`` /
# ``best@k/mean``): ``repeats`` draws of k of a prompt's n ordered samples with replacement, NumPy's legacy MT19937
# stream reseeded with ``seed`` for every prompt and every k, and k = 1 reported as c / n. Its mean over seeds is
# ``1 - (1 - c/n)^k`` (``with_replacement_pass_at_k``), which is below the unbiased estimate and reads low for k
# near n (at k = n it is about 1 - e^-c where the unbiased one is 1); both tend to the same value as n grows at
# fixed k and c / n.

BOOTSTRAP_REPEATS = 1000  # their maze_pass_at_k(repeats=1000) and bootstrap_metric(n_bootstrap=1000)
BOOTSTRAP_SEED = 42  # their maze_pass_at_k(seed=42) and bootstrap_metric(seed=42)
_MAX_SEED = 2**32 - 1  # np.random.RandomState accepts seeds in [0, 2^32 - 1]
_DRAWS_PER_BLOCK = 256


def check_bootstrap_settings(repeats, seed) -> None:
    """ValueError naming ``repeats`` (an int >= 1) or ``seed`` (an int in [0, 2^32 - 1], a RandomState seed)."""
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"bootstrap pass@k: repeats={repeats!r} must be an int >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"bootstrap pass@k: seed={seed!r} must be an int in [0, 2^32 - 1] (a NumPy RandomState seed)")


def bootstrap_draws(n: int, k: int, repeats: int = BOOTSTRAP_REPEATS, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """The authors' draws for a pool of n samples: ``(repeats, k)`` indices in ``[0, n)``, with replacement,
    ``np.random.RandomState(seed).choice(n, size=(repeats, k))``. Row r is their r-th draw: ``choice`` reads one
    bounded integer after another from the stream, so ``repeats`` calls of size k (their trainer's loop after
    ``np.random.seed(seed)``) give these rows."""
    check_bootstrap_settings(repeats, seed)
    return np.random.RandomState(seed).choice(int(n), size=(int(repeats), int(k)), replace=True)


def _as_pools(correct_PxN) -> np.ndarray:
    """``correct_PxN`` as a (P, N) bool array; ValueError for another rank, an empty pool or entries not 0/1."""
    x = np.asarray(correct_PxN)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"bootstrap pass@k: correct_PxN must be (prompts, samples) with samples >= 1, got shape "
                         f"{x.shape}")
    if x.dtype != np.bool_:
        if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)) or \
                not np.all((x == 0) | (x == 1)):
            raise ValueError("bootstrap pass@k: correct_PxN must hold 0/1 (or bool) per sample")
        x = x == 1
    return x


def bootstrap_pass_at_k_curve(correct_PxN, ks, repeats: int = BOOTSTRAP_REPEATS,
                              seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """The SERA authors' maze pass@k of each prompt, from its n ordered samples (row i of ``correct_PxN``, 1 where
    sample j is correct), for every k in ``ks``: (P, len(ks)) float64.

        pass@k_boot(i) = (1/R) sum_{r<R} 1[ y_i[I_r1] or ... or y_i[I_rk] ],   I = bootstrap_draws(n, k, R, seed)

    for k >= 2 (the same draws I for every prompt: the stream restarts at ``seed`` for each), and c_i / n for k = 1.
    The sample order matters, as in theirs. A draw hits a correct sample iff the pool's correct indicators summed
    over the draw's distinct indices are > 0: (P, n) x (n, R) products per k (blocks of draws), exact in float64.
    """
    pools = _as_pools(correct_PxN)
    ks = as_counts(ks, "ks").reshape(-1)
    num_prompts, n = pools.shape
    _check(np.asarray(n), np.zeros(1, np.int64), ks)
    check_bootstrap_settings(repeats, seed)
    y_PxN = pools.astype(np.float64)
    out = np.empty((num_prompts, ks.shape[0]), np.float64)
    for j, k in enumerate(ks.tolist()):
        if k == 1:
            out[:, j] = y_PxN.mean(axis=1)
            continue
        draws_RxK = bootstrap_draws(n, k, repeats, seed)
        hits_P = np.zeros(num_prompts, np.int64)
        for start in range(0, repeats, _DRAWS_PER_BLOCK):  # bounded memory: a block of draws x n at a time
            block_DxK = draws_RxK[start:start + _DRAWS_PER_BLOCK]
            member_DxN = np.zeros((block_DxK.shape[0], n), np.float64)
            member_DxN[np.arange(block_DxK.shape[0])[:, None], block_DxK] = 1.0
            hits_P += np.sum(y_PxN @ member_DxN.T > 0, axis=1)
        out[:, j] = hits_P / repeats
    return out


def mean_bootstrap_pass_at_k(correct_PxN, ks, repeats: int = BOOTSTRAP_REPEATS,
                             seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Mean over prompts of ``bootstrap_pass_at_k_curve``, for each k in ``ks`` (their per-dataset pass@k)."""
    return bootstrap_pass_at_k_curve(correct_PxN, ks, repeats, seed).mean(axis=0)


def with_replacement_pass_at_k(n, c, k) -> np.ndarray:
    """``1 - (1 - c/n)^k``: the chance that k samples drawn with replacement from a pool of n with c correct hold a
    correct one, which is the bootstrap's mean over seeds (arrays broadcast; float64)."""
    n, c, k = as_counts(n, "n"), as_counts(c, "c"), as_counts(k, "k")
    _check(n, c, k)
    with np.errstate(divide="ignore"):
        return -np.expm1(k * np.log1p(-c / n))
