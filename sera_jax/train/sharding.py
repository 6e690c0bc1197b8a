"""Device mesh, logical-axis sharding rules and host-batch placement.

Models annotate parameters with *logical* axis names through flax sharding metadata
(`nnx.with_partitioning(init, ("embed", "mlp"))`, stored as the Variable's `out_sharding`). A config
keeps the *rules* that map each logical name to a mesh axis (or to None: replicated), so the same model
runs data-parallel on a laptop and FSDP + tensor-parallel on a pod by changing only `config.mesh`.

Typical use::

    mesh = make_mesh(config.mesh)
    graphdef, abstract_state, shardings = abstract_sharded(lambda: Model(cfg, rngs=nnx.Rngs(0)),
                                                           mesh, config.mesh.rules)
    batch = shard_batch(host_batch, mesh, config.mesh.data_axes)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from sera_jax.train import config_utils

MeshAxes = str | tuple[str, ...] | None
LogicalRules = Sequence[tuple[str, MeshAxes]]

# The axes a flat rollout batch (leading axis B) is split over: FSDP shards are data-parallel too.
DATA_AXES: tuple[str, ...] = ("data", "fsdp")

# Rules for the decoder's logical names (FSDP over "fsdp", tensor parallelism over "model").
# A logical name may appear several times: the first entry whose mesh axes are free and divide
# the dimension wins, so later entries are fallbacks.
DECODER_RULES: tuple[tuple[str, MeshAxes], ...] = (
    ("vocab", "model"),
    ("embed", "fsdp"),
    ("mlp", "model"),
    ("q_heads", "model"),
    ("kv_heads", "model"),
    ("head_dim", None),
    ("norm", None),
)


def default_mesh_config() -> ml_collections.ConfigDict:
    """The `config.mesh` sub-dict: pure data parallelism over all devices, decoder rules."""
    config = ml_collections.ConfigDict()
    config.axes = ("data", "fsdp", "model")
    config.shape = (-1, 1, 1)  # -1: all devices not used by the other axes.
    config.axis_types = "auto"  # "auto" (jit + GSPMD propagation) or "explicit" (sharding in types).
    config.data_axes = DATA_AXES
    config.rules = DECODER_RULES
    return config


def _cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """`config[key]` for a ConfigDict or a plain mapping, `default` when absent."""
    if isinstance(config, (Mapping, ml_collections.ConfigDict)):
        return config.get(key, default)
    raise ValueError(f"mesh config must be a ConfigDict or a mapping, got {type(config).__name__}")


def _resolve_mesh_shape(shape: tuple[int, ...], num_devices: int) -> tuple[int, ...]:
    """Replaces the (at most one) -1 in `shape` (checked by `check_mesh_config`) by the devices left over;
    checks the product."""
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"mesh.shape={shape}: the fixed axes use {known} devices, which does not divide the "
                f"{num_devices} available")
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"mesh.shape={shape} uses {math.prod(shape)} devices but {num_devices} are available")
    return shape


def make_mesh(mesh_config: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds a `jax.make_mesh` mesh over all devices from `config.mesh` (axes, shape, axis_types).

    Axis types default to Auto: shardings are given to `jax.jit` and propagated by the compiler, as
    in MaxText; "explicit" puts shardings into types (then every op must be sharding-aware).
    """
    axes, shape, kind = check_mesh_config(mesh_config)
    devices = list(jax.devices() if devices is None else devices)
    shape = _resolve_mesh_shape(shape, len(devices))
    return jax.make_mesh(shape, axes, axis_types=(_AXIS_TYPES[kind],) * len(axes), devices=devices)


_AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def check_mesh_config(mesh_config: Any) -> tuple[tuple[str, ...], tuple[int, ...], str]:
    """(axes, shape, axis type) of ``config.mesh``, checked for any device count: a config that cannot make a
    mesh fails on the laptop it was written on, not first on the pod (a single device uses no mesh)."""
    axes = tuple(_cfg_get(mesh_config, "axes", ()))
    shape = tuple(_cfg_get(mesh_config, "shape", ()))
    if not axes or len(axes) != len(shape):
        raise ValueError(f"mesh.axes={axes} and mesh.shape={shape} must be non-empty and the same length")
    if len(set(axes)) != len(axes):
        raise ValueError(f"mesh.axes={axes} has repeated names")
    if not all(config_utils.is_int(s) and (s >= 1 or s == -1) for s in shape):
        raise ValueError(f"mesh.shape={shape}: sizes must be positive ints or -1")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh.shape={shape}: at most one axis may be -1")
    kind = str(_cfg_get(mesh_config, "axis_types", "auto")).lower()
    if kind not in _AXIS_TYPES:
        raise ValueError(f"mesh.axis_types={kind!r}: expected 'auto' or 'explicit'")
    return axes, shape, kind


def _as_axes(mesh_axes: MeshAxes) -> tuple[str, ...]:
    """Normalises a rule's right-hand side to a tuple of mesh axis names (empty: replicated)."""
    if mesh_axes is None:
        return ()
    if isinstance(mesh_axes, str):
        return (mesh_axes,)
    return tuple(mesh_axes)


def validate_rules(rules: LogicalRules, mesh: Mesh) -> None:
    """Raises ValueError for malformed rules or rules naming axes the mesh does not have."""
    for i, rule in enumerate(rules):
        if len(rule) != 2 or not isinstance(rule[0], str):
            raise ValueError(f"mesh.rules[{i}]={rule!r}: expected (logical_name, mesh_axis_or_None)")
        for axis in _as_axes(rule[1]):
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"mesh.rules[{i}]={tuple(rule)!r} names mesh axis {axis!r}; the mesh has "
                    f"{mesh.axis_names}")


def logical_to_mesh_spec(
    logical_axes: Sequence[str | None],
    rules: LogicalRules,
    mesh: Mesh,
    shape: Sequence[int] | None = None,
    where: str = "parameter",
) -> PartitionSpec:
    """Maps one array's logical axis names to a PartitionSpec on `mesh`.

    Per dimension, the first rule for its logical name is used whose mesh axes are not already
    used by an earlier dimension and (if `shape` is given) whose total size divides the dimension;
    if no rule fits, the dimension is replicated (tiny test models on many devices). A logical name
    with no rule at all is an error, so a typo cannot silently replicate a whole model.
    """
    if shape is not None and len(shape) != len(logical_axes):
        raise ValueError(f"{where}: {len(logical_axes)} logical axes {tuple(logical_axes)} for shape "
                         f"{tuple(shape)}")
    known = {name for name, _ in rules}
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(logical_axes):
        if name is None:
            spec.append(None)
            continue
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            raise ValueError(
                f"{where}: logical axis {name!r} has no entry in mesh.rules"
                + (f" (did you mean {close}?)" if close else f"; rules cover {sorted(known)}"))
        chosen: tuple[str, ...] = ()
        for rule_name, mesh_axes in rules:
            if rule_name != name:
                continue
            axes = _as_axes(mesh_axes)
            if not axes:
                break
            if used.intersection(axes):
                continue
            size = math.prod(mesh.shape[a] for a in axes)
            if shape is not None and shape[dim] % size:
                logging.info("%s: dim %d (%s, size %d) not divisible by mesh axes %s (size %d); trying the "
                             "next rule", where, dim, name, shape[dim], axes, size)
                continue
            chosen = axes
            break
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
    return PartitionSpec(*spec)


def _path_str(path: tuple[Any, ...]) -> str:
    """A readable 'a/b/c' for a pytree key path."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _value_shape(x: Any) -> tuple[int, ...]:
    return tuple(getattr(x, "shape", np.shape(x)))


def state_shardings(tree: Any, mesh: Mesh, rules: LogicalRules) -> Any:
    """NamedShardings for a whole pytree (an NNX state, an optax state over it, or any mix).

    NNX Variables with `out_sharding` logical names follow the rules; every other leaf (plain
    arrays, counters, keys, Variables without annotations) is replicated. The result has the
    tree's structure, so it can be given to `jax.jit(in_shardings=..., out_shardings=...)`.
    """
    validate_rules(rules, mesh)

    def one(path: tuple[Any, ...], leaf: Any) -> Any:
        if isinstance(leaf, nnx.Variable):
            logical = leaf.get_metadata().get("out_sharding")
            value = leaf.get_value()
            spec = PartitionSpec()
            if logical:
                spec = logical_to_mesh_spec(tuple(logical), rules, mesh, _value_shape(value),
                                            where=_path_str(path))
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _as_abstract_leaf(x: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        x = np.asarray(x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def with_shardings(tree: Any, shardings: Any) -> Any:
    """A pytree of `jax.ShapeDtypeStruct(shape, dtype, sharding)`: the abstract target of a restore."""
    return jax.tree.map(_as_abstract_leaf, tree, shardings)


def abstract_sharded(
    init_fn: Callable[[], nnx.Module], mesh: Mesh, rules: LogicalRules
) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graphdef, abstract state with shardings, shardings) of the module `init_fn` builds; no FLOPs.

    Eager sharding is switched off while tracing because the shardings come from our rules, not
    from flax's global rule context.
    """
    with nnx.use_eager_sharding(False):
        abstract_module = nnx.eval_shape(init_fn)
    graphdef, abstract_state = nnx.split(abstract_module)
    shardings = state_shardings(abstract_state, mesh, rules)
    return graphdef, with_shardings(abstract_state, shardings), shardings


def init_sharded(
    init_fn: Callable[[], nnx.Module], mesh: Mesh, rules: LogicalRules
) -> tuple[nnx.GraphDef, nnx.State]:
    """Initialises the module `init_fn` builds directly into its sharded layout (one jit)."""
    graphdef, _, shardings = abstract_sharded(init_fn, mesh, rules)

    def init() -> nnx.State:
        with nnx.use_eager_sharding(False):
            return nnx.split(init_fn())[1]

    return graphdef, jax.jit(init, out_shardings=shardings)()


def _data_axes(mesh: Mesh, data_axes: Sequence[str] | None) -> tuple[str, ...]:
    if data_axes is None:
        return tuple(a for a in DATA_AXES if a in mesh.axis_names)
    data_axes = tuple(data_axes)
    for axis in data_axes:
        if axis not in mesh.axis_names:
            raise ValueError(f"data_axes={data_axes}: {axis!r} is not a mesh axis {mesh.axis_names}")
    return data_axes


def batch_sharding(mesh: Mesh, data_axes: Sequence[str] | None = None) -> NamedSharding:
    """Sharding of a flat rollout batch: leading axis split over the data-parallel axes, rest replicated.

    `data_axes=None` uses those of ("data", "fsdp") that the mesh has.
    """
    axes = _data_axes(mesh, data_axes)
    return NamedSharding(mesh, PartitionSpec(axes if axes else None))


def num_batch_shards(mesh: Mesh, data_axes: Sequence[str] | None = None) -> int:
    """How many ways the leading batch axis is split (the global batch must be a multiple)."""
    return math.prod(mesh.shape[a] for a in _data_axes(mesh, data_axes))


def shard_batch(batch: Any, mesh: Mesh, data_axes: Sequence[str] | None = None) -> Any:
    """Places a pytree of host (numpy) arrays onto the mesh, leading axis over the data axes.

    Each process passes its own rows (single host: the whole batch); the global batch is the
    processes' rows stacked, via `jax.make_array_from_process_local_data`.
    """
    sharding = batch_sharding(mesh, data_axes)
    n_shards = num_batch_shards(mesh, data_axes)
    # Distinct leading-axis slices held by this process's devices: its rows must split evenly.
    local_shards = len({idx[0].start for idx in
                        sharding.addressable_devices_indices_map((n_shards,)).values()})

    def one(path: tuple[Any, ...], x: Any) -> jax.Array:
        x = np.asarray(x)
        if x.ndim == 0:
            raise ValueError(f"batch leaf {_path_str(path)!r} is a scalar; batch leaves need a leading axis")
        if x.shape[0] % local_shards:
            raise ValueError(
                f"batch leaf {_path_str(path)!r} has {x.shape[0]} rows on this process, not a multiple of "
                f"its {local_shards} data shards (mesh {dict(mesh.shape)}, data axes "
                f"{_data_axes(mesh, data_axes)})")
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree_util.tree_map_with_path(one, batch)


def drop_trivial_axes(sharding: NamedSharding) -> NamedSharding:
    """The same layout written without mesh axes of size 1 (``P('fsdp', None)`` on a mesh whose fsdp axis has
    one device is ``P()``): the form the compiler gives a step's outputs, so the step does not recompile."""
    mesh = sharding.mesh

    def keep(axes):
        axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ()) if mesh.shape[a] > 1)
        return None if not axes else axes[0] if len(axes) == 1 else axes

    spec = [keep(axes) for axes in sharding.spec]
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(mesh, PartitionSpec(*spec))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a training run's arrays live: nowhere special on one device (``mesh=None``), otherwise the flat
    rollout batch split over the data axes and states laid out by the logical-axis rules.

    ``batch(x)`` places a B-leading array; ``tree(t)`` places a pytree (a model's ``nnx.State``, a train state
    with its optimizer moments, a tracker): annotated parameters by ``rules``, everything else replicated.
    """

    mesh: Mesh | None = None
    rules: LogicalRules = ()
    data_axes: tuple[str, ...] = ()

    @property
    def num_batch_shards(self) -> int:
        return 1 if self.mesh is None else num_batch_shards(self.mesh, self.data_axes)

    def batch(self, x: Any) -> Any:
        if self.mesh is None:
            return x
        return jax.device_put(x, batch_sharding(self.mesh, self.data_axes))

    def tree(self, tree: Any) -> Any:
        if self.mesh is None:
            return tree
        return jax.device_put(tree, jax.tree.map(drop_trivial_axes, state_shardings(tree, self.mesh, self.rules)))


def make_placement(mesh_config: Any, devices: Sequence[jax.Device] | None = None) -> Placement:
    """The placement of ``config.mesh`` over ``devices`` (default: all): no mesh with a single device."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) == 1:
        check_mesh_config(mesh_config)  # unused here, but the config must be able to make a mesh elsewhere
        return Placement()
    mesh = make_mesh(mesh_config, devices)
    data_axes = tuple(_cfg_get(mesh_config, "data_axes", None) or _data_axes(mesh, None))
    return Placement(mesh, tuple(_cfg_get(mesh_config, "rules", ()) or ()), _data_axes(mesh, data_axes))
