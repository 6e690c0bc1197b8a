"""Multi-host start-up: every host runs the same program; ``jax.distributed.initialize`` joins them.

On Cloud TPU pods and SLURM/GPU clusters JAX discovers the coordinator from the environment, so no
arguments are needed; elsewhere set ``SERA_COORDINATOR=host:port``, ``SERA_NUM_PROCESSES`` and
``SERA_PROCESS_ID`` (the launchers in ``scripts/`` do).
"""

from __future__ import annotations

import os

import jax
from absl import logging


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
