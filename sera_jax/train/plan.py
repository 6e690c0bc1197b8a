"""The memory planner: every jitted function a run uses, compiled from abstract shapes, bytes per device.

    python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --devices=1 --device_memory=141GiB

No weights, no data, no accelerator: parameters, optimizer state and batches are ``jax.ShapeDtypeStruct``s
with the shardings of the config's mesh over ``--devices`` fake CPU devices, and each function is lowered
and compiled (``jax.jit(f).lower(...).compile().memory_analysis()``). The experiment of the config file
(``experiments/NAME/config.py``) lists its calls in ``experiments.NAME.experiment.planned_calls(config, devices)``
(``PlannedCall``: a name, the jitted function, its abstract arguments). Run it from the repository root:
``python -m`` puts the working directory first on ``sys.path``, so ``experiments`` is this checkout's. For
each call the table gives argument, temporary and output bytes per device and the peak (arguments +
temporaries + outputs - donated aliases); the command exits with status 1 when a peak exceeds
``--device_memory``.

On CPU the figures are XLA's CPU buffer assignment for the same program: an estimate of an accelerator's
(GPU/TPU compilers fuse and schedule differently; attention kernels that only exist on an accelerator are
planned with their portable stand-in), good to a small factor, not to the byte.

    python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --platform=cuda

``--platform=tpu|cuda`` lowers instead of planning: every call is traced with its attention resolved as that
platform resolves it (``attention.lowering_for``: Pallas flash on TPU, cuDNN on CUDA) and exported for it
(``jax.export.export(fn, platforms=[platform])``, StableHLO with the kernels' custom calls), on this machine.
It prints each program's custom calls or the error that stopped it, named, and exits with status 1 if any
program failed. Lowering is not compiling: the accelerator's compiler, and anything checked only there, are
not run.

    python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --platform=cuda --target=h200 --devices=8
    python -m sera_jax.train.plan --config=experiments/math_reasoning/config.py:full --platform=tpu --topology=v5p:2x2x2

``--target`` (GPU) or ``--topology`` (TPU) compiles instead: the same calls, laid out by the config's mesh over
the target's devices (``targets.target_devices``: XLA:GPU or XLA:TPU without the hardware, from the ``targets``
extra), each compiled by the target's own compiler with attention resolved for it. Per call and device: XLA's
peak memory, FLOPs and bytes accessed, the roofline step time and the MFU it allows (``targets.TARGETS``), and
the compiler that answered. FLOPs and bytes are the larger of XLA's cost analysis and the model's closed-form
count (``sera_jax.models.flops``, for the decoders: every layer and every decoding step), because XLA's counts a
loop body once; a call whose only count is XLA's and has a loop is marked, its figures a lower bound. Exits
with status 1 when a call does not compile or its peak exceeds the target's memory. Without the plugin the CPU plan answers instead, over as many fake CPU devices, with the target's
roofline, and the table says so ("XLA:CPU (no plugin)").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

PLATFORMS = ("tpu", "cuda")  # --platform
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


def experiment_module(config_path: str):
    """``experiments/NAME/config.py`` -> the module the experiments' registry (``experiments.EXPERIMENTS``) names for
    NAME, whose ``planned_calls(config, devices)`` lists the run's calls; ValueError naming the config, and the known
    experiments, when NAME is not registered or its module has no ``planned_calls``.

    ``experiments`` is imported here, when the planner runs, never when ``sera_jax`` is imported: the dependency
    runs from the experiments to the library."""
    import experiments

    name = pathlib.Path(config_path).resolve().parent.name
    if name not in experiments.EXPERIMENTS:
        raise ValueError(f"--config={config_path}: no experiment named {name!r} in experiments.EXPERIMENTS "
                         f"(experiments/__init__.py) to plan from; known experiments: "
                         f"{sorted(experiments.EXPERIMENTS)}")
    mod = experiments.experiment_module(name)
    if not hasattr(mod, "planned_calls"):
        raise ValueError(f"--config={config_path}: {mod.__name__} (experiments.EXPERIMENTS[{name!r}]) defines no "
                         "planned_calls(config, devices)")
    return mod


def with_host_device_count(xla_flags: str, num_devices: int) -> str:
    """``XLA_FLAGS`` with its count of fake CPU devices set to ``num_devices`` (an earlier count replaced, every
    other flag kept)."""
    kept = [f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count=")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={num_devices}"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sera_jax.train.plan", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiments/NAME/config.py:VARIANT")
    parser.add_argument("--devices", type=int, default=None,
                        help="devices of the run (default 1, or a --topology's; fake CPU devices stand in)")
    parser.add_argument("--device_memory", default="141GiB", help="memory of one device, e.g. 141GiB, 80GB")
    parser.add_argument("--only", nargs="*", default=None, help="plan only these calls (by name)")
    parser.add_argument("--platform", default=None, choices=PLATFORMS,
                        help="lower every call for this platform (jax.export) instead of planning its memory")
    parser.add_argument("--target", default=None, help="with --platform=cuda: compile for this GPU (e.g. h200)")
    parser.add_argument("--topology", default=None, help="with --platform=tpu: compile for this TPU topology "
                                                         "(e.g. v5p:2x2x2)")
    args, rest = parser.parse_known_args(argv)
    overrides = [a for a in rest if a.startswith("--config.")]
    if len(overrides) != len(rest):
        parser.error(f"unrecognized arguments: {' '.join(a for a in rest if a not in overrides)}")
    try:
        args.devices = num_devices(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        device_memory = parse_bytes(args.device_memory)
    except ValueError as e:
        parser.error(str(e))
    # Before JAX starts its backend: the fake devices the mesh is laid over.
    os.environ["XLA_FLAGS"] = with_host_device_count(os.environ.get("XLA_FLAGS", ""), args.devices)
    import jax

    jax.config.update("jax_platforms", "cpu")

    from sera_jax.train import cli

    if jax.device_count() != args.devices:
        print(f"JAX started before the planner could set {args.devices} devices (it has {jax.device_count()})",
              file=sys.stderr)
        return 2
    config = cli.load_config_spec(args.config)
    try:
        apply_overrides(config, overrides)
    except ValueError as e:
        parser.error(str(e))
    if overrides:
        print(f"overrides: {' '.join(overrides)}", flush=True)
    if args.target or args.topology:
        return plan_target(config, args)
    if args.platform:
        return lower_all(config, args)
    return plan_memory(config, args, device_memory)


def apply_overrides(config: Any, overrides: Sequence[str]) -> None:
    """``--config.a.b=VALUE`` flags set on ``config`` as a run's command line would set them: VALUE read as a Python
    literal (``128``, ``(1, 8, 1)``, ``True``, ``'bf16'``), else as a string; ValueError naming the flag when the
    field does not exist or the value is not of its type."""
    import ast

    for flag in overrides:
        path, sep, text = flag[len("--config."):].partition("=")
        if not sep or not path:
            raise ValueError(f"{flag}: expected --config.FIELD=VALUE")
        *parents, leaf = path.split(".")
        node = config
        for name in parents:
            node = node.get(name) if hasattr(node, "get") else None
        if node is None or not hasattr(node, "keys") or leaf not in node.keys():
            raise ValueError(f"{flag}: the config has no field {path!r}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if isinstance(node[leaf], bool) and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        try:
            setattr(node, leaf, value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{flag}: {e}") from None


def num_devices(args: argparse.Namespace) -> int:
    """The run's device count from ``--devices``/``--topology``, the flags checked against each other and
    ``--platform``; ValueError naming the bad flag."""
    from sera_jax.train import targets

    if args.target and args.platform != "cuda":
        raise ValueError(f"--target={args.target}: a GPU target; give --platform=cuda (TPUs: --topology)")
    if args.topology and args.platform != "tpu":
        raise ValueError(f"--topology={args.topology}: a TPU topology; give --platform=tpu")
    if args.target and args.topology:
        raise ValueError("--target and --topology: give one (a GPU target or a TPU topology)")
    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices={args.devices}: must be >= 1")
    if args.target:
        targets.get_target(args.target, "cuda")
        targets.gpu_topology(args.devices or 1)
    if args.topology:
        chips = targets.topology_chips(args.topology)
        # libtpu gives each of a v4 chip's two TensorCores a device: the count is known once it has answered.
        return args.devices or chips
    return args.devices or 1


def selected_calls(config, args: argparse.Namespace, devices: Sequence[Any] | None = None) -> list[PlannedCall]:
    """The experiment's planned calls over ``devices`` (default: JAX's; ``--only``: those named)."""
    calls = experiment_module(args.config.partition(":")[0]).planned_calls(config, devices)
    return [c for c in calls if c.name in args.only] if args.only else calls


def plan_memory(config, args: argparse.Namespace, device_memory: int) -> int:
    """Every call compiled for its memory plan, never run (``attention.compile_only``: no CPU-only workarounds in
    the planned programs)."""
    from sera_jax.models import attention

    with attention.compile_only():
        calls = selected_calls(config, args)
        print(f"{args.config} on {args.devices} device(s) of {format_bytes(device_memory)}; XLA:CPU buffer "
              "assignment (an estimate of the accelerator's)", flush=True)
        rows = []
        for call in calls:
            rows.append(measure(call))
            print(f"  compiled {call.name} ({rows[-1].compile_seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_table(rows, device_memory))
    return 0 if all(r.peak_bytes <= device_memory for r in rows) else 1


def plan_target(config, args: argparse.Namespace) -> int:
    """``--target``/``--topology``: every call laid out over the target's devices and compiled by its compiler
    (attention resolved for its platform); without the plugin, over as many CPU devices by XLA:CPU."""
    import jax

    from sera_jax.models import attention
    from sera_jax.train import targets

    name = args.target or args.topology
    chip = targets.get_target(args.target, "cuda") if args.target else targets.parse_topology(args.topology)[0]
    try:
        devices = targets.target_devices(args.platform, name, args.devices if args.target else None)
        compiler = f"XLA:{'GPU' if args.platform == 'cuda' else 'TPU'} {chip.label}"
        tracing = attention.lowering_for(args.platform)
    except targets.MissingPluginError as e:
        print(f"{e}: planning with XLA:CPU instead", file=sys.stderr)
        devices, compiler, tracing = jax.devices()[:args.devices], "XLA:CPU (no plugin)", attention.compile_only()
    target = targets.per_device(chip, targets.devices_per_chip(devices))
    print(f"{args.config} on {len(devices)} device(s) of {name}; {compiler}", flush=True)
    rows, failed = [], []
    with tracing:
        for call in selected_calls(config, args, devices):
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


def lower_all(config, args: argparse.Namespace) -> int:
    """``--platform``: the calls built and traced for the platform (``attention.lowering_for``), each exported."""
    from sera_jax.models import attention

    with attention.lowering_for(args.platform):
        calls = selected_calls(config, args)
        print(f"{args.config} on {args.devices} device(s): lowering every program for {args.platform} "
              "(jax.export)", flush=True)
        rows = []
        for call in calls:
            rows.append(lower(call, args.platform))
            print(f"  lowered {call.name} ({rows[-1].seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_lowering(rows, args.platform))
    return 0 if all(r.custom_calls is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
