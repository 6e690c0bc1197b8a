"""Where an RL step's time goes: pilot / allocate / sample / reward / update, for SERA (pilot) and uniform, with
the sampler before shared-prompt decoding and today's, in one run.

    .venv/bin/python benchmarks/bench_rl_step.py            # maze cpu config, 6 timed steps per method and sampler
    .venv/bin/python benchmarks/bench_rl_step.py --size 17 --model full --steps 3   # paper-size policy

The first two steps of each (sampler, method) are warm-up (compilation) and are not counted. Prints each
phase's share of the step, the sampling seconds per step, the sampler's speed-up inside the step, and the
allocation's share (target: under 1% of the step). "before" gives the trainer ``bench_sampler.old_sample`` as
its samplers (the algorithm before shared-prompt decoding: per-row prompt copies, all rows until the longest ends); "after"
gives it the trainer's own (``trainer.make_sample_fns``: ``make_sample_fn``, one slot per rollout of a call).
Each is built once and shared by both methods, as a comparison shares them.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import logging  # noqa: E402
from flax import nnx  # noqa: E402

from bench_sampler import make_old_sample_fn  # noqa: E402
from experiments.maze import config as maze_config  # noqa: E402
from experiments.maze.experiment import build_model, method_config  # noqa: E402
from experiments.maze.task import MazeTask  # noqa: E402
from sera_jax.rl import trainer as trainer_lib  # noqa: E402


PHASES = ("pilot", "allocate", "sample", "reward", "update")  # the stages of sera_jax.rl.trainer.rl_step


def old_sample_fns(graphdef: nnx.GraphDef, task, config) -> trainer_lib.SampleFns:
    """``trainer.make_sample_fns`` with the sampler before shared-prompt decoding. That sampler has no rollout ranks, so the
    trainer's eighth argument (``rank_offset_P``) is dropped: its rollouts are not the trainer's, its time is."""
    def build(top_p: float):
        old = make_old_sample_fn(graphdef, max_new_tokens=task.max_new_tokens, top_p=top_p, pad_id=task.pad_id)
        return lambda *args: old(*args[:7])

    return trainer_lib.SampleFns(train=build(config.rl.top_p), eval=build(config.eval.top_p))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=9)
    parser.add_argument("--model", choices=["cpu", "full"], default="cpu")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    logging.set_verbosity(logging.WARNING)
    config = maze_config.get_config("full" if args.model == "full" else "cpu")
    with config.unlocked():
        config.maze.size = args.size
        config.maze.num_eval = 8
        config.eval.every = 0
        config.ckpt.every = 10**9
        config.rl.steps = args.steps + 2
        if args.model == "full":
            config.rl.update(prompts_per_step=32, rollouts_per_step=256)
            config.sera.update(pilot_rollouts=2, n_min=2, n_max=64)
    task = MazeTask(config.maze.size, config.maze.num_eval, seed=0)
    print(f"maze {args.size}x{args.size}, model {args.model}, P={config.rl.prompts_per_step}, "
          f"B={config.rl.rollouts_per_step}, {args.steps} timed steps after 2 warm-up steps")
    print(f"{'sampler':>7} {'method':>8} {'step s':>8} {'sample s':>9} " + " ".join(f"{p:>9}" for p in PHASES))
    sample_seconds = {}
    graphdef = nnx.graphdef(build_model(config, 0))
    for sampler, make_fns in (("before", old_sample_fns), ("after", trainer_lib.make_sample_fns)):
        sample_fns = make_fns(graphdef, task, config)  # the methods differ in config.sera only: one set for both
        for method in ("uniform", "sera"):
            with tempfile.TemporaryDirectory() as tmp:
                history = trainer_lib.train_rl(task, build_model(config, 0), method_config(config, method), tmp,
                                               sample_fns=sample_fns, show_progress=False).history[2:]
            seconds = np.mean([h["step_seconds"] for h in history])
            shares = {p: np.mean([h.get(f"time_share/{p}", 0.0) for h in history]) for p in PHASES}
            sample_seconds[sampler, method] = seconds * (shares["sample"] + shares["pilot"])
            print(f"{sampler:>7} {method:>8} {seconds:8.3f} {sample_seconds[sampler, method]:9.3f} "
                  + " ".join(f"{100 * v:8.2f}%" for v in shares.values()))
            if method == "sera" and sampler == "after":
                verdict = "met" if shares["allocate"] < 0.01 else "NOT met"
                print(f"allocation share of the SERA step: {100 * shares['allocate']:.2f}% (target < 1%: {verdict})")
    for method in ("uniform", "sera"):
        print(f"{method}: sampling (pilot + sample) {sample_seconds['before', method]:.3f} s -> "
              f"{sample_seconds['after', method]:.3f} s per step "
              f"({sample_seconds['before', method] / sample_seconds['after', method]:.2f}x)")


if __name__ == "__main__":
    main()
