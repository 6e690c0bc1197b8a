"""Multi-host start-up and host reads: every host runs the same program; ``jax.distributed.initialize`` joins them.

On Cloud TPU pods and SLURM/GPU clusters JAX discovers the coordinator from the environment, so no
arguments are needed; elsewhere set ``SERA_COORDINATOR=host:port``, ``SERA_NUM_PROCESSES`` and
``SERA_PROCESS_ID`` (the launchers in ``scripts/`` do).

In a multi-host job an array sharded over the global mesh has rows on other hosts' devices, which
``np.asarray`` / ``jax.device_get`` cannot read. Where the host needs the values (rewards scored on the host,
evaluation counts, metrics), read them with ``host_array`` / ``to_host``: they gather such arrays from every
process first (a collective, so every process calls them at the same point, as it does when all hosts run the
same program) and are ``np.asarray`` otherwise -- one process reads exactly what it read before.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils


def maybe_initialize_distributed(enabled: bool) -> None:
    """Joins the multi-host job if ``enabled`` (a no-op for a single process)."""
    if not enabled:
        return
    kwargs = {}
    if "SERA_COORDINATOR" in os.environ:
        kwargs = dict(coordinator_address=os.environ["SERA_COORDINATOR"],
                      num_processes=int(os.environ["SERA_NUM_PROCESSES"]),
                      process_id=int(os.environ["SERA_PROCESS_ID"]))
    jax.distributed.initialize(**kwargs)
    logging.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count())


def spans_other_processes(x: Any) -> bool:
    """Whether ``x`` is a jax array with parts on other processes' devices only (not readable here as is)."""
    return isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated


def host_array(x: Any) -> np.ndarray:
    """The whole value of ``x`` as a numpy array on this host: gathered from every process
    (``multihost_utils.process_allgather``) when it is sharded over other processes' devices, else
    ``np.asarray(x)``."""
    if spans_other_processes(x):
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def to_host(tree: Any) -> Any:
    """``host_array`` of every array leaf of ``tree`` (the multi-host-safe ``jax.device_get``)."""
    return jax.tree.map(lambda x: host_array(x) if isinstance(x, jax.Array) else x, tree)


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier ``name`` (a no-op for a single process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
