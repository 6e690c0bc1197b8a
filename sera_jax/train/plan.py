"""The memory planner's library: a run's jitted functions compiled from abstract shapes, per device.

A run's calls come as ``PlannedCall``s (a name, the jitted function, its abstract arguments): parameters,
optimizer state and batches are ``jax.ShapeDtypeStruct``s with the shardings of the run's mesh, so no weights, no
data and no accelerator are needed. Each experiment lists its own (``planned_calls(config, devices)``); the command
line, ``python -m experiments.plan`` (``experiments/plan.py``), finds a config's experiment and hands its calls
here as ``calls_for(devices)``. This module imports no experiment: the dependency runs from the experiments to
the library. Three plans, each printing its table and returning the command's exit status:

- ``plan_memory``: each call compiled on this machine's CPU (``jax.jit(f).lower(...).compile().memory_analysis()``):
  argument, temporary and output bytes per device and the peak (arguments + temporaries + outputs - donated
  aliases); 1 when a peak exceeds the device's memory. XLA's CPU buffer assignment for the same program is an
  estimate of an accelerator's (GPU/TPU compilers fuse and schedule differently; attention kernels that only exist
  on an accelerator are planned with their portable stand-in), good to a small factor, not to the byte.
- ``lower_all``: each call traced with its attention resolved as a platform resolves it
  (``attention.lowering_for``: Pallas flash on TPU, cuDNN on CUDA) and exported for it (``jax.export.export(fn,
  platforms=[platform])``, StableHLO with the kernels' custom calls); each program's custom calls or the error that
  stopped it, named; 1 if any program failed. Lowering is not compiling: the accelerator's compiler, and anything
  checked only there, are not run.
- ``plan_target``: each call laid out over a GPU's or TPU's devices (``targets.target_devices``: XLA:GPU or XLA:TPU
  without the hardware, from the ``targets`` extra) and compiled by the target's own compiler with attention
  resolved for it. Per call and device: XLA's peak memory, FLOPs and bytes accessed, the roofline step time and the
  MFU it allows (``targets.TARGETS``), and the compiler that answered. FLOPs and bytes are the larger of XLA's cost
  analysis and the model's closed-form count (``sera_jax.models.flops``, for the decoders: every layer and every
  decoding step), because XLA's counts a loop body once; a call whose only count is XLA's and has a loop is marked,
  its figures a lower bound. 1 when a call does not compile or its peak exceeds the target's memory. Without the
  plugin the CPU plan answers instead, over as many fake CPU devices, with the target's roofline, and the table says
  so ("XLA:CPU (no plugin)").
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

PLATFORMS = ("tpu", "cuda")  # what lower_all exports for and plan_target compiles for
# Why a lowering fails on a machine without the platform's JAX plugin (matched in the error's text).
_KNOWN_CAUSES = {
    "cuDNN is not detected": "JAX lowers cuDNN attention only where its CUDA plugin (jax[cuda12]) and cuDNN are "
                             "installed; this machine has neither",
}
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
          "gb": 10**9, "tb": 10**12}


@dataclasses.dataclass(frozen=True)
class PlannedCall:
    """One jitted function of a run and the abstract arguments it is called with."""

    name: str
    fn: Callable  # a jax.jit-wrapped function
    args: tuple[Any, ...]  # pytrees of jax.ShapeDtypeStruct (with shardings) or static Python values
    note: str = ""  # what the call is (rows, tokens, slices)
    # Counted from the model's configuration (sera_jax.models.flops), per device; 0 where the call has no count.
    # XLA's cost analysis counts a loop body once: the roofline takes the larger of these and XLA's counts.
    model_flops: float = 0.0
    least_bytes: float = 0.0


@dataclasses.dataclass(frozen=True)
class CallMemory:
    name: str
    argument_bytes: int
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    compile_seconds: float
    note: str = ""

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes


@dataclasses.dataclass(frozen=True)
class CallLowering:
    """One call exported for a platform: its custom calls (kernels) when it lowered, else the error."""

    name: str
    seconds: float
    custom_calls: dict[str, int] | None  # target -> count; None when lowering failed
    error: str = ""


def parse_bytes(text: str) -> int:
    """``"141GiB"`` -> bytes (units B, KiB, MiB, GiB, TiB and the decimal KB, MB, GB, TB); ValueError otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"--device_memory={text!r}: expected a size such as 141GiB, 80GB or 16384MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


@dataclasses.dataclass(frozen=True)
class CallOnTarget:
    """One call compiled for a target: its memory, its FLOPs and bytes per device and the target's roofline.

    ``flops``/``bytes_accessed`` are the larger of XLA's count and the model's (``PlannedCall.model_flops`` /
    ``least_bytes``): XLA's counts a loop body once, the model's closed forms count every iteration."""

    memory: CallMemory
    xla_flops: float
    xla_bytes: float
    has_loop: bool  # a while loop, whose body XLA's counts hold once: they are a lower bound
    model_flops: float  # 0: the call has no model count
    least_bytes: float
    roofline_seconds: float
    mfu_bound: float

    @property
    def flops(self) -> float:
        return max(self.xla_flops, self.model_flops)

    @property
    def bytes_accessed(self) -> float:
        return max(self.xla_bytes, self.least_bytes)

    @property
    def flops_lower_bound(self) -> bool:
        """Only XLA's loop-once count stands behind ``flops``."""
        return self.has_loop and self.model_flops <= self.xla_flops

    @property
    def bytes_lower_bound(self) -> bool:
        return self.has_loop and self.least_bytes <= self.xla_bytes


def compile_call(call: PlannedCall, *, keep_jaxpr: bool = False) -> tuple[Any, float, Any]:
    """``call`` compiled from its abstract arguments, the seconds tracing, lowering and compiling took, and (with
    ``keep_jaxpr``, for a plain jit) the jaxpr it was traced to, else None."""
    start = time.perf_counter()
    if keep_jaxpr:
        traced = call.fn.trace(*call.args)
        compiled, jaxpr = traced.lower().compile(), traced.jaxpr
    else:
        compiled, jaxpr = call.fn.lower(*call.args).compile(), None
    return compiled, time.perf_counter() - start, jaxpr


def memory_of(call: PlannedCall, compiled: Any, seconds: float) -> CallMemory:
    """XLA's buffer assignment of a compiled call (bytes per device)."""
    stats = compiled.memory_analysis()
    return CallMemory(call.name, int(stats.argument_size_in_bytes), int(stats.temp_size_in_bytes),
                      int(stats.output_size_in_bytes), int(stats.alias_size_in_bytes), seconds, call.note)


def measure(call: PlannedCall) -> CallMemory:
    """Compiles ``call`` from its abstract arguments and reads XLA's buffer assignment (bytes per device)."""
    compiled, seconds, _ = compile_call(call)
    return memory_of(call, compiled, seconds)


def measure_on_target(call: PlannedCall, target, num_devices: int = 1) -> CallOnTarget:
    """Compiles ``call`` (its arguments already on the target's devices) and reads memory, cost and roofline; the
    MFU bound is over the model's FLOPs where the call counts them (MFU's definition), else over the matmul and
    convolution FLOPs of its traced program split over ``num_devices`` (``flops.jaxpr_flops``: XLA:GPU's cost
    analysis counts cuDNN's convolutions as nothing), else XLA's."""
    from sera_jax.models import flops as flops_lib
    from sera_jax.train import targets

    # The traced program's count where the call has none of its own and is a plain jit (the sampler's is not).
    count_jaxpr = not call.model_flops and hasattr(call.fn, "trace")
    compiled, seconds, jaxpr = compile_call(call, keep_jaxpr=count_jaxpr)
    model_flops = flops_lib.jaxpr_flops(jaxpr) / num_devices if count_jaxpr else call.model_flops
    xla_flops, xla_bytes = targets.compiled_cost(compiled)
    flops, bytes_accessed = max(xla_flops, model_flops), max(xla_bytes, call.least_bytes)
    roofline = targets.roofline_seconds(flops, bytes_accessed, target)
    useful = model_flops or xla_flops
    return CallOnTarget(memory_of(call, compiled, seconds), xla_flops, xla_bytes, targets.has_loop(compiled),
                        model_flops, call.least_bytes, roofline,
                        0.0 if roofline == 0 else useful / (roofline * target.peak_flops))


def custom_call_targets(stablehlo_text: str) -> dict[str, int]:
    """Count of each ``stablehlo.custom_call`` target in a module's text (the kernels it calls)."""
    counts: dict[str, int] = {}
    # A bare MLIR symbol may hold '$' (cuDNN's "__cudnn$fmhaSoftmax"); other characters make it a quoted one.
    for quoted, bare in re.findall(r'stablehlo\.custom_call @(?:"([^"]+)"|([\w.$\-]+))', stablehlo_text):
        target = quoted or bare
        counts[target] = counts.get(target, 0) + 1
    return dict(sorted(counts.items()))


def exportable(fn: Callable, args: tuple[Any, ...]) -> Callable:
    """The ``jax.jit`` function that ``fn.lower(*args)`` lowers (``jax.export`` takes only those): ``fn`` itself,
    or for the sampler's ``SampleFn`` (which jits one function per sharding layout) the one its ``lower`` uses."""
    from sera_jax.models.sampler import SampleFn

    if isinstance(fn, SampleFn):
        return fn.jitted(*args)  # what SampleFn.lower lowers
    return fn


def lower(call: PlannedCall, platform: str) -> CallLowering:
    """Exports ``call`` for ``platform`` (``jax.export``) from its abstract arguments; the error, if any, kept."""
    from jax import export

    start = time.perf_counter()
    try:
        exported = export.export(exportable(call.fn, call.args), platforms=[platform])(*call.args)
        targets = custom_call_targets(exported.mlir_module())
    except Exception as e:  # reported per program, not raised: the other programs are still lowered
        first = (str(e).strip().splitlines() or [""])[0]
        cause = next((f" ({why})" for text, why in _KNOWN_CAUSES.items() if text in str(e)), "")
        return CallLowering(call.name, time.perf_counter() - start, None,
                            f"{type(e).__name__}: {first[:400]}{cause}")
    return CallLowering(call.name, time.perf_counter() - start, targets)


def format_lowering(rows: Sequence[CallLowering], platform: str) -> str:
    lines = []
    for r in rows:
        if r.custom_calls is None:
            lines.append(f"FAILED {r.name} ({r.seconds:.1f} s): {r.error}")
        else:
            kernels = ", ".join(f"{t} x{n}" for t, n in r.custom_calls.items()) or "none"
            lines.append(f"OK     {r.name} ({r.seconds:.1f} s): custom calls: {kernels}")
    failed = [r.name for r in rows if r.custom_calls is None]
    lines.append(f"lowered for {platform}: {len(rows) - len(failed)} of {len(rows)} programs"
                 + (f"; failed: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def format_table(rows: Sequence[CallMemory], device_memory: int) -> str:
    header = f"{'call':<24} {'arguments':>12} {'temporaries':>12} {'outputs':>12} {'peak':>12}  {'compile':>8}  what"
    lines = [header, "-" * len(header)]
    for r in rows:
        flag = "  > device memory" if r.peak_bytes > device_memory else ""
        lines.append(f"{r.name:<24} {format_bytes(r.argument_bytes):>12} {format_bytes(r.temp_bytes):>12} "
                     f"{format_bytes(r.output_bytes):>12} {format_bytes(r.peak_bytes):>12}  {r.compile_seconds:7.1f}s"
                     f"  {r.note}{flag}")
    peak = max((r.peak_bytes for r in rows), default=0)
    lines.append(f"peak per device: {format_bytes(peak)} of {format_bytes(device_memory)} "
                 f"({'fits' if peak <= device_memory else 'DOES NOT FIT'})")
    return "\n".join(lines)


def format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e6:.3g} us"


def format_target_table(rows: Sequence[CallOnTarget], target, compiler: str) -> str:
    """The per-call table of a target plan: peak, FLOPs, bytes, roofline time and MFU bound per device."""
    header = (f"{'call':<24} {'peak':>11} {'FLOPs':>10} {'bytes':>10} {'roofline':>10} {'MFU bound':>9}  "
              f"{'compile':>8}  what")
    lines = [f"compiler: {compiler}; per device: {target.peak_flops / 1e12:.1f} TFLOP/s bf16, "
             f"{format_bytes(target.hbm_bytes)} HBM at {target.hbm_bandwidth / 1e9:.0f} GB/s", header, "-" * len(header)]
    for r in rows:
        m = r.memory
        flag = "  > device memory" if m.peak_bytes > target.hbm_bytes else ""
        f_mark = "*" if r.flops_lower_bound else " "
        b_mark = "*" if r.bytes_lower_bound else " "
        lines.append(f"{m.name:<24} {format_bytes(m.peak_bytes):>11} {r.flops:>9.3g}{f_mark} {r.bytes_accessed:>9.3g}{b_mark} "
                     f"{format_seconds(r.roofline_seconds):>10} {r.mfu_bound:>9.1%}  {m.compile_seconds:7.1f}s  {m.note}{flag}")
    lines.append("FLOPs and bytes per device: the larger of XLA's count and the model's (sera_jax.models.flops: the "
                 "decoders' closed forms, every layer and decoding step; else the traced program's matmuls and "
                 "convolutions); MFU over the model's FLOPs")
    if any(r.flops_lower_bound or r.bytes_lower_bound for r in rows):
        lines.append("* XLA's count of a program with a loop (scan, decoding), which holds its body once and has no "
                     "model count to replace it: a lower bound, as is the roofline time built on it")
    peak = max((r.memory.peak_bytes for r in rows), default=0)
    lines.append(f"peak per device: {format_bytes(peak)} of {format_bytes(target.hbm_bytes)} "
                 f"({'fits' if peak <= target.hbm_bytes else 'DOES NOT FIT'}) [{compiler}]")
    return "\n".join(lines)


def with_host_device_count(xla_flags: str, num_devices: int) -> str:
    """``XLA_FLAGS`` with its count of fake CPU devices set to ``num_devices`` (an earlier count replaced, every
    other flag kept)."""
    kept = [f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count=")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={num_devices}"])


# A run's planned calls laid out over the devices given (None: JAX's), as an experiment's ``planned_calls`` lists
# them for one config; built inside the plan's attention context, so that they are traced as the plan traces.
CallsFor = Callable[[Sequence[Any] | None], Sequence[PlannedCall]]


def plan_memory(calls_for: CallsFor, label: str, num_devices: int, device_memory: int) -> int:
    """Every call compiled for its memory plan, never run (``attention.compile_only``: no CPU-only workarounds in
    the planned programs); 1 when a peak exceeds ``device_memory``."""
    from sera_jax.models import attention

    with attention.compile_only():
        calls = calls_for(None)
        print(f"{label} on {num_devices} device(s) of {format_bytes(device_memory)}; XLA:CPU buffer "
              "assignment (an estimate of the accelerator's)", flush=True)
        rows = []
        for call in calls:
            rows.append(measure(call))
            print(f"  compiled {call.name} ({rows[-1].compile_seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_table(rows, device_memory))
    return 0 if all(r.peak_bytes <= device_memory for r in rows) else 1


def plan_target(calls_for: CallsFor, label: str, platform: str, name: str, num_devices: int) -> int:
    """Every call laid out over the devices of ``name`` (a GPU target such as ``h200`` on ``cuda``, or a TPU topology
    such as ``v5p:2x2x2`` on ``tpu``, whose own count of devices is used) and compiled by its compiler (attention
    resolved for its platform); without the plugin, over ``num_devices`` CPU devices by XLA:CPU."""
    import jax

    from sera_jax.models import attention
    from sera_jax.train import targets

    gpu = platform == "cuda"
    chip = targets.get_target(name, "cuda") if gpu else targets.parse_topology(name)[0]
    try:
        devices = targets.target_devices(platform, name, num_devices if gpu else None)
        compiler = f"XLA:{'GPU' if gpu else 'TPU'} {chip.label}"
        tracing = attention.lowering_for(platform)
    except targets.MissingPluginError as e:
        print(f"{e}: planning with XLA:CPU instead", file=sys.stderr)
        devices, compiler, tracing = jax.devices()[:num_devices], "XLA:CPU (no plugin)", attention.compile_only()
    target = targets.per_device(chip, targets.devices_per_chip(devices))
    print(f"{label} on {len(devices)} device(s) of {name}; {compiler}", flush=True)
    rows, failed = [], []
    with tracing:
        for call in calls_for(devices):
            try:
                rows.append(measure_on_target(call, target, len(devices)))
            except Exception as e:  # reported by name; the other calls are still compiled
                failed.append(call.name)
                print(f"FAILED {call.name}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:400]}",
                      flush=True)
                continue
            print(f"  compiled {call.name} ({rows[-1].memory.compile_seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_target_table(rows, target, compiler))
    if failed:
        print(f"did not compile for {name}: {', '.join(failed)}")
    return 0 if not failed and all(r.memory.peak_bytes <= target.hbm_bytes for r in rows) else 1


def lower_all(calls_for: CallsFor, label: str, platform: str, num_devices: int) -> int:
    """Every call built and traced for ``platform`` (``attention.lowering_for``) and exported; 1 if any failed."""
    from sera_jax.models import attention

    with attention.lowering_for(platform):
        calls = calls_for(None)
        print(f"{label} on {num_devices} device(s): lowering every program for {platform} "
              "(jax.export)", flush=True)
        rows = []
        for call in calls:
            rows.append(lower(call, platform))
            print(f"  lowered {call.name} ({rows[-1].seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_lowering(rows, platform))
    return 0 if all(r.custom_calls is not None for r in rows) else 1


if __name__ == "__main__":
    # Compatibility entry point, kept because every saved plan (results/plans/*.txt) records the command that made
    # it as ``python -m sera_jax.train.plan ...`` and scripts/refresh_plans.sh reruns that command as recorded. The
    # command line itself is ``python -m experiments.plan`` (it looks the config's experiment up, which the library
    # does not do); this hands it the same arguments at run time. Importing this module imports no experiment.
    import runpy

    runpy.run_module("experiments.plan", run_name="__main__", alter_sys=True)
