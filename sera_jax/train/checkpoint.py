"""Checkpointing behind one class, so the rest of the code never imports orbax.

A checkpoint at step `s` is the directory `<directory>/<s>/` with two orbax items:

- `state`: the train state, any pytree of arrays and scalars (NNX params as an `nnx.State`, optax
  state, step, data-iterator position, success-rate tracker, PRNG key), saved sharded;
- `meta`: JSON with the config fingerprint and caller metadata (e.g. the full config).

Resuming::

    ckpt = Checkpointer(workdir / "ckpt", max_to_keep=3, save_interval_steps=100,
                        config_fingerprint=config_utils.fingerprint(config, FINGERPRINT_FIELDS))
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(None, abstract_state)  # None: the latest step
    ...
    ckpt.save(step, state, metadata={"config": config_utils.config_to_dict(config)})
    ckpt.close()  # waits for the last asynchronous save

Multi-host, every process calls the same methods on one shared directory (orbax coordinates the writes).
Process-local arrays (a model trained on each host's own device, as SFT is) are saved as the same value
replicated over all devices (process 0's copy is written) and restored onto the device they came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from sera_jax.train import config_utils
from sera_jax.train.distributed import to_host

_STATE = "state"
_META = "meta"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupted, incomplete, or not matching the requested state."""


class ConfigMismatchError(CheckpointError):
    """The checkpoint was written under a config whose fingerprinted fields differ from the current one."""


class NonFiniteStateError(ValueError):
    """Refused to save a state containing NaN or infinite floats."""


def _path_str(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _is_float(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


@jax.jit
def _all_finite(leaves: list[jax.Array]) -> list[jax.Array]:
    # One compiled reduction per state structure instead of one device round trip per leaf.
    return [jnp.all(jnp.isfinite(x)) for x in leaves]


def find_non_finite(tree: Any) -> list[str]:
    """Paths ("params/kernel/value") of float leaves holding a NaN or an infinity."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    bad: list[str] = []
    device_leaves, device_paths = [], []
    for path, x in flat:
        if isinstance(x, jax.Array):
            if _is_float(x.dtype):
                device_leaves.append(x)
                device_paths.append(path)
        elif isinstance(x, (float, np.floating, np.ndarray)):
            arr = np.asarray(x)
            if _is_float(arr.dtype) and not np.all(np.isfinite(arr)):
                bad.append(_path_str(path))
    if device_leaves:
        flags = to_host(_all_finite(device_leaves))  # every process calls save: arrays over hosts are read
        bad.extend(_path_str(p) for p, ok in zip(device_paths, flags) if not ok)
    return sorted(bad)


def _is_process_local(x: Any) -> bool:
    """A jax array only this process holds (one device, or a mesh of its own devices) in a multi-process job:
    orbax refuses to write those ("Cannot serialize host local jax.Array ... in multi-host setting")."""
    return jax.process_count() > 1 and x.sharding.is_fully_addressable


def _to_global(x: jax.Array) -> jax.Array:
    """A process-local array as the same value replicated over every device of the job (zero-copy on the
    devices that already hold it). Every process must hold the same value: every host runs the same program
    (e.g. SFT on one device per host), so replica 0 (process 0) is what orbax writes."""
    shards = [jax.device_put(x, d) for d in jax.local_devices()]
    return jax.make_array_from_single_device_arrays(x.shape, _default_sharding(), shards)


def _for_orbax(x: Any) -> Any:
    """A leaf orbax can write in a multi-process job: process-local arrays made global (``_to_global``), and a
    copy of a global array whose per-device buffers JAX built wrongly. (JAX 0.10, one local device per process:
    ``device_put`` of an uncommitted array onto a multi-process sharding gives an array whose one local buffer
    claims every device, so ``addressable_shards`` -- which orbax reads -- raises; a copy has proper buffers.)"""
    if not isinstance(x, jax.Array):
        return x
    if _is_process_local(x):
        return _to_global(x)
    try:
        x.addressable_shards
    except ValueError:
        return jax.device_put(x, x.sharding, may_alias=False)
    return x


def _from_global(x: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """A replicated global array back on this process's ``sharding`` (the inverse of ``_to_global``). On the
    default device the copy is uncommitted, like the output of a step run there (SFT), so that it can still be
    placed onto the global mesh afterwards (``device_put`` refuses a committed process-local array)."""
    local = x.addressable_data(0)
    if sharding.device_set == {jax.local_devices()[0]}:
        return jax.device_put(np.asarray(local))
    return jax.device_put(local, sharding)


def _default_sharding() -> jax.sharding.Sharding:
    """Where a leaf without a sharding is restored: one device, or replicated across hosts."""
    if jax.process_count() == 1:
        return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    mesh = jax.make_mesh((jax.device_count(),), ("replica",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def abstract_like(tree: Any) -> Any:
    """The restore target for `tree`: jax arrays (and ShapeDtypeStructs without a sharding) become
    ShapeDtypeStructs with a sharding; numpy arrays and Python scalars are kept (restored as such)."""

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_default_sharding())
        return x

    return jax.tree.map(one, tree)


class Checkpointer:
    """Saves and restores a train-state pytree plus JSON metadata with orbax's CheckpointManager.

    - Saves are asynchronous; `wait()`/`close()` block until they are on disk, and `restore`,
      `latest_step` wait first so they see every save made before.
    - `save` refuses non-finite floats (NonFiniteStateError) before touching the directory, so the
      existing checkpoints stay as they were.
    - `restore` refuses a checkpoint written under a different `config_fingerprint`
      (ConfigMismatchError, naming the fields), and reports a corrupted or incompatible checkpoint
      as a CheckpointError naming its path.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_to_keep: int | None = 3,
        save_interval_steps: int = 1,
        config_fingerprint: Mapping[str, Any] | None = None,
        *,
        async_save: bool = True,
    ):
        # Local paths are made absolute (orbax needs that); URLs (gs://...) are passed through.
        self._directory = epath.Path(directory)
        if "://" not in os.fspath(directory):
            self._directory = self._directory.absolute()
        if self._directory.exists() and not self._directory.is_dir():
            raise CheckpointError(f"checkpoint directory {self._directory} exists and is not a directory")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep}: must be >= 1 or None (keep all)")
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps={save_interval_steps}: must be >= 1")
        self._fingerprint = None if config_fingerprint is None else config_utils.to_jsonable(
            dict(config_fingerprint), "config_fingerprint")
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_interval_steps,
            create=True,
            enable_async_checkpointing=async_save,
        )
        try:
            self._manager = ocp.CheckpointManager(self._directory, options=options)
        except Exception as e:  # e.g. unreadable directory: say which one.
            raise CheckpointError(f"cannot open checkpoint directory {self._directory}: "
                                  f"{type(e).__name__}: {e}") from e

    @property
    def directory(self) -> epath.Path:
        return self._directory

    def step_path(self, step: int) -> epath.Path:
        """The directory of the checkpoint at `step`."""
        return self._directory / str(step)

    def all_steps(self) -> list[int]:
        """Steps with a finalised checkpoint, ascending (waits for pending saves)."""
        self.wait()
        self._manager.reload()  # Another process (or a previous run) may have written since.
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest checkpointed step, or None if there is none yet."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int) -> bool:
        """Whether `save(step, ...)` without `force` would write (every `save_interval_steps`)."""
        return self._manager.should_save(step)

    def save(
        self, step: int, state: Any, metadata: Mapping[str, Any] | None = None, *, force: bool = False
    ) -> bool:
        """Starts saving `state` at `step` if the interval says so (or `force`); returns whether it did.

        Saving a step that is already checkpointed is a no-op (False); saving a step older than the
        latest is an error, since it would interleave two histories in one directory.
        """
        step = int(step)
        # orbax's own record (includes in-flight saves): no waiting on the async save in the hot loop.
        latest = self._manager.latest_step()
        if latest is not None and step <= latest:
            if step == latest:
                return False
            raise ValueError(
                f"step {step} is before the latest checkpoint {latest} in {self._directory}; "
                "restore the latest checkpoint or use a new directory")
        if not (force or self._manager.should_save(step)):
            return False
        bad = find_non_finite(state)
        if bad:
            shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
            raise NonFiniteStateError(
                f"refusing to save step {step} to {self._directory}: non-finite values in {shown}; "
                f"the existing checkpoints (latest: {latest}) are untouched")
        meta = {
            "step": step,
            "config_fingerprint": self._fingerprint,
            "fingerprint_digest": None if self._fingerprint is None else config_utils.fingerprint_digest(
                self._fingerprint),
            "user": config_utils.to_jsonable(dict(metadata or {}), "metadata"),
        }
        if jax.process_count() > 1:
            state = jax.tree.map(_for_orbax, state)
        args = ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(meta)})
        return bool(self._manager.save(step, args=args, force=True))

    def _resolve_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self._directory}")
        if step is None:
            return steps[-1]
        if int(step) not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self._directory}; "
                                    f"available steps: {steps}")
        return int(step)

    def _check_items(self, step: int) -> epath.Path:
        path = self.step_path(step)
        missing = [item for item in (_STATE, _META) if not (path / item).exists()]
        if missing:
            raise CheckpointError(f"checkpoint {path} is incomplete or corrupted: missing {missing}; "
                                  "delete it to resume from the previous one")
        return path

    def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The full JSON metadata of a checkpoint (`None`: the latest), without reading the state."""
        step = self._resolve_step(step)
        path = self._check_items(step)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))
            meta = restored[_META]
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} has unreadable metadata "
                                  f"({type(e).__name__}: {e})") from e
        if not isinstance(meta, dict) or "user" not in meta:
            raise CheckpointError(f"checkpoint {path} has malformed metadata: {meta!r:.200}")
        return meta

    def _check_fingerprint(self, meta: Mapping[str, Any]) -> None:
        saved = meta.get("config_fingerprint")
        if self._fingerprint is None or saved is None:
            return  # Nothing to compare against: the caller opted out of the check.
        diff = config_utils.diff_fingerprints(saved, self._fingerprint)
        if diff:
            raise ConfigMismatchError(
                f"checkpoint {self.step_path(meta['step'])} was written with a different config:\n  "
                + "\n  ".join(diff)
                + "\nuse a new workdir, or restore with the checkpoint's config")

    def check_config(self, step: int | None = None) -> None:
        """Raises ConfigMismatchError if the checkpoint's fingerprint differs from this config's
        (call it at start-up to fail before building the model)."""
        self._check_fingerprint(self.restore_metadata(step))

    def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores (state, caller metadata) at `step` (None: the latest) into `abstract_state`.

        `abstract_state` is a pytree of `jax.ShapeDtypeStruct`s carrying the target shardings
        (concrete arrays also work; see `abstract_like`). Raises FileNotFoundError when there is no
        such checkpoint, ConfigMismatchError, or CheckpointError naming the checkpoint's path.
        """
        step = self._resolve_step(step)
        path = self._check_items(step)
        meta = self.restore_metadata(step)
        self._check_fingerprint(meta)
        target = abstract_like(abstract_state)
        # Process-local leaves (multi-process only) are read as replicated global arrays, then put back.
        local = jax.tree.map(lambda x: isinstance(x, jax.ShapeDtypeStruct) and _is_process_local(x), target)
        any_local = any(jax.tree.leaves(local))
        global_target = target if not any_local else jax.tree.map(
            lambda x, is_local: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_default_sharding()) if is_local
            else x, target, local)
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(global_target)}))
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if "not compatible with the stored shape" in text or "do not match" in text:
                why = "its state does not match the requested abstract state"
            else:
                why = "it is corrupted or incomplete"
            if len(text) > 600:  # tensorstore appends its whole JSON spec; the start says what broke.
                text = text[:600] + " ..."
            raise CheckpointError(f"cannot restore checkpoint {path}: {why}\n{text}") from e
        state = restored[_STATE]
        if any_local:
            state = jax.tree.map(lambda x, t, is_local: _from_global(x, t.sharding) if is_local else x, state,
                                 target, local)
        return state, meta["user"]

    def wait(self) -> None:
        """Blocks until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases orbax's resources."""
        self._manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

