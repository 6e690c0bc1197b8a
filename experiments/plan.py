"""The memory planner's command line: every jitted function a run uses, compiled from abstract shapes, per device.

    python -m experiments.plan --config=experiments/maze/config.py:gpu --devices=1 --device_memory=141GiB

No weights, no data, no accelerator: parameters, optimizer state and batches are ``jax.ShapeDtypeStruct``s with
the shardings of the config's mesh over ``--devices`` fake CPU devices, and each function is lowered and compiled
(``sera_jax.train.plan``, the library). The experiment of the config file (``experiments/NAME/config.py``, looked up
in the registry ``experiments.EXPERIMENTS``) lists its calls in ``planned_calls(config, devices)``
(``PlannedCall``: a name, the jitted function, its abstract arguments). Run it from the repository root:
``python -m`` puts the working directory first on ``sys.path``, so ``experiments`` is this checkout's. For each
call the table gives argument, temporary and output bytes per device and the peak (arguments + temporaries +
outputs - donated aliases); the command exits with status 1 when a peak exceeds ``--device_memory``. The figures
are XLA's CPU buffer assignment for the same program: an estimate of an accelerator's, good to a small factor.

    python -m experiments.plan --config=experiments/maze/config.py:gpu --platform=cuda

``--platform=tpu|cuda`` lowers instead of planning: every call is traced with its attention resolved as that
platform resolves it and exported for it (StableHLO with the kernels' custom calls), on this machine. It prints
each program's custom calls or the error that stopped it, named, and exits with status 1 if any program failed.

    python -m experiments.plan --config=experiments/maze/config.py:gpu --platform=cuda --target=h200 --devices=8
    python -m experiments.plan --config=experiments/math_reasoning/config.py:full --platform=tpu --topology=v5p:2x2x2

``--target`` (GPU) or ``--topology`` (TPU) compiles instead: the same calls, laid out by the config's mesh over the
target's devices and compiled by the target's own compiler (the ``targets`` extra). Per call and device: XLA's peak
memory, FLOPs and bytes accessed, the roofline step time and the MFU it allows, and the compiler that answered.
Exits with status 1 when a call does not compile or its peak exceeds the target's memory. Without the plugin the
CPU plan answers instead, with the target's roofline, and the table says so ("XLA:CPU (no plugin)").

Fields of the config are overridden as a run's command line overrides them (``--config.rl.sample_slots=128``);
``--only NAME ...`` plans only the calls named. ``python -m sera_jax.train.plan ARGS``, the command the saved plans
(``results/plans/*.txt``) record, runs this command line with the same arguments.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import experiments
from sera_jax.train import plan


def experiment_of(config_path: str) -> ModuleType:
    """``experiments/NAME/config.py`` -> the module the experiments' registry (``experiments.EXPERIMENTS``) names for
    NAME, whose ``planned_calls(config, devices)`` lists the run's calls; ValueError naming the config, and the known
    experiments, when NAME is not registered or its module has no ``planned_calls``."""
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


def selected_calls(experiment: ModuleType, config: Any, only: Sequence[str] | None,
                   devices: Sequence[Any] | None = None) -> list[plan.PlannedCall]:
    """The experiment's planned calls over ``devices`` (default: JAX's; ``only``: those named)."""
    calls = experiment.planned_calls(config, devices)
    return [c for c in calls if c.name in only] if only else calls


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.plan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="experiments/NAME/config.py:VARIANT")
    p.add_argument("--devices", type=int, default=None,
                   help="devices of the run (default 1, or a --topology's; fake CPU devices stand in)")
    p.add_argument("--device_memory", default="141GiB", help="memory of one device, e.g. 141GiB, 80GB")
    p.add_argument("--only", nargs="*", default=None, help="plan only these calls (by name)")
    p.add_argument("--platform", default=None, choices=plan.PLATFORMS,
                   help="lower every call for this platform (jax.export) instead of planning its memory")
    p.add_argument("--target", default=None, help="with --platform=cuda: compile for this GPU (e.g. h200)")
    p.add_argument("--topology", default=None, help="with --platform=tpu: compile for this TPU topology "
                                                    "(e.g. v5p:2x2x2)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    cli_parser = parser()
    args, rest = cli_parser.parse_known_args(argv)
    overrides = [a for a in rest if a.startswith("--config.")]
    if len(overrides) != len(rest):
        cli_parser.error(f"unrecognized arguments: {' '.join(a for a in rest if a not in overrides)}")
    try:
        args.devices = num_devices(args)
        device_memory = plan.parse_bytes(args.device_memory)
    except ValueError as e:
        cli_parser.error(str(e))
    # Before JAX starts its backend: the fake devices the mesh is laid over.
    os.environ["XLA_FLAGS"] = plan.with_host_device_count(os.environ.get("XLA_FLAGS", ""), args.devices)
    import jax

    jax.config.update("jax_platforms", "cpu")

    from sera_jax.train import cli

    if jax.device_count() != args.devices:
        print(f"JAX started before the planner could set {args.devices} devices (it has {jax.device_count()})",
              file=sys.stderr)
        return 2
    config = cli.load_config_spec(args.config)
    try:
        experiment = experiment_of(args.config.partition(":")[0])
        apply_overrides(config, overrides)
    except ValueError as e:
        cli_parser.error(str(e))
    if overrides:
        print(f"overrides: {' '.join(overrides)}", flush=True)
    calls_for = functools.partial(selected_calls, experiment, config, args.only)
    if args.target or args.topology:
        return plan.plan_target(calls_for, args.config, args.platform, args.target or args.topology, args.devices)
    if args.platform:
        return plan.lower_all(calls_for, args.config, args.platform, args.devices)
    return plan.plan_memory(calls_for, args.config, args.devices, device_memory)


if __name__ == "__main__":
    sys.exit(main())
