"""The device check of one GPU (an NVIDIA H200): the maze ``gpu`` config's RL step measured against the planner, the
non-portable attention kernels against their portable paths, and the sampler's and the update's speed, in one JSON.

    bash scripts/device_check.sh "$OUT/device_check.json"        # on the GPU machine (results/gpu/README.md)
    python scripts/device_check.py --out=results/gpu/device_check.json   # with a JAX that sees the GPU
    python scripts/device_check.py --dry_run --out=/tmp/dc.json  # every part on CPU, maze ``tiny``, tiny shapes

Parts, in this order; each is timed, given a time budget and wrapped in try/except, and the JSON is rewritten after
each (a failing part keeps what it measured before it failed and loses none of the others):

``environment``  jax/jaxlib/plugin versions, device kind, CUDA driver/runtime and cuDNN versions, nvidia-smi, the
                 git commit (or ``DEVICE_CHECK_COMMIT``) and a hash of the source, the JAX/XLA environment.
``rl_steps``     ``--steps`` RL steps (``trainer.rl_step``, the run's own step) of the config for ``--method`` from
                 a fresh, untrained policy: no SFT, no evaluation, no checkpoints (what makes it fit the time).
                 The run's jitted sampler and update are wrapped so every call is waited for and timed, and the
                 device's memory (``memory_stats()``) read after it; then the device's ``peak_bytes_in_use``.
``plan``         the planner's figures for the same config, compiled in-process on this device:
                 ``experiments.maze.experiment.planned_calls`` -> ``plan.measure_on_target`` with the ``--target``
                 figures of ``sera_jax.train.targets`` (peak bytes, FLOPs and bytes accessed, roofline time, MFU
                 bound per call), for the calls an RL step makes (the SFT step and evaluation sampling are listed
                 as not planned: the check runs neither).
``throughput``   the step's rollout-sampling call and its update called again ``--repeats`` times (compiled
                 already): sampler tokens/s, and the update's MFU from its model FLOPs (``update_model_flops``)
                 over its time over the target's peak bf16 FLOP/s; a bf16 matmul's measured FLOP/s besides.
``kernels``      every non-portable implementation of ``sera_jax.models.attention`` / ``decode_attention`` on
                 this device, and the portable path beside it, forward and gradients (w.r.t. q, k, v), at bfloat16
                 and float32, each against a float32 dense reference run at HIGHEST matmul precision on the same
                 rounded inputs: max abs and normwise relative error, pass/fail at ``TOLERANCES``. cuDNN
                 (``"cudnn"``) runs on a GPU (bf16/f16 only: at float32 it is not applicable and ``"auto"`` takes
                 ``"blockwise"``, checked instead), and its program must hold cuDNN's ``__cudnn$fmha*`` custom
                 calls; the Pallas TPU kernel (``"pallas_tpu"``) is TPU-only, listed as not applicable;
                 ``decode_attention`` has no kernel wired in (its GPU path, ``"batched"``, is pure JAX): checked
                 forward against its dense reference (decoding is never differentiated).

``comparison`` (derived from the parts whenever the JSON is written): measured peak memory over the planner's
peak of the step's calls, each call's measured time over its roofline time, and the update's MFU.

Every part's entry: ``status`` (``ok``, ``partial``: its budget cut some work, listed in ``skipped_work``;
``failed``: an exception, kept in ``error``; ``skipped``: not started, no time left), ``wall_seconds``,
``budget_seconds``, ``result``. Exit status: 0 when every part is ``ok``, 1 when any failed, 3 when none failed but
one was cut short or skipped, 2 when a non-dry run finds no GPU, 124 when SIGTERM (the wrapper's time limit) arrived:
the part it landed in is ``failed`` with a ``TimeLimit`` error, and the JSON is written.

The dry run (``--dry_run``) runs every part on CPU with the maze ``tiny`` config and tiny kernel shapes: CPU has no
``memory_stats``, so memory is the bytes of live arrays sampled around each call (a lower bound; the JSON says
so), and cuDNN is replaced by its span mapping through XLA's attention (``sdpa_implementation="xla"``), marked
``stand_in``. It checks this script, not the device.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sera_jax.models.flops import head_flops, sequence_training_flops, shared_prompt_training_flops  # noqa: E402
from sera_jax.train.config_utils import to_jsonable  # noqa: E402

SCHEMA = "sera_jax.device_check/1"
PARTS = ("environment", "rl_steps", "plan", "throughput", "kernels")
STEP_CALLS = ("update", "rollout sampling", "pilot sampling")  # the planned calls an RL step makes (planning order)
# Seconds per part on the GPU (the whole run must stay under 8 minutes with JAX's start and the install):
# rl_steps holds the first step's compilation (sampler twice, update), plan three more compilations.
PART_BUDGETS = {"environment": 20.0, "rl_steps": 170.0, "plan": 110.0, "throughput": 40.0, "kernels": 70.0}
TOTAL_BUDGET = 440.0
DRY_BUDGET = 3600.0
# Normwise relative error (max |x - ref| / max |ref|) allowed against the float32 reference (dense attention at
# HIGHEST matmul precision on the same rounded inputs). bfloat16: 8 significand bits (unit roundoff 2^-9 ~ 0.002),
# and the kernels round the probabilities and the backward's intermediates to bf16 too; 3e-3 to 5e-3 measured on
# CPU, and the suite allows 6e-2 between blockwise and dense at bf16 (tests/models/test_attention.py). float32: the
# candidate runs at HIGHEST precision as well (at JAX's default, XLA:GPU rounds float32 dot operands to TF32, unit
# roundoff 2^-11, which would hide an algorithmic error of 1e-3); ~1e-7 measured on CPU. A wrong mask or gradient
# is off by 0.1 to 1.
TOLERANCES = {"bfloat16": 5e-2, "float32": 1e-4}
GPU_TARGET = "h200"


# --- small pure helpers ------------------------------------------------------------------------------------------

def update_model_flops(cfg: Any, prompts: int, prompt_len: int, rollouts: int, response_len: int,
                       share_prompts: bool = True) -> float:
    """Model FLOPs of one RL update at its padded shapes (``sera_jax.models.flops``: 3 x the forward; the recompute
    of ``remat`` is not counted, as MFU does not count it).

    ``share_prompts``: P prompts of T tokens once (query i sees i + 1 keys) and B rollouts feeding R - 1 response
    tokens (response token j sees T + j + 1 keys); otherwise B joined sequences of T + R - 1 tokens. Either way R
    tokens a rollout are scored (the first from the last prompt position): one more than are fed, where the
    planner (``sera_jax.rl.memory``) feeds and scores R."""
    p, t, b, r = prompts, prompt_len, rollouts, response_len
    if share_prompts:
        return shared_prompt_training_flops(cfg, p, t, b, r - 1) + 3 * b * head_flops(cfg)
    return sequence_training_flops(cfg, b, t + r - 1, r)


def error_stats(got: Any, ref: Any, tolerance: float, mask: Any = None) -> dict[str, Any]:
    """``max_abs_err`` = max |got - ref| (over ``mask`` where given), ``max_rel_err`` = that over max |ref|
    (normwise: an elementwise relative error is meaningless where ref ~ 0), and ``pass``: finite and
    ``max_rel_err <= tolerance``."""
    import numpy as np

    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if mask is not None:
        keep = np.broadcast_to(np.asarray(mask, bool).reshape(mask.shape + (1,) * (got.ndim - np.ndim(mask))),
                               got.shape)
        got, ref = got[keep], ref[keep]
    if got.size == 0:
        raise ValueError("error_stats: nothing to compare (the mask keeps no element)")
    diff = np.abs(got - ref)
    finite = bool(np.all(np.isfinite(got)))
    max_abs = float(np.max(diff)) if finite else float("inf")
    scale = float(np.max(np.abs(ref)))
    rel = max_abs / scale if scale > 0 else max_abs
    return {"max_abs_err": max_abs, "max_rel_err": rel, "ref_max_abs": scale, "tolerance": tolerance,
            "finite": finite, "pass": finite and rel <= tolerance}


def median(values: Sequence[float]) -> Optional[float]:
    return float(statistics.median(values)) if values else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a / b, None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return float(a) / float(b)


def jsonable(x: Any) -> Any:
    """``x`` as strict JSON: ``to_jsonable``'s conversion (numpy scalars and arrays as Python numbers and lists,
    dtypes as their names), with non-finite floats as None (``to_jsonable`` keeps them, which Python's json writes
    as NaN/Infinity) and a value it cannot convert as its ``str`` (the report is written whatever a part holds)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    try:
        converted = to_jsonable(x)
    except ValueError:
        return str(x)
    if isinstance(converted, float):
        return float(converted) if math.isfinite(converted) else None
    return converted if converted is x else jsonable(converted)


def overall_status(parts: dict[str, dict]) -> str:
    """``ok`` when every part is, ``failed`` when any failed, else ``incomplete``."""
    statuses = [p.get("status") for p in parts.values()]
    if any(s == "failed" for s in statuses):
        return "failed"
    return "ok" if statuses and all(s == "ok" for s in statuses) else "incomplete"


def exit_code(status: str) -> int:
    return {"ok": 0, "failed": 1}.get(status, 3)


class Budget:
    """A part's time: ``seconds`` from now, and never past the run's ``deadline`` (``time.monotonic``)."""

    def __init__(self, seconds: float, deadline: float):
        self.start = time.monotonic()
        self.seconds = seconds
        self.deadline = min(self.start + seconds, deadline)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, estimate: float) -> bool:
        """Whether work expected to take ``estimate`` seconds still fits."""
        return self.left() > estimate


# --- measuring the run's own calls ---------------------------------------------------------------------------------

def set_compilation_cache(enabled: bool) -> Optional[bool]:
    """Turns JAX's persistent compilation cache on or off; the previous setting (None where this JAX cannot)."""
    import jax

    try:
        previous = bool(jax.config.jax_enable_compilation_cache)
        jax.config.update("jax_enable_compilation_cache", enabled)
        return previous
    except (AttributeError, KeyError, ValueError):
        return None


def device_memory(device: Any) -> Optional[dict[str, int]]:
    """The device allocator's ``bytes_in_use``, ``peak_bytes_in_use`` and ``bytes_limit`` (None where the backend
    keeps no statistics: CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # a backend without statistics may raise instead of answering None
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}


def live_bytes(device: Any) -> int:
    """Bytes of the live JAX arrays on ``device`` (the dry run's stand-in for the allocator: no temporaries)."""
    import jax

    total = 0
    for x in jax.live_arrays():
        with contextlib.suppress(Exception):
            if device in x.devices():
                total += x.nbytes // max(1, len(x.devices()))
    return total


class MemoryProbe:
    """Bytes in use and their peak: the allocator's (GPU) or the live arrays' sampled at each ``read`` (CPU)."""

    def __init__(self, device: Any):
        self.device = device
        self.source = "memory_stats" if device_memory(device) is not None else "live_arrays"
        self.sampled_peak = 0

    def read(self) -> dict[str, int]:
        stats = device_memory(self.device) if self.source == "memory_stats" else None
        if stats is not None:
            return stats
        now = live_bytes(self.device)
        self.sampled_peak = max(self.sampled_peak, now)
        return {"bytes_in_use": now, "peak_bytes_in_use": self.sampled_peak}


@dataclasses.dataclass
class CallRecord:
    """One call of the run's jitted sampler or update, waited for."""

    name: str  # the planner's name for it: "pilot sampling", "rollout sampling", "update"
    step: int
    seconds: float
    rows: int
    bytes_in_use_before: int
    bytes_in_use_after: int
    peak_bytes_after: int  # the device's running peak once the call is done
    generated_tokens: Optional[int] = None  # sampling calls: sum of response lengths
    max_length: Optional[int] = None


class CallTimer:
    """Wraps the run's sampler and update (``trainer.make_context(update_fn=..., sample_fns=...)``): each call is
    waited for, timed and followed by a memory reading; the last arguments of each call are kept for ``throughput``.
    A step's first sampling call is the pilot when the method has one (``rl_step`` samples it first)."""

    def __init__(self, memory: MemoryProbe, has_pilot: bool):
        self.memory, self.has_pilot = memory, has_pilot
        self.records: list[CallRecord] = []
        self.step, self._sampling_calls = -1, 0
        self.last_args: dict[str, tuple] = {}

    def begin_step(self, step: int) -> None:
        self.step, self._sampling_calls = step, 0

    def _timed(self, name: str, fn: Callable, args: tuple, rows: int):
        import jax

        before = self.memory.read()["bytes_in_use"]
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        seconds = time.perf_counter() - start
        after = self.memory.read()
        record = CallRecord(name, self.step, seconds, rows, before, after["bytes_in_use"], after["peak_bytes_in_use"])
        self.records.append(record)
        return out, record

    def sampler(self, fn: Callable) -> Callable:
        import numpy as np

        def timed(params, *rest):
            name = "pilot sampling" if self.has_pilot and self._sampling_calls == 0 else "rollout sampling"
            self._sampling_calls += 1
            out, record = self._timed(name, fn, (params, *rest), int(rest[2].shape[0]))
            lengths = np.asarray(out.lengths_B)
            record.generated_tokens, record.max_length = int(lengths.sum()), int(lengths.max(initial=0))
            self.last_args[name] = rest  # everything but the parameters (the update donates them)
            return out

        return timed

    def update(self, fn: Callable) -> Callable:
        def timed(state, batch, advantages_B):
            out, _ = self._timed("update", fn, (state, batch, advantages_B), int(advantages_B.shape[0]))
            self.last_args["update"] = (batch, advantages_B)  # not donated (only the state is)
            return out

        return timed


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's scalar metrics as floats (arrays of one element included)."""
    import numpy as np

    out = {}
    for k, v in metrics.items():
        with contextlib.suppress(TypeError, ValueError):
            a = np.asarray(v)
            if a.size == 1:
                out[k] = float(a.reshape(()))
    return out


def summarize_calls(records: Sequence[CallRecord], first_timed_step: int) -> dict[str, dict[str, Any]]:
    """Per call name: calls, median seconds of the calls from ``first_timed_step`` on (step 0 compiles; all calls
    when no later step ran, flagged ``includes_compilation``), rows, tokens, and the device's peak so far right
    after its first call."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({r.name for r in records}):
        calls = [r for r in records if r.name == name]
        timed = [r for r in calls if r.step >= first_timed_step] or calls
        entry = {"calls": len(calls), "timed_calls": len(timed), "rows": calls[-1].rows,
                 "seconds_median": median([r.seconds for r in timed]),
                 "seconds_first_call": calls[0].seconds,
                 "includes_compilation": all(r.step < first_timed_step for r in timed),
                 # The device's peak so far, read right after this call's first run (step 0 calls the pilot, the
                 # rollouts, the update in that order): this call's own peak, or an earlier call's.
                 "peak_bytes_so_far_after_first_call": calls[0].peak_bytes_after,
                 "max_bytes_in_use_after": max(r.bytes_in_use_after for r in calls)}
        if calls[0].generated_tokens is not None:
            tokens = sum(r.generated_tokens for r in timed)
            entry.update(generated_tokens=tokens, tokens_per_second=ratio(tokens, sum(r.seconds for r in timed)),
                         max_length=max(r.max_length for r in calls))
        out[name] = entry
    return out


# --- the parts ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Settings:
    dry_run: bool
    config: str  # experiments/maze/config.py:VARIANT
    method: str
    steps: int
    repeats: int
    target: str
    seed: int
    part_budgets: dict[str, float]
    total_budget: float
    parts: tuple[str, ...]
    out: pathlib.Path


@dataclasses.dataclass
class Handles:
    """What ``rl_steps`` leaves for ``throughput``: the run's context, its last state and the wrapped calls."""

    ctx: Any
    state: Any
    timer: CallTimer
    sample_fn: Callable  # the unwrapped sampler
    update_fn: Callable  # the unwrapped update
    model_cfg: Any


class Check:
    """Runs the parts of ``settings``, keeping the report and writing it after each part."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.start = time.monotonic()
        self.deadline = self.start + settings.total_budget
        self.report: dict[str, Any] = {
            "schema": SCHEMA, "dry_run": settings.dry_run, "config": settings.config, "method": settings.method,
            "target": settings.target, "steps_requested": settings.steps, "repeats_requested": settings.repeats,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "budget_seconds": {"total": settings.total_budget, **settings.part_budgets},
            "tolerances": dict(TOLERANCES), "status": "running", "parts": {}, "comparison": {}}
        self.handles: Optional[Handles] = None
        self.config = None

    # -- bookkeeping

    def write(self) -> None:
        from sera_jax.train.files import write_text_atomic

        r = self.report
        r["wall_seconds"] = time.monotonic() - self.start
        r["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        try:
            r["comparison"] = comparison(r["parts"], self.target_figures())
        except Exception as e:  # a derived section must never lose the parts
            r["comparison"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        self.settings.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.settings.out, json.dumps(jsonable(r), indent=2, sort_keys=True) + "\n")

    def target_figures(self) -> dict[str, float]:
        from sera_jax.train import targets

        t = targets.get_target(self.settings.target, "cuda")
        return {"name": t.name, "peak_flops": t.peak_flops, "hbm_bytes": t.hbm_bytes, "hbm_bandwidth": t.hbm_bandwidth}

    def run_part(self, name: str, fn: Callable[[Budget, dict, list], None]) -> None:
        """Runs ``fn(budget, result, skipped_work)``: what it put into ``result`` is kept whatever happens."""
        seconds = self.settings.part_budgets[name]
        entry = {"status": "running", "budget_seconds": seconds, "wall_seconds": 0.0, "error": None,
                 "skipped_work": [], "result": {}}
        self.report["parts"][name] = entry
        if name not in self.settings.parts:
            entry.update(status="skipped", skipped_work=[f"{name}: not among --parts"])
            self.write()
            return
        budget = Budget(seconds, self.deadline)
        if budget.left() <= 0:
            entry.update(status="skipped", skipped_work=[f"{name}: no time left in the run's budget"])
            self.write()
            return
        self.write()  # a run killed inside this part still says which part it was in
        start = time.perf_counter()
        try:
            fn(budget, entry["result"], entry["skipped_work"])
            entry["status"] = "partial" if entry["skipped_work"] else "ok"
        except Exception as e:  # reported in the JSON; the other parts still run
            entry["status"] = "failed"
            entry["error"] = {"type": type(e).__name__, "message": str(e)[:4000],
                              "traceback": traceback.format_exc()[-8000:]}
            print(f"device_check: part {name} FAILED: {type(e).__name__}: {str(e)[:400]}", file=sys.stderr, flush=True)
        entry["wall_seconds"] = time.perf_counter() - start
        print(f"device_check: part {name}: {entry['status']} ({entry['wall_seconds']:.1f} s)", file=sys.stderr,
              flush=True)
        self.write()

    def killed(self, why: str) -> None:
        """The time limit's signal arrived: the part that was running failed with it; the JSON is written."""
        for entry in self.report["parts"].values():
            if entry["status"] == "running":
                entry.update(status="failed", error={"type": "TimeLimit", "message": why, "traceback": ""})
        self.report["status"] = "failed"
        self.write()

    def run(self) -> int:
        import jax

        if not self.settings.dry_run and jax.default_backend() != "gpu":
            self.report["status"] = "failed"
            self.report["error"] = (f"no GPU: JAX's default backend is {jax.default_backend()!r} (jax "
                                    f"{jax.__version__}); install the CUDA plugin (scripts/device_check.sh does) or "
                                    "use --dry_run")
            self.write()
            print(f"device_check: {self.report['error']}", file=sys.stderr)
            return 2
        for name in PARTS:
            self.run_part(name, getattr(self, f"part_{name}"))
        self.report["status"] = overall_status(self.report["parts"])
        self.write()
        return exit_code(self.report["status"])

    # -- the parts

    def device(self):
        import jax

        return jax.devices()[0]

    def load_config(self):
        """The config of ``--config`` with ``--method``'s ``sera`` fields, SFT off (the check starts RL from a
        fresh policy); everything else as the variant sets it."""
        if self.config is None:
            from experiments.maze import experiment as maze_exp
            from sera_jax.train import cli

            config = maze_exp.method_config(cli.load_config_spec(self.settings.config), self.settings.method)
            with config.unlocked():
                config.sft.steps = 0
            self.config = config
        return self.config

    def part_environment(self, budget: Budget, result: dict, skipped: list) -> None:
        result.update(environment(self.device()))

    def part_rl_steps(self, budget: Budget, result: dict, skipped: list) -> None:
        import jax
        from flax import nnx

        from experiments.maze import experiment as maze_exp
        from sera_jax.rl import trainer
        from sera_jax.rl.config import prompts_fetched_per_step, uses_pilot
        from sera_jax.train import sharding as sharding_lib

        config = self.load_config()
        device = self.device()
        memory = MemoryProbe(device)
        result["memory_source"] = memory.source if memory.source == "memory_stats" else (
            "live_arrays: bytes of live arrays sampled around each call (no allocator statistics on this backend; "
            "a lower bound: temporaries are not seen)")
        result["memory_at_start"] = memory.read()
        task = maze_exp.make_task(config)
        placement = sharding_lib.make_placement(config.mesh, [device])  # one device: no mesh
        model = maze_exp.build_model(config, self.settings.seed)
        model_cfg = model.cfg
        graphdef, params = nnx.split(model)
        tx, update_fn = trainer.make_update(graphdef, config)
        sample_fns = trainer.make_sample_fns(graphdef, task, config)
        timer = CallTimer(memory, uses_pilot(config))
        ctx = trainer.make_context(task, graphdef, config, placement=placement, update_fn=timer.update(update_fn),
                                   sample_fns=trainer.SampleFns(train=timer.sampler(sample_fns.train),
                                                                eval=sample_fns.eval))
        state = trainer.init_state(ctx, params, tx)
        del model, params
        prompts_of_step = trainer.data_order(task, config, self.settings.seed)
        base_key = jax.random.key(self.settings.seed)
        c = config
        result["shapes"] = {"prompts_per_step": c.rl.prompts_per_step, "rollouts_per_step": c.rl.rollouts_per_step,
                            "prompt_len": int(task.eval_prompts().tokens_PxT.shape[1]),
                            "max_new_tokens": task.max_new_tokens, "pilot_rollouts": c.sera.pilot_rollouts,
                            "model": dataclasses.asdict(model_cfg)}
        result["policy"] = "fresh (untrained) parameters: responses mostly run to the cap, the sampler's worst case"
        steps = result["steps"] = []
        self.handles = Handles(ctx, state, timer, sample_fns.train, update_fn, model_cfg)
        try:
            for s in range(self.settings.steps):
                # Step 1 is always tried while the part has time (step 0 compiles: its time predicts nothing).
                if s and not budget.allows(steps[-1]["wall_seconds"] if s > 1 else 0.0):
                    skipped.append(f"rl_steps: steps {s}..{self.settings.steps - 1} (budget: {budget.left():.0f} s "
                                   f"left, the last step took {steps[-1]['wall_seconds']:.0f} s)")
                    break
                timer.begin_step(s)
                start = time.perf_counter()
                prompts = prompts_of_step(s, prompts_fetched_per_step(c))
                state, metrics = trainer.rl_step(ctx, state, prompts, jax.random.fold_in(base_key, s))
                jax.block_until_ready(state)
                self.handles.state = state
                m = scalar_metrics(metrics)
                steps.append({"step": s, "wall_seconds": time.perf_counter() - start, "memory_after": memory.read(),
                              **{k: m[k] for k in sorted(m) if k in STEP_METRICS or k.startswith("time_share/")}})
        finally:  # what was measured is kept when a step fails
            result["steps_done"] = len(steps)
            result["calls"] = summarize_calls(timer.records, first_timed_step=1)
            later = [x["wall_seconds"] for x in steps[1:]]
            result["step_seconds_median"] = median(later)
            result["step_seconds_first"] = steps[0]["wall_seconds"] if steps else None
            result["memory_after_steps"] = memory.read()
            result["peak_bytes"] = result["memory_after_steps"]["peak_bytes_in_use"]
            result["peak_note"] = ("the device's peak over the whole part: the steps' calls, and whatever XLA "
                                   "allocated while compiling them (autotuning)")
            result["tokens_sampled_per_step_median"] = median([x.get("tokens_sampled", 0.0) for x in steps[1:]])
        if len(steps) < 2:
            skipped.append("rl_steps: no step after the first (which compiles), so no step time")

    def part_plan(self, budget: Budget, result: dict, skipped: list) -> None:
        from experiments.maze import experiment as maze_exp
        from sera_jax.models import attention
        from sera_jax.train import plan as plan_lib
        from sera_jax.train import targets

        config = self.load_config()
        device = self.device()
        target = targets.per_device(targets.get_target(self.settings.target, "cuda"),
                                    targets.devices_per_chip([device]))
        dry = self.settings.dry_run
        result["compiler"] = (f"XLA:CPU (dry run, traced as the CPU runs; the {target.label}'s roofline)" if dry
                              else f"XLA:GPU in-process on {device.device_kind}")
        result["target"] = {"name": target.name, "peak_flops": target.peak_flops, "hbm_bytes": target.hbm_bytes,
                            "hbm_bandwidth": target.hbm_bandwidth}
        # What the planner's --target path traces with: attention resolved for CUDA (on the GPU itself, the same as
        # the default). The dry run traces as this CPU runs (not the planner's compile-only CPU fallback), so that
        # with a persistent compilation cache its update is the one rl_steps compiled.
        tracing = contextlib.nullcontext() if dry else attention.lowering_for("cuda")
        calls_out = result["calls"] = {}
        not_planned = result["not_planned"] = {}
        last = 0.0
        first_call_seconds = {}
        if self.handles is not None:
            for r in reversed(self.handles.timer.records):
                if r.step == 0:
                    first_call_seconds[r.name] = r.seconds
        # Fresh compilations, each with its own memory analysis (not an executable read from a persistent cache).
        cache = None if dry else set_compilation_cache(False)
        try:
            with tracing:
                calls = {c.name: c for c in maze_exp.planned_calls(config, [device])}
                for name in calls:
                    if name not in STEP_CALLS:
                        not_planned[name] = "not made by an RL step (this check runs no SFT and no evaluation)"
                for name in STEP_CALLS:
                    if name not in calls:
                        continue  # a method without a pilot
                    # Its compilation takes about what the run's first call of it took (compilation + one run).
                    estimate = first_call_seconds.get(name, last)
                    if calls_out and not budget.allows(estimate):
                        skipped.append(f"plan: {name} (budget: {budget.left():.0f} s left, its compilation is "
                                       f"expected to take {estimate:.0f} s)")
                        continue
                    row = plan_lib.measure_on_target(calls[name], target)
                    m = row.memory
                    last = m.compile_seconds
                    calls_out[name] = {"peak_bytes": m.peak_bytes, "argument_bytes": m.argument_bytes,
                                       "temp_bytes": m.temp_bytes, "output_bytes": m.output_bytes,
                                       "alias_bytes": m.alias_bytes, "flops": row.flops,
                                       "bytes_accessed": row.bytes_accessed, "has_loop": row.has_loop,
                                       "roofline_seconds": row.roofline_seconds, "mfu_bound": row.mfu_bound,
                                       "compile_seconds": m.compile_seconds, "note": m.note}
        finally:
            if cache is not None:
                set_compilation_cache(cache)
        result["has_loop_note"] = ("has_loop: XLA's cost analysis counts a loop body once (decoding, scanned layers, "
                                   "blockwise attention), so that call's FLOPs, bytes and roofline are lower bounds")

    def part_throughput(self, budget: Budget, result: dict, skipped: list) -> None:
        import jax
        import numpy as np

        from sera_jax.rl import step as step_lib

        h = self.handles
        if h is None or "rollout sampling" not in h.timer.last_args or "update" not in h.timer.last_args:
            raise RuntimeError("throughput re-times the calls of rl_steps, which made none (see its status)")
        repeats = self.settings.repeats
        args = h.timer.last_args["rollout sampling"]
        times, tokens, longest = [], [], []
        for i in range(repeats):
            if times and not budget.allows(2 * times[-1]):
                skipped.append(f"throughput: sampler repeats {i}..{repeats - 1} (budget)")
                break
            start = time.perf_counter()
            out = jax.block_until_ready(h.sample_fn(h.state.params, *args))
            times.append(time.perf_counter() - start)
            lengths = np.asarray(out.lengths_B)
            tokens.append(int(lengths.sum()))
            longest.append(int(lengths.max(initial=0)))
        rows = int(args[2].shape[0])
        sec = median(times)
        result["sampler"] = {"call": "rollout sampling", "rows": rows, "repeats": len(times), "seconds": times,
                             "seconds_median": sec, "generated_tokens": tokens[-1],
                             "tokens_per_second": ratio(tokens[-1], sec), "rollouts_per_second": ratio(rows, sec),
                             "decode_iterations": longest[-1],
                             "slot_steps_per_second": ratio(rows * longest[-1], sec),
                             "note": "a call's wall time (prefill, decoding, the draw), compiled already; the same "
                                     "key each repeat, so the same rollouts"}
        batch, adv = h.timer.last_args["update"]
        train = step_lib.TrainState(h.state.params, h.state.opt_state, h.state.step)
        h.state = None  # the update donates these buffers: nothing else may use them
        times = []
        for i in range(repeats):
            if times and not budget.allows(2 * times[-1]):
                skipped.append(f"throughput: update repeats {i}..{repeats - 1} (budget)")
                break
            start = time.perf_counter()
            train, metrics = jax.block_until_ready(h.update_fn(train, batch, adv))
            times.append(time.perf_counter() - start)
        c = self.load_config()
        cfg = h.model_cfg
        b = int(adv.shape[0])
        if c.rl.share_prompts:  # step.SharedPromptBatch: the prompts once, the rollouts' responses
            p, t = (int(x) for x in batch.prompt_tokens_PxT.shape)
            r = int(batch.rows.response_BxR.shape[1])
        else:  # step.SequenceBatch: joined sequences
            r = int(batch.weights_BxR.shape[1])
            p, t = 0, int(batch.tokens_BxL.shape[1]) - r
        flops = update_model_flops(cfg, p, t, b, r, c.rl.share_prompts)
        peak = self.target_figures()["peak_flops"]
        sec = median(times)
        result["update"] = {"repeats": len(times), "seconds": times, "seconds_median": sec,
                            "shapes": {"prompts": p, "prompt_len": t, "rollouts": b, "response_len": r,
                                       "share_prompts": bool(c.rl.share_prompts), "remat": cfg.remat},
                            "model_flops": flops, "model_flops_per_second": ratio(flops, sec),
                            "mfu": ratio(ratio(flops, sec), peak), "peak_flops": peak,
                            "note": "MFU = update_model_flops (3 x forward at the padded shapes, no remat recompute) "
                                    "/ median time / the target's dense bf16 peak"}
        result["matmul"] = matmul_rate(8192 if not self.settings.dry_run else 256, repeats=3)
        result["update"]["fraction_of_measured_matmul"] = ratio(result["update"]["model_flops_per_second"],
                                                                result["matmul"]["flops_per_second"])

    def part_kernels(self, budget: Budget, result: dict, skipped: list) -> None:
        from flax import nnx

        from experiments.maze import experiment as maze_exp
        from experiments.maze.task import MazeTask
        from sera_jax.envs import maze
        from sera_jax.models import attention as A

        config = self.load_config()
        cfg = nnx.eval_shape(lambda: maze_exp.build_model(config, 0)).cfg
        prompt_len = maze.prompt_length(config.maze.size)
        response_len = MazeTask.response_cap(config)
        dry = self.settings.dry_run
        platform = A.target_platform()
        result["platform"] = platform
        result["implementations"] = {
            "attention.cudnn": "non-portable: cuDNN fused attention through jax.nn.dot_product_attention (GPU; "
                               "bf16/f16, head_dim % 8 == 0 and <= 128, full sequences); portable path: blockwise",
            "attention.pallas_tpu": "non-portable: JAX's Pallas TPU flash attention (TPU only); portable path: "
                                    "blockwise",
            "attention.blockwise": "portable: flash attention in pure JAX with its own backward (what 'auto' takes "
                                   "where no kernel applies)",
            "attention.dense": "the reference",
            "decode_attention.batched": "portable (pure JAX): the accelerators' decode path ('auto' off CPU); no "
                                        "kernel is wired in (decode_attention's docstring)",
            "decode_attention.dense": "the reference"}
        result["auto_resolves_to"] = {
            dtype: A.resolve_implementation("auto", prompt_len, prompt_len, dtype, cfg.head_dim)
            for dtype in ("bfloat16", "float32")}
        shapes = kernel_shapes(cfg, prompt_len, response_len, dry)
        result["shapes"] = shapes
        checks = result["checks"] = []
        plan = kernel_plan(platform, shapes, dry)
        last = 0.0
        for spec in plan:
            if spec.get("not_applicable"):
                checks.append(spec)
                continue
            if checks and not budget.allows(2 * last):
                skipped.append(f"kernels: {spec['name']} (budget: {budget.left():.0f} s left)")
                continue
            start = time.perf_counter()
            record = run_kernel_check(spec)
            last = record["seconds"] = time.perf_counter() - start
            checks.append(record)
        ran = [c for c in checks if not c.get("not_applicable")]
        result["all_pass"] = bool(ran) and all(c["pass"] for c in ran)
        if not result["all_pass"]:
            failing = [c["name"] for c in ran if not c["pass"]]
            raise AssertionError(f"kernel checks out of tolerance: {failing or 'none ran'}")


STEP_METRICS = ("step_seconds", "tokens_sampled", "response_len_mean", "reward_mean", "truncated_frac",
                "rollouts_sampled", "loss", "grad_norm", "counts_min", "counts_max")


def environment(device: Any) -> dict[str, Any]:
    """Versions, device, driver and CUDA, the code's identity, and the JAX/XLA settings of this process."""
    import jax

    from sera_jax.train import writers

    def version(name: str) -> Optional[str]:
        from importlib import metadata

        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    packages = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
                "flax", "optax", "orbax-checkpoint", "chex", "numpy", "ml_dtypes", "ml-collections",
                "nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                           "packages": {p: version(p) for p in packages},
                           "backend": jax.default_backend(), "device_count": jax.device_count(),
                           "device_kind": device.device_kind, "platform": device.platform,
                           "platform_version": _safe(lambda: device.client.platform_version),
                           "compute_capability": getattr(device, "compute_capability", None),
                           "memory": _safe(lambda: device_memory(device)),
                           "cuda_versions": cuda_versions(), "nvidia_smi": nvidia_smi(),
                           "jax_env": {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_"))},
                           "default_matmul_precision": _safe(lambda: str(jax.config.jax_default_matmul_precision))}
    env["jax_in_project_range"] = jax_in_project_range(env["packages"]["jax"])
    # How scripts/device_check.sh found this Python (venv, venv+pip, offline system python3, or given).
    env["setup"] = os.environ.get("DEVICE_CHECK_SETUP")
    env["setup_seconds"] = float(os.environ["DEVICE_CHECK_SETUP_SECONDS"]) if os.environ.get(
        "DEVICE_CHECK_SETUP_SECONDS", "").isdigit() else None
    provenance = _safe(writers.run_provenance) or {}
    env["git_commit"] = os.environ.get("DEVICE_CHECK_COMMIT") or provenance.get("commit")
    env["git_dirty"] = provenance.get("dirty")
    env["source_sha256"] = source_hash()
    return env


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # a missing figure, not a failed part
        return f"unavailable: {type(e).__name__}: {str(e)[:200]}"


def cuda_versions() -> dict[str, Any]:
    """What the JAX CUDA plugin reports (``jax._src.lib.cuda_versions``: cuDNN, CUDA runtime/driver, cuBLAS...)."""
    try:
        from jax._src.lib import cuda_versions as mod
    except Exception as e:
        return {"unavailable": f"{type(e).__name__}: {e}"}
    if mod is None:
        return {"unavailable": "no CUDA plugin"}
    out = {}
    for name in sorted(dir(mod)):
        if name.endswith("_version") and callable(getattr(mod, name)):
            out[name] = _safe(getattr(mod, name))
    return out


def nvidia_smi() -> Optional[dict[str, str]]:
    """``nvidia-smi``'s name, driver, memory, power limit and clocks of the first GPU, and the CUDA version its header
    names (None without nvidia-smi). A driver that refuses a field is asked for the basic ones only."""
    def query(fields: str) -> Optional[dict[str, str]]:
        try:
            done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or not done.stdout.strip():
            return None
        return dict(zip(fields.split(","), (v.strip() for v in done.stdout.strip().splitlines()[0].split(","))))

    info = (query("name,driver_version,memory.total,power.limit,clocks.max.sm,clocks.max.memory,pstate,temperature.gpu")
            or query("name,driver_version,memory.total"))
    if info is None:
        return None
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=15).stdout
        m = re.search(r"CUDA Version:\s*([0-9.]+)", header)
        if m:
            info["cuda_driver_api"] = m.group(1)
    return info


def jax_in_project_range(jax_version: Optional[str]) -> Optional[bool]:
    """Whether ``jax_version`` satisfies setup.py's ``jax`` requirement (None when either cannot be read)."""
    try:
        from packaging.specifiers import SpecifierSet

        spec = re.search(r'"jax([<>=!~][^"]*)"', (REPO / "setup.py").read_text()).group(1)
        return jax_version in SpecifierSet(spec) if jax_version else None
    except Exception:
        return None


def source_hash() -> str:
    """sha256 over the check's code (sera_jax/, experiments/, this script, setup.py): ties the JSON to the code
    where the copy on the GPU machine has no .git."""
    h = hashlib.sha256()
    files = sorted([*REPO.glob("sera_jax/**/*.py"), *REPO.glob("sera_jax/**/*.txtpb"),
                    *REPO.glob("experiments/**/*.py"),
                    REPO / "scripts" / "device_check.py", REPO / "setup.py"])
    for f in files:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def matmul_rate(n: int, repeats: int = 3) -> dict[str, Any]:
    """Measured FLOP/s of an n x n x n bfloat16 matmul (float32 accumulation), the median of ``repeats`` calls."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    fn = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    jax.block_until_ready(fn(a, b))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(a, b))
        times.append(time.perf_counter() - start)
    sec = median(times)
    return {"n": n, "seconds_median": sec, "flops_per_second": ratio(2.0 * n**3, sec)}


# --- kernel checks -----------------------------------------------------------------------------------------------

def kernel_shapes(cfg: Any, prompt_len: int, response_len: int, dry_run: bool) -> dict[str, Any]:
    """The kernels' problem sizes from the config's model and maze: full sequences of the prompt (the update's
    prompt pass and the sampler's prefill, where "auto" takes cuDNN) and of prompt + response (the joined layout,
    ``rl.share_prompts=False``); a decoding step over prompts of that length and responses of the cap. The dry run
    has small batches and the prompt length only."""
    heads = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim}
    rows, slots, prompts = (5, 13, 4) if dry_run else (32, 512, 32)
    full = [{"name": "prompt", "batch": rows, "length": prompt_len, **heads}]
    if not dry_run:  # the same code on a second length: the dry run checks the code, not the kernels
        full.append({"name": "prompt+response", "batch": rows, "length": prompt_len + response_len, **heads})
    return {"full": full,
            "decode": {"slots": slots, "prompts": prompts, "prompt_len": prompt_len, "response_len": response_len,
                       **heads}}


def kernel_plan(platform: str, shapes: dict[str, Any], dry_run: bool) -> list[dict[str, Any]]:
    """The checks to run on ``platform``: per dtype, the non-portable implementation that applies there (cuDNN on
    CUDA; its stand-in in the dry run) and the portable path, each against the reference; the decode path; and
    the implementations that do not apply, with the reason."""
    plan: list[dict[str, Any]] = []
    cudnn_runs = platform == "cuda" or dry_run
    for shape in shapes["full"]:
        for dtype in ("bfloat16", "float32"):
            where = f"{shape['name']}, {dtype}"
            if dtype == "bfloat16" and cudnn_runs:
                plan.append({"name": f"attention.cudnn ({where})", "kind": "full", "implementation": "cudnn",
                             "stand_in": platform != "cuda", "dtype": dtype, "shape": shape})
            elif dtype == "bfloat16":
                plan.append({"name": f"attention.cudnn ({where})", "not_applicable": True,
                             "reason": f"cuDNN runs on CUDA GPUs only (platform {platform})"})
            else:
                plan.append({"name": f"attention.cudnn ({where})", "not_applicable": True,
                             "reason": "cuDNN takes float16/bfloat16 only; 'auto' runs float32 as 'blockwise', "
                                       "checked below"})
            plan.append({"name": f"attention.blockwise ({where})", "kind": "full", "implementation": "blockwise",
                         "stand_in": False, "dtype": dtype, "shape": shape})
    plan.append({"name": "attention.pallas_tpu", "not_applicable": True,
                 "reason": "JAX's Pallas TPU flash kernel (jax.experimental.pallas.ops.tpu) runs on TPUs only, and "
                           "this is a GPU check; tests/models/test_attention.py checks it in interpret mode on CPU"})
    for dtype in ("bfloat16", "float32"):
        plan.append({"name": f"decode_attention.batched ({dtype})", "kind": "decode", "implementation": "batched",
                     "stand_in": False, "dtype": dtype, "shape": shapes["decode"]})
    return plan


def _attention_fn(implementation: str, stand_in: bool) -> Callable:
    from sera_jax.models import attention as A

    if implementation == "cudnn" and stand_in:
        def fn(q, k, v, start, end):  # attention()'s cuDNN branch with XLA's SDPA in cuDNN's place
            import jax.numpy as jnp

            out = A.cudnn_attention(q, k, v, start, end, sdpa_implementation="xla")
            empty_BxQ = A.empty_rows(start, end, 0, q.shape[1])
            return jnp.where(empty_BxQ[:, :, None, None], jnp.zeros((), out.dtype), out)
        return fn
    return lambda q, k, v, start, end: A.attention(q, k, v, start, end, 0, implementation=implementation)


_VALUE_AND_GRADS: dict[tuple[str, bool], Callable] = {}


def value_and_grads(implementation: str, stand_in: bool = False) -> Callable:
    """Jitted (q, k, v, kv_start_B, kv_end_B, cotangent) -> (out, (dq, dk, dv), seen_BxQ) of <cotangent, attention>,
    the cotangent zeroed on the queries that see no key (their outputs differ by design between implementations;
    nothing reads them). One jitted function per implementation, so the checks of one shape share a program."""
    key = (implementation, stand_in)
    if key not in _VALUE_AND_GRADS:
        import jax
        import jax.numpy as jnp

        from sera_jax.models import attention as A

        attn = _attention_fn(implementation, stand_in)

        def fn(q, k, v, start, end, ct):
            seen = ~A.empty_rows(start, end, 0, q.shape[1])
            ct_seen = ct * seen[:, :, None, None]

            def loss(q, k, v):
                out = attn(q, k, v, start, end)
                return jnp.sum(ct_seen * out.astype(jnp.float32)), out

            (_, out), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
            return out, grads, seen

        _VALUE_AND_GRADS[key] = jax.jit(fn)
    return _VALUE_AND_GRADS[key]


def full_problem(shape: dict[str, Any], dtype: str, seed: int = 0) -> dict[str, Any]:
    """Random q, k, v (in ``dtype``), a float32 cotangent and spans covering the layouts the decoder makes:
    full rows, left-padded prompts, right-padded responses, both, and a single key."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    b, length = shape["batch"], shape["length"]
    a, m, d = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    pattern = [(0, length), (length // 3, length), (0, length - length // 4), (length // 5, length - length // 5),
               (length - 1, length)]
    start = np.array([pattern[i % len(pattern)][0] for i in range(b)], np.int32)
    end = np.array([pattern[i % len(pattern)][1] for i in range(b)], np.int32)
    return {"q": jnp.asarray(rng.standard_normal((b, length, a, d)), dtype),
            "k": jnp.asarray(rng.standard_normal((b, m, length, d)), dtype),
            "v": jnp.asarray(rng.standard_normal((b, m, length, d)), dtype),
            "start": jnp.asarray(start), "end": jnp.asarray(end),
            "ct": jnp.asarray(rng.standard_normal((b, length, a, d)), jnp.float32)}


def decode_problem(shape: dict[str, Any], dtype: str, seed: int = 0) -> dict[str, Any]:
    """A decoding step as the sampler makes one: slots of random prompts (some inactive), left-padded prompt
    caches, response rings with random fill and a wrapped newest column."""
    import jax.numpy as jnp
    import numpy as np

    from sera_jax.models import decode_attention as DA
    from sera_jax.models.sampler import default_prompt_tile

    rng = np.random.default_rng(seed)
    s, p, t, r = shape["slots"], shape["prompts"], shape["prompt_len"], shape["response_len"]
    m, d = shape["n_kv_heads"], shape["head_dim"]
    g = shape["n_heads"] // m

    def arr(*dims):
        return jnp.asarray(rng.standard_normal(dims), dtype)

    kv = DA.SharedKV(arr(p, m, t, d), arr(p, m, t, d), arr(s, m, d, r), arr(s, m, r, d))
    return {"q": arr(s, m * g, d), "kv": kv,
            "start": jnp.asarray(rng.integers(0, max(1, t // 2), p), jnp.int32),
            "ids": jnp.asarray(rng.integers(0, p, s), jnp.int32),
            "n_valid": jnp.asarray(rng.integers(0, r, s), jnp.int32),
            "newest": jnp.int32(int(rng.integers(0, r))),
            "active": jnp.asarray(rng.random(s) < 0.85), "tile": default_prompt_tile(s, p), "num_prompts": p}


def run_kernel_check(spec: dict[str, Any]) -> dict[str, Any]:
    """One check: the implementation of ``spec`` against the float32 dense reference at HIGHEST precision, on the
    same (dtype-rounded) inputs; the custom calls of its program (cuDNN's ``__cudnn$fmha*`` must be among them
    when cuDNN itself runs)."""
    import jax
    import jax.numpy as jnp

    from sera_jax.models import decode_attention as DA
    from sera_jax.train.plan import custom_call_targets

    tol = TOLERANCES[spec["dtype"]]
    record = {k: spec[k] for k in ("name", "kind", "implementation", "stand_in", "dtype", "shape")}
    record["reference"] = "dense, float32 inputs (upcast from the same rounded values), HIGHEST matmul precision"
    # bfloat16 operands multiply exactly at any precision; float32 ones are checked at HIGHEST (see TOLERANCES).
    precision = "highest" if spec["dtype"] == "float32" else None
    record["matmul_precision"] = precision or "default"
    if spec["kind"] == "full":
        pr = full_problem(spec["shape"], spec["dtype"])
        fn = value_and_grads(spec["implementation"], spec["stand_in"])
        args = (pr["q"], pr["k"], pr["v"], pr["start"], pr["end"], pr["ct"])
        with jax.default_matmul_precision(precision):
            out, grads, seen = fn(*args)
            record["custom_calls"] = custom_call_targets(fn.lower(*args).as_text())
        with jax.default_matmul_precision("highest"):
            ref_out, ref_grads, _ = value_and_grads("dense")(*(x.astype(jnp.float32) for x in args[:3]), *args[3:])
        record["forward"] = error_stats(out, ref_out, tol, mask=seen)
        for g, rg, name in zip(grads, ref_grads, ("dq", "dk", "dv")):
            record[name] = error_stats(g, rg, tol)
        parts = ("forward", "dq", "dk", "dv")
        record["output_dtype"] = str(out.dtype)
    else:
        pr = decode_problem(spec["shape"], spec["dtype"])
        args = (pr["q"], pr["kv"], pr["start"], pr["ids"], pr["n_valid"], pr["newest"], pr["active"])
        kw = dict(num_prompts=pr["num_prompts"], tile=pr["tile"], implementation=spec["implementation"])
        with jax.default_matmul_precision(precision):
            out = DA.step_attention(*args, **kw)
            record["custom_calls"] = custom_call_targets(DA.step_attention.lower(*args, **kw).as_text())
        with jax.default_matmul_precision("highest"):
            q32 = pr["q"].astype(jnp.float32)
            kv32 = DA.SharedKV(*(x.astype(jnp.float32) for x in pr["kv"]))
            ref = DA.step_attention(q32, kv32, *args[2:], **{**kw, "implementation": "dense"})
        record["forward"] = error_stats(out, ref, tol)
        record["gradients"] = "none: decoding is never differentiated"
        parts = ("forward",)
        record["output_dtype"] = str(out.dtype)
    record["pass"] = all(record[p]["pass"] for p in parts)
    if spec.get("implementation") == "cudnn" and not spec["stand_in"]:
        record["cudnn_in_program"] = any(t.startswith("__cudnn$fmha") for t in record["custom_calls"])
        record["pass"] = record["pass"] and record["cudnn_in_program"]
    return record


# --- the comparison ----------------------------------------------------------------------------------------------

def comparison(parts: dict[str, dict], target: dict[str, float]) -> dict[str, Any]:
    """Measured against planned, from whatever the parts have so far (missing inputs are listed, not guessed):
    the device's peak bytes over the planner's largest peak of the step's calls, per call the measured median
    time over the roofline time and the running peak after it over its planned peak, the step's measured time over
    the sum of its calls' roofline times, and the update's MFU (model FLOPs; XLA's count, a lower bound when the
    program loops) next to the planner's MFU bound."""
    rl = (parts.get("rl_steps") or {}).get("result") or {}
    plan = ((parts.get("plan") or {}).get("result") or {}).get("calls") or {}
    tp = (parts.get("throughput") or {}).get("result") or {}
    missing = [name for name, ok in (("rl_steps", bool(rl.get("calls"))), ("plan", bool(plan)),
                                     ("throughput", bool(tp.get("update")))) if not ok]
    out: dict[str, Any] = {"missing": missing}
    measured_calls = rl.get("calls") or {}
    planned_peak = max((c["peak_bytes"] for c in plan.values()), default=None)
    measured_peak = rl.get("peak_bytes")
    out["memory"] = {"measured_peak_bytes": measured_peak, "planned_peak_bytes": planned_peak,
                     "measured_over_planned": ratio(measured_peak, planned_peak),
                     "measured_source": rl.get("memory_source"), "device_hbm_bytes_target": target["hbm_bytes"]}
    calls = {}
    for name in STEP_CALLS:
        m, p = measured_calls.get(name), plan.get(name)
        if m is None and p is None:
            continue
        calls[name] = {"measured_seconds": m and m["seconds_median"],
                       "measured_includes_compilation": m and m["includes_compilation"],
                       "roofline_seconds": p and p["roofline_seconds"],
                       "measured_over_roofline": ratio(m and m["seconds_median"], p and p["roofline_seconds"]),
                       "roofline_is_lower_bound": p and p["has_loop"],
                       "measured_peak_so_far_bytes": m and m["peak_bytes_so_far_after_first_call"],
                       "planned_peak_bytes": p and p["peak_bytes"],
                       "measured_peak_so_far_over_planned": ratio(m and m["peak_bytes_so_far_after_first_call"],
                                                                  p and p["peak_bytes"])}
    out["calls"] = calls
    roofline_step = sum(c["roofline_seconds"] for c in calls.values() if c["roofline_seconds"] is not None) or None
    out["step"] = {"measured_seconds": rl.get("step_seconds_median"), "roofline_seconds": roofline_step,
                   "measured_over_roofline": ratio(rl.get("step_seconds_median"), roofline_step),
                   "note": "roofline: the sum over the step's calls (lower bounds where a call loops); the measured "
                           "step also holds the host's work (maze generation, rewards, allocation)"}
    upd = tp.get("update") or {}
    plan_update = plan.get("update") or {}
    sec = upd.get("seconds_median")
    out["update_mfu"] = {"seconds": sec, "model_flops": upd.get("model_flops"), "mfu_model_flops": upd.get("mfu"),
                         "xla_flops": plan_update.get("flops"),
                         "mfu_xla_flops": ratio(ratio(plan_update.get("flops"), sec), target["peak_flops"]),
                         "xla_flops_is_lower_bound": plan_update.get("has_loop"),
                         "planned_mfu_bound": plan_update.get("mfu_bound"),
                         "xla_over_model_flops": ratio(plan_update.get("flops"), upd.get("model_flops")),
                         "peak_flops": target["peak_flops"]}
    sampler = tp.get("sampler") or {}
    out["sampler"] = {"tokens_per_second": sampler.get("tokens_per_second"),
                      "tokens_per_second_in_steps": (measured_calls.get("rollout sampling") or {}).get(
                          "tokens_per_second")}
    return out


# --- the command line --------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]] = None) -> Settings:
    parser = argparse.ArgumentParser(prog="python scripts/device_check.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="the JSON (default: $OUT/device_check.json where OUT is set, "
                                                    "else results/gpu/device_check.json)")
    parser.add_argument("--dry_run", action="store_true", help="every part on CPU, maze tiny, tiny shapes")
    parser.add_argument("--config", default=None, help="experiments/maze/config.py:VARIANT (default gpu; dry: tiny)")
    parser.add_argument("--method", default="sera", help="a method of experiments/maze/config.py METHODS")
    parser.add_argument("--steps", type=int, default=None, help="RL steps, the first compiles (default 4; dry 3)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls in throughput (default 5; dry 2)")
    parser.add_argument("--target", default=GPU_TARGET, help="the planner's GPU target (sera_jax.train.targets)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget_s", type=float, default=None,
                        help=f"seconds for all parts together (default {TOTAL_BUDGET:.0f}; dry run {DRY_BUDGET:.0f})")
    parser.add_argument("--part_budget", action="append", default=[], metavar="PART=SECONDS",
                        help=f"override one part's seconds (defaults {PART_BUDGETS})")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run (others: skipped)")
    a = parser.parse_args(argv)
    # The dry run checks the code, not the timing: budgets that a slow, shared CPU never reaches.
    budgets = {name: DRY_BUDGET for name in PARTS} if a.dry_run else dict(PART_BUDGETS)
    for item in a.part_budget:
        name, _, seconds = item.partition("=")
        if name not in budgets:
            parser.error(f"--part_budget={item!r}: no part {name!r}; choose one of {', '.join(PARTS)}")
        budgets[name] = float(seconds)
    parts = tuple(p for p in a.parts.split(",") if p)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    out = a.out or (os.path.join(os.environ["OUT"], "device_check.json") if os.environ.get("OUT")
                    else str(REPO / "results" / "gpu" / "device_check.json"))
    variant = "tiny" if a.dry_run else "gpu"
    return Settings(dry_run=a.dry_run, config=a.config or f"experiments/maze/config.py:{variant}",
                    method=a.method, steps=a.steps or (3 if a.dry_run else 4),
                    repeats=a.repeats or (2 if a.dry_run else 5), target=a.target, seed=a.seed, part_budgets=budgets,
                    total_budget=a.budget_s or (DRY_BUDGET if a.dry_run else TOTAL_BUDGET), parts=parts,
                    out=pathlib.Path(out))


def summary(report: dict[str, Any]) -> str:
    """A few lines for the console: each part's status and time, and the headline figures."""
    def fmt(x, spec=".3g"):
        return "n/a" if x is None else format(x, spec)

    lines = [f"{name:<11} {p.get('status', '?'):<8} {p.get('wall_seconds', 0.0):6.1f} s"
             + (f"  {p['error']['type']}: {p['error']['message'][:120]}" if p.get("error") else "")
             + (f"  cut: {'; '.join(p['skipped_work'])[:160]}" if p.get("skipped_work") else "")
             for name, p in report["parts"].items()]
    c = report.get("comparison") or {}
    mem, step, mfu = c.get("memory") or {}, c.get("step") or {}, c.get("update_mfu") or {}
    lines.append(f"peak memory: measured {fmt(mem.get('measured_peak_bytes'))} B, planned "
                 f"{fmt(mem.get('planned_peak_bytes'))} B, ratio {fmt(mem.get('measured_over_planned'))}")
    tokens_per_second = (c.get("sampler") or {}).get("tokens_per_second")
    lines.append(f"step: {fmt(step.get('measured_seconds'))} s measured, roofline {fmt(step.get('roofline_seconds'))}"
                 f" s; update MFU {fmt(mfu.get('mfu_model_flops'))} (planner's bound "
                 f"{fmt(mfu.get('planned_mfu_bound'))}); sampler {fmt(tokens_per_second)} tokens/s")
    kernels = ((report["parts"].get("kernels") or {}).get("result") or {}).get("checks") or []
    verdicts = [f"{k['name']}: " + ("n/a" if k.get("not_applicable") else "pass" if k["pass"] else "FAIL")
                for k in kernels]
    lines.append("kernels: " + ", ".join(verdicts))
    lines.append(f"status: {report['status']}")
    return "\n".join(lines)


class TimeLimit(BaseException):
    """SIGTERM from ``timeout`` (scripts/device_check.sh): not an ``Exception``, so no part swallows it."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    settings = parse_args(argv)
    if settings.dry_run:
        import jax

        jax.config.update("jax_platforms", "cpu")  # before the first device is asked for
    check = Check(settings)

    def on_term(signum, frame):
        raise TimeLimit(f"signal {signum} (the script's time limit) arrived inside this part")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        code = check.run()
    except TimeLimit as e:
        check.killed(str(e))
        code = 124
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summary(check.report), file=sys.stderr)
    print(f"device_check: {check.report['status']} -> {settings.out} (exit {code})", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
