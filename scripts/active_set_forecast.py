"""Forecasts the released rule's active fraction in epoch 1 of a maze set chosen by the start policy.

    python scripts/active_set_forecast.py WORKDIR/hard_mix.json --num_train=64 --hard=0.375 --easy=0.125

A ``hard_mix.json`` holds the start policy's successes on each pool maze (``experiments/maze/experiment.py
select_hard_mix``). The script chooses the training set as a run would (``hopeless_mix``), takes each maze's
successes as its epoch-0 evidence (the start policy's samples stand in for epoch 0's rollouts: the same policy,
other draws), and lays the set out in random steps as epoch 1 would visit it: the released rule
(``sera_jax.core.released_allocation``) on the epoch estimates ``(a0 + k) / (a0 + b0 + N0)`` of each step's mazes.
It prints the mean share of a step's mazes that get rollouts, what a calibration's condition on the active fraction
reads after epoch 0 before training moves the estimates. Cheap (no model): use it to choose a set's mix before
calibrating.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
if __name__ == "__main__":  # before this process imports JAX (through sera_jax): experiments/platforms.py
    from experiments import platforms

    platforms.quiet_absent_accelerators()

import sera_jax.core as core  # noqa: E402
from experiments.maze.task import hopeless_mix  # noqa: E402


def epoch1_active_fraction(successes: np.ndarray, samples: int, *, prompts_per_step: int, n_max: int,
                           n_min: int = 2, threshold: float = 0.05, prior: tuple[float, float] = (0.5, 0.5),
                           orders: int = 20, seed: int = 0) -> float:
    """Mean active share of a step over ``orders`` random orders of the set whose epoch-0 successes of ``samples``
    are ``successes`` (its size a multiple of ``prompts_per_step``), at ``samples`` rollouts a prompt."""
    a0, b0 = prior
    p = (a0 + np.asarray(successes, np.float64)) / (a0 + b0 + samples)
    if p.size % prompts_per_step:
        raise ValueError(f"{p.size} mazes do not fill steps of {prompts_per_step}")
    rng = np.random.default_rng(seed)
    shares = []
    for _ in range(orders):
        for step_p in p[rng.permutation(p.size)].reshape(-1, prompts_per_step):
            counts = core.released_allocation(step_p, prompts_per_step * samples, n_min=n_min, n_max=n_max,
                                              threshold=threshold).counts_P
            shares.append(float(np.mean(np.asarray(counts) > 0)))
    return float(np.mean(shares))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hard_mix", type=pathlib.Path)
    parser.add_argument("--num_train", type=int, required=True)
    parser.add_argument("--hard", type=float, required=True, help="maze.hard_fraction")
    parser.add_argument("--easy", type=float, default=0.0, help="maze.easy_fraction")
    parser.add_argument("--prompts_per_step", type=int, default=8)
    parser.add_argument("--n_max_factor", type=int, default=4, help="n_max = this x the samples a maze (N0)")
    args = parser.parse_args(argv)
    counts = json.loads(args.hard_mix.read_text())
    pool = np.asarray(counts["train"])
    chosen = pool[hopeless_mix(pool, args.num_train, args.hard, "the training pool", args.easy)]
    share = epoch1_active_fraction(chosen, counts["samples"], prompts_per_step=args.prompts_per_step,
                                   n_max=args.n_max_factor * counts["samples"])
    print(f"{args.hard_mix}: {args.num_train} mazes, {args.hard} hopeless, {args.easy} easy: epoch-1 active "
          f"fraction {share:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
