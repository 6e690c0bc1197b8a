"""Alignment of gradients with the exact one ``G*``, on the host, from a chunk's Gram matrix and its dot products
with ``G*`` (``gradients.gram_and_dots``): cosine and relative L2 error per gradient, and the split-half estimate
for an expectation known only through two independent Monte Carlo halves.
"""

from __future__ import annotations

import math

import numpy as np


def cosine_and_error(gram_MxM: np.ndarray, dots_M: np.ndarray, target_sq: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``cos(g_c, G*)`` and ``|g_c - G*| / |G*|`` from the chunk's Gram matrix and dot products."""
    norms_sq = np.maximum(np.diag(gram_MxM), 0.0)
    cos = dots_M / np.maximum(np.sqrt(norms_sq * target_sq), 1e-30)
    err = np.sqrt(np.maximum(norms_sq - 2 * dots_M + target_sq, 0.0) / max(target_sq, 1e-30))
    return cos, err


def split_half_alignment(gram_2x2: np.ndarray, dots_2: np.ndarray, target_sq: float) -> tuple[float, float, float]:
    """Cosine and relative error of ``E g`` from two independent Monte Carlo halves a and b of it, and the
    relative Monte Carlo noise of their mean.

    ``<g_a, g_b>`` estimates ``|E g|^2`` without the noise term that ``|(g_a + g_b)/2|^2`` carries; the noise
    of the mean is ``|g_a - g_b| / 2`` relative to ``|E g|``. When the noise swamps the signal
    (``<g_a, g_b> <= 0``) the estimate is undefined: NaN.
    """
    g_aa, g_ab, g_bb = float(gram_2x2[0, 0]), float(gram_2x2[0, 1]), float(gram_2x2[1, 1])
    if g_ab <= 0:
        return math.nan, math.nan, math.inf
    mean_dot = 0.5 * (float(dots_2[0]) + float(dots_2[1]))
    cos = mean_dot / math.sqrt(g_ab * max(target_sq, 1e-30))
    err = math.sqrt(max(g_ab - 2 * mean_dot + target_sq, 0.0) / max(target_sq, 1e-30))
    noise = 0.5 * math.sqrt(max(g_aa - 2 * g_ab + g_bb, 0.0) / g_ab)
    return cos, err, noise
