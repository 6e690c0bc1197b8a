"""The one training loop. Every run -- SFT, CE pre-training, the alignment dynamics, RL -- is a pure
``step_fn(state, step) -> (state, metrics)`` handed to ``run_loop``, which owns everything around it:

- **restore**: the latest checkpoint (state, logged metrics, evaluations) if there is one, else the given state
  (a restore says so: "resuming from step N");
  the writer then drops what the killed run logged from the checkpoint's step on, and the checkpoint's own
  evaluation scalars are written again, so the resumed run's metrics equal the uninterrupted run's;
- **the simulated kill**: a ``StepAllowance`` shared by every loop of one invocation (``--stop_after``, tests)
  raises ``StopRequested`` before the step it does not allow, as a kill would: nothing is saved then;
- **the NaN guard**: metrics are read every ``log_every`` steps and before every save; a non-finite loss stops
  the run with ``FloatingPointError`` naming the step and the last good checkpoint, which is never overwritten
  (the checkpointer also refuses to save a non-finite state);
- **evaluation** of the start (step 0), every ``eval_every`` steps and at ``num_steps``;
- **checkpoints** every ``save_every`` steps, at ``save_steps`` (0 saves the start) and at ``num_steps``;
- **progress** (a tqdm bar), **metrics** (training ones at the index of the step that produced them,
  evaluations at the number of steps done) and an **end-of-run summary** line block.

Step ``s`` takes the state from ``s`` to ``s + 1`` updates; a checkpoint at ``d`` holds the state after ``d``
updates with the metrics and evaluations up to it, so a resumed run continues exactly (the caller makes the
step a function of ``(state, s)`` alone: data position and randomness from ``s``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train.distributed import to_host
from sera_jax.train.writers import MetricWriter, flatten_metrics, print_summary, progress, status

StepFn = Callable[[Any, int], tuple[Any, dict[str, Any]]]
EvalFn = Callable[[Any, int], tuple[dict[str, Any], dict[str, float]]]  # -> (record kept, scalars written)


class StopRequested(Exception):
    """Raised when the step allowance of this invocation is spent (a simulated kill)."""


class StepAllowance:
    """Counts optimizer steps across all loops of one invocation; ``None`` means unlimited."""

    def __init__(self, limit: Optional[int]):
        self.remaining = limit

    def spend(self) -> None:
        if self.remaining is None:
            return
        if self.remaining <= 0:
            raise StopRequested("step allowance of this invocation spent")
        self.remaining -= 1


@dataclasses.dataclass
class LoopResult:
    state: Any
    history: list[dict[str, float]]  # {"step": s, **metrics} every log_every steps
    evaluations: list[dict[str, Any]]  # what ``evaluate`` kept, in step order
    start_step: int  # where this invocation started (0, or the restored checkpoint's step)


def _host_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """One device read of the step's scalar metrics (arrays such as histograms are left out; multi-host: arrays
    sharded over other hosts' devices are gathered first)."""
    return {k: float(v) for k, v in to_host(metrics).items() if np.ndim(v) == 0}


def run_loop(state: Any, step_fn: StepFn, *, num_steps: int, checkpointer: ckpt_lib.Checkpointer, desc: str,
             evaluate: Optional[EvalFn] = None, eval_every: int = 0, save_every: int = 0,
             save_steps: Sequence[int] = (), log_every: int = 1, loss_key: Optional[str] = "loss",
             writer: Optional[MetricWriter] = None, metric_prefix: str = "",
             allowance: Optional[StepAllowance] = None, show_progress: bool = True,
             num_steps_field: str = "num_steps") -> LoopResult:
    """Runs ``step_fn`` from the latest checkpoint (or ``state`` at step 0) to ``num_steps``; see the module doc.

    ``state`` is the fresh state (restore target too: its leaves' shapes, dtypes and shardings); it is donated
    to the first step if ``step_fn`` donates, so pass a copy of anything shared. ``eval_every=0`` never
    evaluates; ``save_every=0`` saves only at ``save_steps`` and at the end. A checkpoint past ``num_steps`` is a
    ValueError naming ``num_steps_field`` (the config field the caller read it from): its state and results belong
    to a longer run and would be reported under the shorter one's config.
    """
    allowance = allowance or StepAllowance(None)
    history: list[dict[str, float]] = []
    evaluations: list[dict[str, Any]] = []
    last_eval: tuple[int, dict[str, float]] = (-1, {})  # (step, scalars the writer got) of the latest evaluation
    start = checkpointer.latest_step()
    if start is None:
        start = 0
    else:
        if start > num_steps:
            raise ValueError(f"{desc}: {num_steps_field}={num_steps}, but {checkpointer.directory} holds a checkpoint "
                             f"after {start} steps (a longer run); rerun with {num_steps_field}>={start} or use "
                             "another workdir")
        status(resume_message(desc, start, num_steps, checkpointer.directory))
        state, meta = checkpointer.restore(start, ckpt_lib.abstract_like(state))
        history, evaluations = list(meta.get("history", [])), list(meta.get("evaluations", []))
        restored_eval = meta.get("eval_scalars_at_step", {})
        if writer is not None and restored_eval:
            # The writer drops what the old run logged from the checkpoint's step on (its part after the
            # checkpoint), the evaluation at that step with it; the checkpoint holds it, so it is written again.
            writer.write_scalars(start, restored_eval)
    stages = set(save_steps)

    def should_save(done: int) -> bool:
        return done == num_steps or done in stages or bool(save_every and done % save_every == 0)

    def record_evaluation(done: int) -> None:
        nonlocal last_eval
        if evaluate is None or not eval_every or any(e["step"] == done for e in evaluations):
            return  # a resumed run already has the evaluation of its checkpoint's step
        if done % eval_every and done != num_steps:
            return
        record, scalars = evaluate(state, done)
        evaluations.append({"step": done, **record})
        last_eval = (done, {k: float(v) for k, v in flatten_metrics(to_host(scalars)).items()})
        if writer is not None and scalars:
            writer.write_scalars(done, scalars)

    def save(done: int) -> None:
        try:
            eval_at_done = last_eval[1] if last_eval[0] == done else {}
            checkpointer.save(done, state, metadata={"history": history, "evaluations": evaluations,
                                                     "eval_scalars_at_step": eval_at_done}, force=True)
        except ckpt_lib.NonFiniteStateError as e:
            raise FloatingPointError(f"{desc}: non-finite state after {done} steps ({e}); training stopped. "
                                     f"{_last_good(checkpointer)}") from e

    began = time.perf_counter()
    if start == 0:
        record_evaluation(0)
        if 0 in stages:  # the start is saved only when asked for (an analysed stage)
            save(0)
    last: dict[str, float] = {}
    try:
        for step in progress(range(start, num_steps), desc=desc, disable=not show_progress):
            allowance.spend()
            state, metrics = step_fn(state, step)
            done = step + 1
            if done % log_every == 0 or should_save(done):  # reading metrics syncs the device
                last = _host_scalars(metrics)
                if loss_key is not None and loss_key in last and not math.isfinite(last[loss_key]):
                    raise FloatingPointError(f"{desc}: non-finite {loss_key} at step {step}; training stopped. "
                                             f"{_last_good(checkpointer)}")
                if done % log_every == 0:
                    history.append({"step": step, **last})
                    if writer is not None:
                        writer.write_scalars(step, {f"{metric_prefix}{k}": v for k, v in last.items()})
            record_evaluation(done)
            if should_save(done):
                save(done)
    finally:
        checkpointer.wait()
    if show_progress and num_steps > start:
        summary = {"steps": f"{start} -> {num_steps} in {time.perf_counter() - began:.0f} s", **last}
        if evaluations:
            summary["last evaluation"] = {k: v for k, v in evaluations[-1].items() if np.ndim(v) == 0}
        print_summary(summary, title=f"{desc}: done")
    return LoopResult(state, history, evaluations, start)


def resume_message(desc: str, start: int, num_steps: int, directory: Any) -> str:
    """The line a loop prints when it restores the checkpoint after ``start`` of ``num_steps`` steps."""
    left = (f"{num_steps - start} step{'s' if num_steps - start > 1 else ''} to go" if start < num_steps
            else "nothing left to train")
    return f"{desc}: resuming from step {start} of {num_steps} ({left}; checkpoint in {directory})"


def _last_good(checkpointer: ckpt_lib.Checkpointer) -> str:
    return (f"The last good checkpoint (step {checkpointer.latest_step()}) in {checkpointer.directory} "
            "is kept.")
