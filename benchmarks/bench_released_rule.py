"""Speed of the released SERA rule, jitted (``core.released_rule``), against the authors' rule restated in NumPy
(``tests/core/released_reference.py``: their float64 NumPy algorithm step by step), measured in the same run.

    .venv/bin/python benchmarks/bench_released_rule.py            # P = 256, 4,096, 10^6 (~1 min on 2 cores)
    .venv/bin/python benchmarks/bench_released_rule.py --quick    # P = 256, 4,096

Problem: the authors' settings, ``B = P N0`` with N0 = 16, ``n_min = 2``, ``n_max = 4 N0 = 64``, threshold 0.05,
``p ~ Beta(0.5, 2)`` clipped to [1e-6, 1 - 1e-6] (many hopeless prompts: the active-set search has work to do).
jax: ``released_allocation`` on float32 p already on the device, after compilation (the public call, checks
included); reference: float64 NumPy. Targets: <= 1 ms at P = 256, >= 5x faster than the reference at P = 10^6.
Check (a failure makes the exit status 1): identical counts and active sets.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import median_ms, report_failures, target_line  # noqa: E402
from sera_jax.core.released_rule import released_allocation  # noqa: E402
from tests.core.released_reference import released_counts  # noqa: E402

N0, N_MIN = 16, 2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = (256, 4096) if args.quick else (256, 4096, 10**6)
    failures, ratios, times = [], {}, {}
    print(f"{'P':>9} {'jax ms':>10} {'numpy ms':>10} {'ratio':>7} {'active':>8}")
    for num in sizes:
        rng = np.random.default_rng(num)
        p64 = np.clip(rng.beta(0.5, 2.0, num), 1e-6, 1 - 1e-6)
        p32 = jnp.asarray(p64, jnp.float32)
        budget, n_max = num * N0, 4 * N0
        repeats = 3 if num >= 10**5 else 21
        out = released_allocation(p32, budget, n_min=N_MIN, n_max=n_max)
        counts, active, _ = released_counts(np.asarray(p32, np.float64), budget, N_MIN, n_max)
        if not (np.array_equal(np.asarray(out.counts_P), counts) and np.array_equal(np.asarray(out.active_P), active)):
            failures.append(f"P={num}: counts or active set differ from the reference")
        jax_ms = median_ms(lambda: released_allocation(p32, budget, n_min=N_MIN, n_max=n_max), repeats=repeats)
        ref_ms = median_ms(lambda: released_counts(p64, budget, N_MIN, n_max), repeats=max(1, repeats // 3))
        times[num], ratios[num] = jax_ms, ref_ms / jax_ms
        print(f"{num:>9} {jax_ms:>10.3f} {ref_ms:>10.1f} {ratios[num]:>6.1f}x {int(active.sum()):>8}")
    print("\ntargets:")
    print(target_line("P = 256: jitted rule <= 1 ms", f"{times[256]:.3f} ms", times[256] <= 1.0))
    big = 10**6 in ratios
    print(target_line("P = 10^6: >= 5x the NumPy rule", f"{ratios[10**6]:.1f}x" if big else "-",
                      ratios[10**6] >= 5 if big else None))
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
