"""Token-budget allocation (``allocate(..., costs_P=...)``) against the rollout-budget one, measured in the same run.

    .venv/bin/python benchmarks/bench_allocation_costs.py           # P = 256, 1024, 10^4, 10^5
    .venv/bin/python benchmarks/bench_allocation_costs.py --quick   # P up to 10^4

Problem (``maxrl``): ``p = 0.02 + 0.96 Beta(0.7, 0.7)`` in float32, ``2 <= N_i <= 256``, hard prompts write longer:
``l_i = round(200 + 1800 (1 - p_i))`` tokens, token budget ``16 sum_i l_i + 0.5`` (16 rollouts a prompt on
average). The baseline is the rollout budget ``B = 16 P`` on the same p (one bisection, no phases). Both jitted,
p and costs on the device, median of several calls after compilation; the ratio costed / uncosted is printed.

Checks (a failure is printed loudly and makes the exit status 1; timings are only reported): the counts fit the
budget, nothing left over fits another rollout of a prompt below n_max, and the value is the discrete max–min by
an O(P) certificate: lifting every prompt above it (relative 1e-5) would cost more than the budget.
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

from common import median_ms, report_failures
from sera_jax import allocate

N_MIN, N_MAX, MEAN_ROLLOUTS = 2, 256, 16


def problems(p: np.ndarray, costs: np.ndarray, counts: np.ndarray, budget: float) -> list[str]:
    found = []
    costs64, counts64 = costs.astype(np.float64), counts.astype(np.float64)
    left = budget - float(costs64 @ counts64)
    if left < 0:
        found.append(f"over budget by {-left} tokens")
    if counts.min() < N_MIN or counts.max() > N_MAX:
        found.append("counts out of bounds")
    if np.any((counts < N_MAX) & (costs64 <= left)):
        found.append("a rollout that fits the budget was left out")
    lam = -np.log1p(-p.astype(np.float64))
    value = np.min((counts64 - 1) * lam)  # -log(1 - min_i s_i)
    needed = np.floor(value * (1 + 1e-5) / lam) + 2  # the fewest rollouts with a key above the value
    if np.all(needed <= N_MAX) and float(costs64 @ np.maximum(needed, N_MIN)) <= budget:
        found.append("not the max-min: every prompt could be lifted above the value")
    return found


def bench_size(rng, num_prompts: int, repeats: int) -> dict:
    p = (0.02 + 0.96 * rng.beta(0.7, 0.7, num_prompts)).astype(np.float32)
    costs = np.round(200 + 1800 * (1 - p)).astype(np.float32)
    budget = float(MEAN_ROLLOUTS * costs.sum() + 0.5)
    costed = jax.jit(lambda q, c: allocate(q, budget, n_min=N_MIN, n_max=N_MAX, costs_P=c, check=False,
                                           method="sera_all_active"))
    plain = jax.jit(lambda q: allocate(q, MEAN_ROLLOUTS * num_prompts, n_min=N_MIN, n_max=N_MAX, check=False,
                                       method="sera_all_active"))
    p_dev, c_dev = jax.device_put(p), jax.device_put(costs)
    counts = np.asarray(costed(p_dev, c_dev))
    return dict(costed=median_ms(costed, p_dev, c_dev, repeats=repeats), plain=median_ms(plain, p_dev, repeats=repeats),
                problems=problems(p, costs, counts, budget))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="P up to 10^4 only")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    sizes = (256, 1024, 10_000) if args.quick else (256, 1024, 10_000, 100_000)
    print(f"backend: {jax.default_backend()}\n{'P':>8} {'costed ms':>10} {'rollouts ms':>12} {'ratio':>7}")
    failures = []
    for num_prompts in sizes:
        r = bench_size(rng, num_prompts, repeats=7 if num_prompts <= 10_000 else 3)
        print(f"{num_prompts:>8} {r['costed']:>10.3f} {r['plain']:>12.3f} {r['costed'] / r['plain']:>7.2f}")
        failures += [f"P = {num_prompts}: {msg}" for msg in r["problems"]]
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
