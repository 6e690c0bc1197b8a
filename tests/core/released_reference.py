"""A plain NumPy (float64) restatement of the SERA authors' released allocation, for tests and benchmarks.

It follows ChenZihao0121/SERA @ 3252ed5 ``verl/trainer/ppo/SERA.py`` step by step, written out for reading rather
than speed: ``allocate_rollouts_from_probabilities(mode="dynamic_active_equalized")`` with inactive prompts at 0
rollouts (or at a floor, their ``inactive_floor`` mode), the waterline by 100 bisections in log tau, the floor
and refill by marginal squared error, and the binary search for the active set over allocated counts. The jitted
rule (``sera_jax.core.released_rule``) is tested against it; it shares no code with it.
"""

from __future__ import annotations

import math

import numpy as np


def mixed_chance(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    p = np.asarray(p, np.float64)
    n = np.asarray(n, np.int64)
    out = np.zeros(p.shape)
    pos = n > 0
    out[pos] = 1.0 - np.power(1.0 - p[pos], n[pos]) - np.power(p[pos], n[pos])
    return np.clip(out, 0.0, 1.0)


def waterline(p: np.ndarray, budget: int, n_min: int, n_max: int, offset: int = 1):
    """(tau, continuous counts) of the bounded centred waterline over all of ``p``."""
    lam = -np.log1p(-p)
    if budget == p.size * n_min:
        return (n_min - offset) * lam.min(), np.full(p.shape, float(n_min))
    lo = math.log((n_min - offset) * lam.min()) if n_min - offset > 0 else math.log(np.nextafter(0.0, 1.0))
    hi = math.log((n_max - offset) * lam.max())
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        total = np.sum(np.clip(offset + math.exp(mid) / lam, n_min, n_max))
        if total > budget:
            hi = mid
        else:
            lo = mid
    tau = math.exp(lo)
    return tau, np.clip(offset + tau / lam, n_min, n_max)


def floor_and_refill(p: np.ndarray, budget: int, n_min: int, n_max: int, offset: int = 1):
    tau, cont = waterline(p, budget, n_min, n_max, offset)
    counts = np.clip(np.floor(cont).astype(np.int64), n_min, n_max)
    left = budget - int(counts.sum())
    if left:
        target = -math.expm1(-tau)
        idx = np.flatnonzero(counts < n_max)
        log_q = np.log1p(-p[idx])
        now = -np.expm1(log_q * (counts[idx] - offset))
        nxt = -np.expm1(log_q * (counts[idx] + 1 - offset))
        growth = (nxt - target) ** 2 - (now - target) ** 2
        chosen = np.lexsort((idx, growth))[:left]  # smallest growth first, ties by prompt index
        counts[idx[chosen]] += 1
    return tau, counts


def released_counts(p, budget: int, n_min: int, n_max: int, *, floor: int = 0, threshold: float = 0.05,
                    offset: int = 1):
    """(counts, active mask, tau) of the released rule."""
    p = np.asarray(p, np.float64)
    num = p.size
    score = mixed_chance(p, np.full(num, n_max))
    order = np.argsort(-score, kind="stable")  # highest score first, ties by index
    eligible = int(np.sum(score >= threshold))
    required = math.ceil((budget - num * floor) / (n_max - floor))

    def allocate_top(k):
        active = np.zeros(num, bool)
        active[order[:k]] = True
        counts = np.full(num, floor, np.int64)
        tau, counts[active] = floor_and_refill(p[active], budget - (num - k) * floor, n_min, n_max, offset)
        return counts, active, tau

    def passes(k):
        counts, active, _ = allocate_top(k)
        return bool(np.all(mixed_chance(p, counts)[active] >= threshold - 1e-12))

    chosen = required
    if eligible >= required:
        low, high = required, eligible
        while low <= high:
            mid = (low + high) // 2
            if passes(mid):
                chosen, low = mid, mid + 1
            else:
                high = mid - 1
    return allocate_top(chosen)


def generated_cases(num_seeds: int = 2):
    """The issue's grid: P 32-256, N0 4-128, n_max = 4 N0, five Beta shapes of p; 240 cases at two seeds."""
    shapes = [(0.5, 0.5), (1.0, 1.0), (0.3, 3.0), (2.0, 5.0), (0.2, 0.2)]
    cases = []
    for seed in range(num_seeds):
        rng = np.random.default_rng(seed)
        for num in (32, 64, 128, 256):
            for n0 in (4, 8, 16, 32, 64, 128):
                for a, b in shapes:
                    p = np.clip(rng.beta(a, b, size=num), 1e-6, 1 - 1e-6)
                    cases.append((p, num * n0, 2, 4 * n0))
    return cases
