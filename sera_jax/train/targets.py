"""The GPUs and TPUs a run can be planned for, their devices without the hardware, and roofline step times.

``target_devices("cuda", "h200", 8)`` and ``target_devices("tpu", "v5p:2x2x2")`` give devices that JAX can lay a
mesh over and compile for (``jax.experimental.topologies.get_topology_desc``) on a machine with neither: XLA:GPU
from the CUDA plugin with a ``GpuTargetConfigProto`` shipped in ``target_configs/``, XLA:TPU from libtpu. Both come
with the ``targets`` extra (``pip install -e ".[targets]"``). ``roofline_seconds`` and ``mfu_bound`` turn XLA's
FLOP and byte counts of a compiled program into the fastest step the chip allows and the MFU that step has.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

PLATFORMS = ("cuda", "tpu")
_CONFIG_DIR = pathlib.Path(__file__).with_name("target_configs")
_INSTALL = 'pip install -e ".[targets]"'


@dataclasses.dataclass(frozen=True)
class Target:
    """One accelerator chip: dense bf16 peak, HBM capacity and bandwidth, per chip, as its vendor states them."""

    name: str  # the --target / topology prefix, e.g. "h200", "v5p"
    platform: str  # "cuda" or "tpu"
    label: str  # how the table names it, e.g. "H200"
    peak_flops: float  # dense bf16 FLOP/s (no 2:4 sparsity)
    hbm_bytes: int
    hbm_bandwidth: float  # bytes/s
    target_config: str | None = None  # GPU: a GpuTargetConfigProto under target_configs/ (None: cannot compile)


GB, GiB = 10**9, 2**30
TARGETS: dict[str, Target] = {t.name: t for t in (
    # NVIDIA H100 SXM datasheet (nvidia.com/en-us/data-center/h100): BF16 Tensor Core 1,979 TFLOPS "with sparsity,
    # 1/2 lower without", so 989.4 dense (Hopper whitepaper's table, glennklockwood.com/garden/processors/h100);
    # 3.35 TB/s. Memory: XLA's specs/h100_sxm.txtpb device_memory_size, 84,942,979,072 B (the 80 GB part's
    # usable 79.1 GiB), the figure XLA:GPU plans with; that spec's 3.352 TB/s agrees with the datasheet.
    Target("h100", "cuda", "H100", 989.4e12, 84_942_979_072, 3.35e12, "h100.txtpb"),
    # NVIDIA H200 SXM datasheet (nvidia.com/en-us/data-center/h200): the H100's die and tensor cores (BF16 1,979
    # TFLOPS with sparsity, 989.4 dense), 141 GB HBM3e at 4.8 TB/s. Memory: XLA's specs/h200.txtpb
    # device_memory_size, 151,397,597,184 B (141 GiB), the figure XLA:GPU itself plans with.
    Target("h200", "cuda", "H200", 989.4e12, 151_397_597_184, 4.8e12, "h200.txtpb"),
    # NVIDIA B200 in HGX boards (1,000 W): BF16 Tensor Core 2,250 TFLOPS dense (4,500 with sparsity), from NVIDIA's
    # Blackwell architecture figures as tabulated at glennklockwood.com/garden/processors/B200 (the 1,200 W GB200
    # part's 2,500 is not this chip's). Memory and bandwidth: XLA's specs/b200.txtpb, 191,514,411,008 B and
    # 7.672 TB/s (vendor pages round them to 192 GB and 7.7-8 TB/s).
    Target("b200", "cuda", "B200", 2250e12, 191_514_411_008, 7.672e12, "b200.txtpb"),
    # Cloud TPU docs, cloud.google.com/tpu/docs/v4: 275 TFLOPS bf16 per chip; HBM2 32 GiB, 1200 GBps.
    Target("v4", "tpu", "v4", 275e12, 32 * GiB, 1200e9),
    # cloud.google.com/tpu/docs/v5e: 197 TFLOPS bf16 per chip; HBM2 16 GB, 819 GBps.
    Target("v5e", "tpu", "v5e", 197e12, 16 * GB, 819e9),
    # cloud.google.com/tpu/docs/v5p: 459 TFLOPS bf16 per chip; HBM2e 95 GB, 2765 GBps.
    Target("v5p", "tpu", "v5p", 459e12, 95 * GB, 2765e9),
    # cloud.google.com/tpu/docs/v6e: 918 TFLOPS bf16 per chip; HBM 32 GB, 1638 GBps.
    Target("v6e", "tpu", "v6e", 918e12, 32 * GB, 1638e9),
)}

# The package each platform's compiler comes from, and the module that shows it is installed.
_PLUGINS = {"cuda": ("jax-cuda12-plugin", "jax_cuda12_plugin"), "tpu": ("libtpu (jax[tpu])", "libtpu")}


class MissingPluginError(RuntimeError):
    """The compiler for a platform is not installed (the ``targets`` extra)."""


def get_target(name: str, platform: str | None = None) -> Target:
    """The table's entry for ``name`` (case-insensitive); ValueError naming it (and ``platform``) otherwise."""
    target = TARGETS.get(name.lower())
    if target is None or (platform is not None and target.platform != platform):
        known = ", ".join(t.name for t in TARGETS.values() if platform in (None, t.platform))
        raise ValueError(f"target={name!r}: not a known{' ' + platform if platform else ''} target; choose one of "
                         f"{known}")
    return target


def parse_topology(topology: str) -> tuple[Target, tuple[int, ...]]:
    """``"v5p:2x2x2"`` -> (the v5p target, (2, 2, 2)); ValueError naming ``topology`` otherwise."""
    m = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)*)", topology.strip().lower())
    if not m:
        raise ValueError(f"topology={topology!r}: expected CHIP:AxB[xC], e.g. v5p:2x2x2 or v5e:2x2")
    if m.group(1) not in TARGETS or TARGETS[m.group(1)].platform != "tpu":
        known = ", ".join(t.name for t in TARGETS.values() if t.platform == "tpu")
        raise ValueError(f"topology={topology!r}: chip {m.group(1)!r} is not a known TPU; choose one of {known}")
    dims = tuple(int(d) for d in m.group(2).split("x"))
    if min(dims) < 1:
        raise ValueError(f"topology={topology!r}: every dimension must be >= 1")
    return TARGETS[m.group(1)], dims


def topology_chips(topology: str) -> int:
    """Chips of a TPU topology (the product of its dimensions)."""
    return math.prod(parse_topology(topology)[1])


def gpu_topology(num_devices: int) -> str:
    """``get_topology_desc``'s GPU topology for ``num_devices``: one host of up to 8, else hosts of 8."""
    if num_devices < 1 or (num_devices > 8 and num_devices % 8):
        raise ValueError(f"num_devices={num_devices}: expected 1 to 8 GPUs, or a multiple of 8 (hosts of 8)")
    return f"1x1x{num_devices}" if num_devices <= 8 else f"1x{num_devices // 8}x8"


def require_plugin(platform: str) -> None:
    """MissingPluginError naming the package when ``platform``'s compiler is not installed."""
    if platform not in _PLUGINS:
        raise ValueError(f"platform={platform!r}: choose one of {', '.join(PLATFORMS)}")
    package, module = _PLUGINS[platform]
    if importlib.util.find_spec(module) is None:
        raise MissingPluginError(f"platform={platform}: {package} is not installed, so XLA cannot compile for it "
                                 f"here ({_INSTALL})")
    if platform == "cuda" and importlib.util.find_spec("nvidia.cuda_nvcc") is None:
        # Without ptxas (and no CUDA on the machine) XLA:GPU stops at "No PTX compilation provider".
        raise MissingPluginError(f"platform=cuda: nvidia-cuda-nvcc-cu12 (ptxas) is not installed ({_INSTALL})")


def target_devices(platform: str, target_or_topology: str, num_devices: int | None = None) -> list[Any]:
    """Devices of a GPU target (``"h200"``, ``num_devices`` of them, default 1) or a TPU topology
    (``"v5p:2x2x2"``; ``num_devices``, if given, must be its device count) for JAX to compile for."""
    from jax.experimental import topologies

    if platform == "cuda":
        target = get_target(target_or_topology, "cuda")
        if target.target_config is None:
            raise ValueError(f"target={target_or_topology!r}: no GpuTargetConfigProto shipped for it (only "
                             f"{', '.join(t.name for t in TARGETS.values() if t.target_config)}); add one under "
                             f"{_CONFIG_DIR}")
        topology = gpu_topology(1 if num_devices is None else num_devices)
        require_plugin("cuda")
        text = (_CONFIG_DIR / target.target_config).read_text()
        return list(topologies.get_topology_desc(platform="cuda", topology=topology, target_config=text).devices)
    if platform == "tpu":
        parse_topology(target_or_topology)
        require_plugin("tpu")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")  # else libtpu looks for a TPU VM's metadata
        devices = list(topologies.get_topology_desc(target_or_topology, platform="tpu").devices)
        if num_devices is not None and num_devices != len(devices):
            raise ValueError(f"num_devices={num_devices}: topology {target_or_topology} has {len(devices)} devices")
        return devices
    raise ValueError(f"platform={platform!r}: choose one of {', '.join(PLATFORMS)}")


def devices_per_chip(devices: Sequence[Any]) -> int:
    """How many JAX devices share one chip (v4 topologies give each TensorCore its own device; megacore chips and
    GPUs one per chip): devices per distinct ``coords``, 1 where devices have none."""
    coords = [tuple(getattr(d, "coords", ()) or ()) for d in devices]
    if not all(coords):
        return 1
    return max(1, len(devices) // len(set(coords)))


def per_device(target: Target, share: int) -> Target:
    """``target`` with peak, memory and bandwidth split between the ``share`` devices of one chip."""
    if share == 1:
        return target
    return dataclasses.replace(target, peak_flops=target.peak_flops / share, hbm_bytes=target.hbm_bytes // share,
                               hbm_bandwidth=target.hbm_bandwidth / share)


def roofline_seconds(flops: float, bytes_accessed: float, target: Target) -> float:
    """The roofline's step time on one device: max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)."""
    if flops < 0 or bytes_accessed < 0:
        raise ValueError(f"flops={flops}, bytes_accessed={bytes_accessed}: counts must be >= 0")
    return max(flops / target.peak_flops, bytes_accessed / target.hbm_bandwidth)


def mfu_bound(flops: float, bytes_accessed: float, target: Target) -> float:
    """The highest model-FLOPs utilisation the roofline allows: FLOPs / (roofline seconds x peak), 1 when
    compute-bound, the arithmetic intensity over the ridge point when memory-bound (0 for a program of no FLOPs)."""
    seconds = roofline_seconds(flops, bytes_accessed, target)
    return 0.0 if seconds == 0 else flops / (seconds * target.peak_flops)


def compiled_cost(compiled: Any) -> tuple[float, float]:
    """(FLOPs, bytes accessed) per device of a compiled program: its own cost analysis (XLA:TPU, XLA:CPU), else
    XLA's HLO cost model over its optimized module (XLA:GPU answers None). Both count a loop body once."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    if not cost:
        from jax._src import xla_bridge
        from jax._src.lib import _jax

        modules = compiled.runtime_executable().hlo_modules()
        cost = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), modules[0])
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def has_loop(compiled: Any) -> bool:
    """Whether the optimized program has a while loop (a ``lax.scan``/``fori_loop``), whose body the cost
    analyses count once: the FLOPs and bytes are then a lower bound."""
    return re.search(r"\bwhile\(", compiled.as_text() or "") is not None
