"""The memory planner: every jitted function a run uses, compiled from abstract shapes, bytes per device.

    python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --devices=1 --device_memory=141GiB

No weights, no data, no accelerator: parameters, optimizer state and batches are ``jax.ShapeDtypeStruct``s
with the shardings of the config's mesh over ``--devices`` fake CPU devices, and each function is lowered
and compiled (``jax.jit(f).lower(...).compile().memory_analysis()``). The experiment of the config file
(``experiments/NAME/``) lists its calls in ``planned_calls(config)`` (``PlannedCall``: a name, the jitted
function, its abstract arguments). For each call the table gives argument, temporary and output bytes per
device and the peak (arguments + temporaries + outputs - donated aliases); the command exits with status 1
when a peak exceeds ``--device_memory``.

On CPU the figures are XLA's CPU buffer assignment for the same program: an estimate of an accelerator's
(GPU/TPU compilers fuse and schedule differently; attention kernels that only exist on an accelerator are
planned with their portable stand-in), good to a small factor, not to the byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pathlib
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
          "gb": 10**9, "tb": 10**12}


@dataclasses.dataclass(frozen=True)
class PlannedCall:
    """One jitted function of a run and the abstract arguments it is called with."""

    name: str
    fn: Callable  # a jax.jit-wrapped function
    args: tuple[Any, ...]  # pytrees of jax.ShapeDtypeStruct (with shardings) or static Python values
    note: str = ""  # what the call is (rows, tokens, slices)


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


def measure(call: PlannedCall) -> CallMemory:
    """Compiles ``call`` from its abstract arguments and reads XLA's buffer assignment (bytes per device)."""
    start = time.perf_counter()
    compiled = call.fn.lower(*call.args).compile()
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    return CallMemory(call.name, int(stats.argument_size_in_bytes), int(stats.temp_size_in_bytes),
                      int(stats.output_size_in_bytes), int(stats.alias_size_in_bytes), seconds, call.note)


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


def experiment_module(config_path: str):
    """``experiments/NAME/config.py`` -> the module of that experiment that defines ``planned_calls``."""
    name = pathlib.Path(config_path).resolve().parent.name
    for module in (f"experiments.{name}.memory", f"experiments.{name}.experiment", f"experiments.{name}.main"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        if hasattr(mod, "planned_calls"):
            return mod
    raise ValueError(f"--config={config_path}: experiment {name!r} defines no planned_calls(config)")


def with_host_device_count(xla_flags: str, num_devices: int) -> str:
    """``XLA_FLAGS`` with its count of fake CPU devices set to ``num_devices`` (an earlier count replaced, every
    other flag kept)."""
    kept = [f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count=")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={num_devices}"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sera_jax.train.plan", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiments/NAME/config.py:VARIANT")
    parser.add_argument("--devices", type=int, default=1, help="devices of the run (fake CPU devices stand in)")
    parser.add_argument("--device_memory", default="141GiB", help="memory of one device, e.g. 141GiB, 80GB")
    parser.add_argument("--only", nargs="*", default=None, help="plan only these calls (by name)")
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error(f"--devices={args.devices}: must be >= 1")
    try:
        device_memory = parse_bytes(args.device_memory)
    except ValueError as e:
        parser.error(str(e))
    # Before JAX starts its backend: the fake devices the mesh is laid over.
    os.environ["XLA_FLAGS"] = with_host_device_count(os.environ.get("XLA_FLAGS", ""), args.devices)
    sys.path.insert(0, os.getcwd())
    import jax

    jax.config.update("jax_platforms", "cpu")

    from sera_jax.train import cli

    if jax.device_count() != args.devices:
        print(f"JAX started before the planner could set {args.devices} devices (it has {jax.device_count()})",
              file=sys.stderr)
        return 2
    config = cli.load_config_spec(args.config)
    calls = experiment_module(args.config.partition(":")[0]).planned_calls(config)
    if args.only:
        calls = [c for c in calls if c.name in args.only]
    print(f"{args.config} on {args.devices} device(s) of {format_bytes(device_memory)}; XLA:CPU buffer "
          "assignment (an estimate of the accelerator's)", flush=True)
    rows = []
    for call in calls:
        rows.append(measure(call))
        print(f"  compiled {call.name} ({rows[-1].compile_seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_table(rows, device_memory))
    return 0 if all(r.peak_bytes <= device_memory for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
