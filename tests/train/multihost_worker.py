"""One process of ``test_multihost.test_checkpoints_reads_and_workdir_with_one_device_per_process``.

    SERA_COORDINATOR=localhost:PORT SERA_NUM_PROCESSES=2 SERA_PROCESS_ID=I python -m tests.train.multihost_worker DIR

Every process runs it on one shared ``DIR``: it joins the job, claims the workdir, places a state on the global
mesh and a process-local one (as SFT's), reads a sharded batch on the host, saves both states and restores them,
then moves the restored process-local state onto the mesh (as a resumed run does after SFT). It exits non-zero
on any mismatch.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train import distributed, sharding, workdir


def main(directory: str) -> None:
    distributed.maybe_initialize_distributed(True)
    assert jax.process_count() == 2, jax.process_count()
    root = workdir.prepare_workdir(directory, min_free_bytes=1)
    workdir.claim_workdir(root, {"model.d_model": 16})
    placement = sharding.make_placement(sharding.default_mesh_config())
    assert placement.num_batch_shards == jax.device_count()

    rows = 2 * jax.device_count()
    batch = placement.batch(jnp.arange(rows, dtype=jnp.float32))
    assert not batch.is_fully_addressable
    np.testing.assert_array_equal(distributed.host_array(batch), np.arange(rows))  # gathered from both processes
    scalars = distributed.to_host({"mean": jnp.mean(batch), "n": 3})
    assert float(scalars["mean"]) == (rows - 1) / 2 and scalars["n"] == 3

    mesh_state = placement.tree({"w": jnp.arange(8.0).reshape(4, 2), "step": jnp.ones((), jnp.int32)})
    local_state = {"v": jnp.full((3,), 2.0)}  # on this process's default device, like a model after SFT
    assert ckpt_lib.find_non_finite(mesh_state) == []
    with ckpt_lib.Checkpointer(root / "checkpoints") as checkpointer:
        checkpointer.save(1, {"mesh": mesh_state, "local": local_state}, metadata={"note": "x"}, force=True)
        checkpointer.wait()
        target = ckpt_lib.abstract_like({"mesh": mesh_state, "local": local_state})
        restored, meta = checkpointer.restore(None, target)
    assert meta == {"note": "x"}
    np.testing.assert_array_equal(distributed.host_array(restored["mesh"]["w"]), np.arange(8.0).reshape(4, 2))
    assert restored["mesh"]["w"].sharding == mesh_state["w"].sharding
    assert restored["local"]["v"].sharding.is_fully_addressable
    np.testing.assert_array_equal(np.asarray(restored["local"]["v"]), np.full((3,), 2.0))
    moved = placement.tree(restored["local"])  # what a resumed run does with its restored SFT policy
    np.testing.assert_array_equal(distributed.host_array(moved["v"]), np.full((3,), 2.0))
    distributed.barrier("multihost_worker:done")
    (root / f"done_{jax.process_index()}").write_text("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
