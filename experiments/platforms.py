"""A quiet start on a machine without the accelerator an installed JAX plugin is for.

The ``targets`` extra installs the CUDA plugin and libtpu (``sera_jax.train.targets`` compiles for GPUs and TPUs
with them on a machine that has neither). A run on such a machine then prints their failure to find hardware:
cudart_stub's "Could not find cuda drivers" once for every CUDA library JAX imports, the plugin's "Unable to load
CUDA" traceback, libtpu's "could not determine TPU accelerator type". ``quiet_absent_accelerators()`` keeps JAX
from loading a plugin whose hardware is absent, as a JAX without that plugin would run: it must be called before
JAX is imported, so each experiment's ``main.py`` calls it before importing anything of ``sera_jax`` (whose
package imports JAX). It lives here, not in ``sera_jax.train``, for that reason, and runs only in a program's
``__main__``: the memory planner (``python -m experiments.plan --target=h200``) needs the plugins without
the hardware.

A machine with the hardware is left alone: an NVIDIA device file (the ones ``jax._src.hardware_utils`` reads)
keeps the CUDA plugin, a Google PCI device keeps libtpu, and ``JAX_PLATFORMS`` naming a platform keeps its
plugin (where the device files do not show it, ``JAX_PLATFORMS=cuda`` asks for it).
"""

from __future__ import annotations

import glob
import os
import pathlib
import sys
import types
from collections.abc import Callable, MutableMapping

NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")  # GPU, Docker/Kubernetes, WSL2
GOOGLE_PCI_VENDOR = "0x1ae0"  # every Cloud TPU chip
CUDA_LIBRARIES = ("jax_cuda12_plugin", "jax_cuda13_plugin")  # jaxlib imports their kernels when JAX is imported
CUDA_PJRT_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")  # JAX initialises them at its first use
TPU_LIBRARIES = ("libtpu",)


def has_nvidia_device(exists: Callable[[str], bool] = os.path.exists) -> bool:
    """Whether the device files of an NVIDIA GPU are present."""
    return any(exists(path) for path in NVIDIA_DEVICE_FILES)


def has_tpu(pci_devices: str = "/sys/bus/pci/devices") -> bool:
    """Whether a Google PCI device (a TPU chip) is attached."""
    for vendor in glob.glob(os.path.join(pci_devices, "*", "vendor")):
        try:
            if pathlib.Path(vendor).read_text().strip() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def _no_pjrt_plugin(name: str) -> types.ModuleType:
    """Stands in for a PJRT plugin package: JAX imports every module under ``jax_plugins`` and calls its
    ``initialize()``; this one registers nothing (a missing module would be a logged warning)."""
    module = types.ModuleType(name, "No NVIDIA device on this machine: the CUDA plugin is not loaded.")
    module.initialize = lambda: None
    return module


def quiet_absent_accelerators(environ: MutableMapping[str, str] | None = None,
                              modules: MutableMapping[str, object] | None = None, *,
                              nvidia: bool | None = None, tpu: bool | None = None) -> list[str]:
    """Keeps JAX from loading the CUDA plugin without an NVIDIA device and libtpu without a TPU; returns the
    modules (and variables of ``environ``) it kept out: nothing once JAX is imported, as its plugins are loaded.

    ``environ`` / ``modules``: ``os.environ`` / ``sys.modules``; ``nvidia`` / ``tpu``: whether that hardware is
    present (default: ``has_nvidia_device()`` / ``has_tpu()``).
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "jax" in modules:
        return []
    requested = {p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    kept_out: list[str] = []
    if not (has_nvidia_device() if nvidia is None else nvidia) and not requested & {"cuda", "gpu"}:
        for name in CUDA_LIBRARIES:
            if name not in modules:
                modules[name] = None  # an import of it fails; jaxlib then uses none, as without the plugin
                kept_out.append(name)
        for name in CUDA_PJRT_PLUGINS:
            if name not in modules:
                modules[name] = _no_pjrt_plugin(name)
                kept_out.append(name)
    if not (has_tpu() if tpu is None else tpu) and not ("tpu" in requested or "JAX_FORCE_TPU_INIT" in environ):
        for name in TPU_LIBRARIES:
            if name not in modules:
                modules[name] = None
                kept_out.append(name)
        # JAX loads the library this names without libtpu's module; a process started by a JAX program inherits it
        # (importing JAX sets it), so it says nothing of a TPU here.
        if environ.pop("TPU_LIBRARY_PATH", None) is not None:
            kept_out.append("TPU_LIBRARY_PATH")
    return kept_out
