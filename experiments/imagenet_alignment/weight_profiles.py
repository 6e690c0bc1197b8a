"""Effective-weight profiles: a method's weight on each prompt relative to the exact likelihood objective's,
``s_eff_i`` (``E g = (1/P) sum_i s_eff_i grad log p_i``; the exact objective has ``s_eff_i = 1``), averaged over
the prompts of fixed bins of p. ``weight_profile``: from the closed form; ``sampled_weight_profile``: from sampled
draws' projections (``estimators.projected_scales``), with their Monte Carlo standard error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Bins of p for the effective-weight profiles (``weight_profile``). Finer where p is small: MaxRL's factor
# s(p, N) = 1 - (1-p)^(N-1) moves fastest there, and that is where the allocators move rollouts to. At N = 4, s is
# 0.14, 0.27, 0.49, 0.66, 0.88 and 0.97 at the edges 0.05 ... 0.7, so each bin below 0.7 spans a similar step of s
# (and the cpu config's step-40 checkpoint puts 7, 17, 45, 53, 69, 50 of its 256 images in them); above 0.7 s is
# within 3% of 1 at every N_bar >= 4, and 0.9 separates a converged checkpoint's bulk (step 300) from its tail.
WEIGHT_EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


def bin_indices(p_P, edges=WEIGHT_EDGES) -> np.ndarray:
    """The bin of each prompt: b with ``edges[b] <= p < edges[b + 1]``, the last bin closed (p = 1 is in it)."""
    p = np.asarray(p_P, np.float64)
    return np.clip(np.searchsorted(np.asarray(edges, np.float64), p, side="right") - 1, 0, len(edges) - 2)


def _rounded(values) -> list[float]:
    """Six significant digits (NaN kept): the profiles are means of noisy or binned quantities, and results.json
    holds thousands of them."""
    return [float(f"{v:.6g}") for v in np.asarray(values, np.float64)]


def profile_bins(p_P, edges=WEIGHT_EDGES) -> dict[str, list]:
    """The bins of the weight profiles: their edges, the prompts in each and their mean p (NaN where empty)."""
    p = np.asarray(p_P, np.float64)
    b = bin_indices(p, edges)
    count = np.bincount(b, minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_mean = np.bincount(b, weights=p, minlength=len(edges) - 1) / count
    return {"edges": [float(e) for e in edges], "count": count.tolist(), "p_mean": _rounded(p_mean)}


def weight_profile(p_P, s_eff_P, edges=WEIGHT_EDGES) -> dict[str, list[float]]:
    """A method's effective weights ``s_eff_i`` (relative to the exact objective's, 1) summarised per bin of p: the
    mean, 10th and 90th percentile over the bin's prompts (NaN for an empty bin). A prompt the method gives no
    rollouts (the released SERA's) weighs 0 and counts so in its bin."""
    b = bin_indices(p_P, edges)
    s = np.asarray(s_eff_P, np.float64)
    out = {"mean": [], "q10": [], "q90": []}
    for k in range(len(edges) - 1):
        inside = s[b == k]
        stats = (np.mean(inside), *np.quantile(inside, (0.1, 0.9))) if inside.size else (math.nan,) * 3
        for name, value in zip(out, stats):
            out[name].append(value)
    return {name: _rounded(values) for name, values in out.items()}


def uncorrected_projection(x_MxP, counts_MxP, n_bar: int) -> np.ndarray:
    """The projected scales of corrected draws (loss weight ``1/(P N_i)``) under the batch-mean loss instead
    (``1/B``, B = P N_bar): the same rollouts, each prompt's cotangent times ``N_i / N_bar`` in its own draw."""
    return np.asarray(x_MxP, np.float64) * np.asarray(counts_MxP, np.float64) / n_bar


def sampled_weight_profile(p_P, x_MxP, edges=WEIGHT_EDGES) -> dict[str, Any]:
    """The weight profile estimated from M sampled draws of the projected scales ``x_mi`` (``E.projected_scales``,
    unbiased for ``s_eff_i``): per bin of p, the mean over the draws and the bin's prompts, and its Monte Carlo
    standard error ``sd_m(y_m) / sqrt(M)`` with ``y_m`` the bin's mean in draw m (the draws are independent; the
    prompts of one draw need not be: an online method's counts depend on every prompt's rewards). NaN for an
    empty bin; ``draws`` = M."""
    x = np.asarray(x_MxP, np.float64)
    b = bin_indices(p_P, edges)
    y_MxB = np.stack([x[:, b == k].mean(axis=1) if np.any(b == k) else np.full(x.shape[0], math.nan)
                      for k in range(len(edges) - 1)], axis=1)
    se = np.std(y_MxB, axis=0, ddof=1) / math.sqrt(x.shape[0])
    return {"mean": _rounded(y_MxB.mean(axis=0)), "se": _rounded(se), "draws": int(x.shape[0])}
