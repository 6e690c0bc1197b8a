"""Coverage at matched pass@1: a method's pass@k against the reference methods' pass@k at the same pass@1.

A method that learns more slowly than uniform MaxRL also keeps more coverage (pass@k at large k) on its way; a
plain comparison at equal steps cannot tell that from a better method. This one reads the reference (uniform MaxRL
at several learning rates, each evaluated at several steps) at the treated run's own final pass@1.

Per seed, with the treated run's final (pass@1, pass@k) = (a, c):

- each reference run's evaluations, in step order, are a path through (pass@1, pass@k); where the path first
  crosses pass@1 = a (between two consecutive evaluations, or at one), its pass@k there is the linear
  interpolation in pass@1 between those two evaluations;
- the reference value is the mean of that pass@k over the reference runs whose paths cross a;
- where no path crosses a, a lies outside the reference's pass@1 range on that seed: the reference value is the
  pass@k of the reference evaluation with the nearest pass@1 (the highest one above the range, the lowest below),
  and the seed is marked ``"clamped": "above"`` or ``"below"`` (no extrapolation: the count of clamped seeds is
  reported beside the result, so a reader sees how much of it is read off the range's ends).

The per-seed difference is c minus the reference value; its mean over seeds gets a 95% Student-t interval.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from sera_jax.report.stats import mean_and_ci95


def evaluation_path(evaluations: list[dict[str, Any]], k: int) -> np.ndarray:
    """(E, 2) array of (pass@1, pass@k) at a run's evaluations, in step order; ValueError naming a missing k."""
    rows = []
    for e in sorted(evaluations, key=lambda e: e["step"]):
        ks = list(e["k"])
        for needed in (1, k):
            if needed not in ks:
                raise ValueError(f"the evaluation at step {e['step']} has no pass@{needed} (k = {ks})")
        rows.append((e["pass_at_k"][ks.index(1)], e["pass_at_k"][ks.index(k)]))
    return np.asarray(rows, np.float64).reshape(-1, 2)


def first_crossing(path_Ex2: np.ndarray, pass_at_1: float) -> Optional[float]:
    """pass@k where the path first reaches pass@1 = ``pass_at_1`` (linear in pass@1 between the two evaluations
    around it), or None when it never does."""
    for (x0, y0), (x1, y1) in zip(path_Ex2[:-1], path_Ex2[1:]):
        if min(x0, x1) <= pass_at_1 <= max(x0, x1):
            return y0 if x1 == x0 else y0 + (pass_at_1 - x0) * (y1 - y0) / (x1 - x0)
    if len(path_Ex2) == 1 and path_Ex2[0, 0] == pass_at_1:
        return float(path_Ex2[0, 1])
    return None


def reference_at(paths: Sequence[np.ndarray], pass_at_1: float) -> tuple[float, Optional[str]]:
    """The reference pass@k at ``pass_at_1`` over the reference runs' ``paths`` and how it was read: None when
    interpolated, "above" / "below" when ``pass_at_1`` lies outside every path and the nearest end is used."""
    crossings = [v for v in (first_crossing(p, pass_at_1) for p in paths) if v is not None]
    if crossings:
        return float(np.mean(crossings)), None
    points = np.concatenate(list(paths))
    if pass_at_1 > points[:, 0].max():
        return float(points[np.argmax(points[:, 0]), 1]), "above"
    return float(points[np.argmin(points[:, 0]), 1]), "below"


def matched_pass_at_1(curves: dict[str, list[dict[str, Any]]], treated: str, references: Sequence[str],
                      k: int) -> dict[str, Any]:
    """The treated method's final pass@k minus the references' pass@k at its final pass@1, per seed and over seeds.

    ``curves[method]``: a ``summarize_runs`` entry's ``curves`` (``[{"seed", "evaluations"}]``). Only seeds that
    the treated method and every reference ran are used. Returns ``{"k", "treated", "references", "per_seed":
    [{"seed", "pass_at_1", "pass_at_k", "reference_pass_at_k", "clamped", "diff"}], "mean_diff", "ci95" (half-width,
    None under 2 seeds), "num_seeds", "num_clamped"}``."""
    missing = [m for m in (treated, *references) if m not in curves]
    if missing:
        raise ValueError(f"matched pass@1: no runs of {missing} (have {sorted(curves)})")
    by_method = {m: {c["seed"]: c["evaluations"] for c in curves[m] if c["evaluations"]}
                 for m in (treated, *references)}
    seeds = sorted(set.intersection(*(set(v) for v in by_method.values())))
    per_seed = []
    for seed in seeds:
        a, c = evaluation_path(by_method[treated][seed], k)[-1]
        reference, clamped = reference_at([evaluation_path(by_method[m][seed], k) for m in references], a)
        per_seed.append({"seed": seed, "pass_at_1": float(a), "pass_at_k": float(c),
                         "reference_pass_at_k": reference, "clamped": clamped, "diff": float(c - reference)})
    diffs = np.array([s["diff"] for s in per_seed])
    mean, half = mean_and_ci95(diffs) if len(diffs) else (np.nan, None)
    return {"k": k, "treated": treated, "references": list(references), "per_seed": per_seed,
            "mean_diff": float(mean), "ci95": None if half is None else float(half), "num_seeds": len(per_seed),
            "num_clamped": sum(s["clamped"] is not None for s in per_seed)}


def matched_endpoints(methods: dict[str, Any], spec: Any) -> Optional[dict[str, Any]]:
    """``spec.treated[0]`` at ``spec.k`` against ``spec.references`` at matched pass@1 (``matched_pass_at_1``), with
    every other (treated method, k) of ``spec.treated`` x ``(spec.k, *spec.other_ks)`` under ``"secondary"``; None
    until the results hold runs of every method it names."""
    if any(m not in methods for m in (*spec.treated, *spec.references)):
        return None
    curves = {m: e["curves"] for m, e in methods.items()}
    runs = [(t, k) for t in spec.treated for k in (spec.k, *spec.other_ks)]
    found = [matched_pass_at_1(curves, t, tuple(spec.references), k) for t, k in runs]
    return {**found[0], "secondary": found[1:]}
