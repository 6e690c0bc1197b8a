"""The classifier-as-policy: building the ResNet from the config, and the pure functions on its state.

The model is handled functionally: ``graphdef, params, batch_stats = nnx.split(model, nnx.Param,
nnx.BatchStat)`` once, then every jitted function takes ``(params, batch_stats)`` and calls
``sera_jax.models.resnet.apply``. In inference mode (``train=False``) BatchNorm uses running statistics,
so an example's logits depend on that example alone: the analysis relies on it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sera_jax.models import resnet

Array = jnp.ndarray

# XLA:CPU options that switch LLVM's optimisations off: programs compile several times faster and run
# slower. Used for the many small sampling kernels, and for everything when ``config.fast_compile``.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _resnet_kwargs(config: ml_collections.ConfigDict, in_channels: int) -> tuple[tuple[str, Any], ...]:
    overrides: dict[str, Any] = dict(in_channels=in_channels, dtype=config.model.dtype)
    if config.model.name == "cifar_resnet":
        overrides.update(widths=tuple(config.model.widths), stage_sizes=tuple(config.model.stage_sizes))
    return tuple(sorted(overrides.items()))


@functools.lru_cache(maxsize=8)
def _initialiser(name: str, num_classes: int, kwargs: tuple[tuple[str, Any], ...]):
    """(graphdef, jitted key -> (params, batch_stats)): one compiled initialisation for every seed."""

    def build(key):
        return resnet.build_resnet(name, num_classes, nnx.Rngs(key), **dict(kwargs))

    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: build(jax.random.key(0, impl="rbg"))), nnx.Param, nnx.BatchStat)
    options = FAST_COMPILE if jax.default_backend() == "cpu" else None  # runs once per seed
    init = jax.jit(lambda key: nnx.split(build(key), nnx.Param, nnx.BatchStat)[1:], compiler_options=options)
    return graphdef, init


def build_model(config: ml_collections.ConfigDict, num_classes: int, in_channels: int, seed: int):
    """(graphdef, params, batch_stats) of the configured ResNet, initialised from ``seed``.

    The initialisation runs as one jitted program (compiled once for all seeds) from an ``rbg`` key: XLA:CPU
    compiles threefry-based initialisers slowly, and the parameters are placed on the mesh afterwards, so
    partitionability does not matter here.
    """
    graphdef, init = _initialiser(config.model.name, num_classes, _resnet_kwargs(config, in_channels))
    params, batch_stats = init(jax.random.key(seed, impl="rbg"))
    return graphdef, params, batch_stats


def logits_fn(graphdef, params, batch_stats, x_BxHxWxC: Array) -> Array:
    """Inference-mode logits (BatchNorm with running statistics): each row depends on its image only."""
    logits_BxK, _ = resnet.apply(graphdef, params, batch_stats, x_BxHxWxC, train=False)
    return logits_BxK
