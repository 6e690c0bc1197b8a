"""ResNets in Flax NNX: torchvision-shaped ImageNet ResNets and narrow CIFAR-style ResNets.

`logits_BxK = model(x_BxHxWxC, train=...)`. With `train=False` BatchNorm uses its running statistics,
so every example's output depends on that example alone (per-example gradients can be `vmap`ped);
with `train=True` it normalises by the batch statistics and updates the running averages in place.

The ImageNet layouts have exactly torchvision's trainable parameters (ResNet-18: 11,689,512,
ResNet-50: 25,557,032; BatchNorm running statistics are `nnx.BatchStat`, not `nnx.Param`), including
ResNet v1.5's stride on the 3x3 convolution of a bottleneck block and torchvision's symmetric padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# torchvision's initialisation: He normal with fan_out for convolutions.
CONV_INIT = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")
# PyTorch's BatchNorm defaults (momentum 0.1 there is 0.9 here: the weight of the old average).
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5

BLOCKS = ("basic", "bottleneck")
STEMS = ("imagenet", "cifar")


@dataclasses.dataclass(frozen=True)
class _Precision:
    """dtypes shared by every layer: `dtype` for computation, `param_dtype` for storage."""

    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32


def _conv(
    in_features: int, out_features: int, kernel: int, strides: int, prec: _Precision, rngs: nnx.Rngs
) -> nnx.Conv:
    """A bias-free conv with torchvision's symmetric padding (kernel // 2 on every side).

    XLA's 'SAME' pads stride-2 convolutions asymmetrically; explicit padding keeps the layer identical
    to torchvision's, so pretrained weights would transfer and feature maps line up.
    """
    pad = kernel // 2
    return nnx.Conv(
        in_features,
        out_features,
        (kernel, kernel),
        strides=(strides, strides),
        padding=((pad, pad), (pad, pad)),
        use_bias=False,
        kernel_init=CONV_INIT,
        dtype=prec.dtype,
        param_dtype=prec.param_dtype,
        rngs=rngs,
    )


def _bn(features: int, prec: _Precision, rngs: nnx.Rngs, zero_scale: bool = False) -> nnx.BatchNorm:
    """BatchNorm with PyTorch's momentum/epsilon; `zero_scale` starts a residual branch at zero."""
    return nnx.BatchNorm(
        features,
        momentum=BN_MOMENTUM,
        epsilon=BN_EPSILON,
        scale_init=nnx.initializers.zeros if zero_scale else nnx.initializers.ones,
        dtype=prec.dtype,
        param_dtype=prec.param_dtype,
        rngs=rngs,
    )


class _Shortcut(nnx.Module):
    """Projection shortcut (1x1 conv + BN) used when a block changes resolution or width."""

    def __init__(self, in_features: int, out_features: int, strides: int, prec: _Precision, rngs: nnx.Rngs):
        self.conv = _conv(in_features, out_features, 1, strides, prec, rngs)
        self.bn = _bn(out_features, prec, rngs)

    def __call__(self, x_BxHxWxC: jax.Array, *, train: bool) -> jax.Array:
        return self.bn(self.conv(x_BxHxWxC), use_running_average=not train)


class BasicBlock(nnx.Module):
    """Two 3x3 convs (ResNet-18/34 and CIFAR ResNets); output width = `features`."""

    expansion = 1

    def __init__(
        self,
        in_features: int,
        features: int,
        strides: int,
        *,
        zero_init_residual: bool,
        prec: _Precision,
        rngs: nnx.Rngs,
    ):
        out = features * self.expansion
        self.conv1 = _conv(in_features, features, 3, strides, prec, rngs)
        self.bn1 = _bn(features, prec, rngs)
        self.conv2 = _conv(features, out, 3, 1, prec, rngs)
        self.bn2 = _bn(out, prec, rngs, zero_scale=zero_init_residual)
        needs_proj = strides != 1 or in_features != out
        self.shortcut = _Shortcut(in_features, out, strides, prec, rngs) if needs_proj else None

    def __call__(self, x_BxHxWxC: jax.Array, *, train: bool) -> jax.Array:
        ura = not train
        y = nnx.relu(self.bn1(self.conv1(x_BxHxWxC), use_running_average=ura))
        y = self.bn2(self.conv2(y), use_running_average=ura)
        skip = x_BxHxWxC if self.shortcut is None else self.shortcut(x_BxHxWxC, train=train)
        return nnx.relu(y + skip)


class Bottleneck(nnx.Module):
    """1x1 -> 3x3 (carries the stride, ResNet v1.5) -> 1x1 with 4x expansion (ResNet-50/101/152)."""

    expansion = 4

    def __init__(
        self,
        in_features: int,
        features: int,
        strides: int,
        *,
        zero_init_residual: bool,
        prec: _Precision,
        rngs: nnx.Rngs,
    ):
        out = features * self.expansion
        self.conv1 = _conv(in_features, features, 1, 1, prec, rngs)
        self.bn1 = _bn(features, prec, rngs)
        self.conv2 = _conv(features, features, 3, strides, prec, rngs)
        self.bn2 = _bn(features, prec, rngs)
        self.conv3 = _conv(features, out, 1, 1, prec, rngs)
        self.bn3 = _bn(out, prec, rngs, zero_scale=zero_init_residual)
        needs_proj = strides != 1 or in_features != out
        self.shortcut = _Shortcut(in_features, out, strides, prec, rngs) if needs_proj else None

    def __call__(self, x_BxHxWxC: jax.Array, *, train: bool) -> jax.Array:
        ura = not train
        y = nnx.relu(self.bn1(self.conv1(x_BxHxWxC), use_running_average=ura))
        y = nnx.relu(self.bn2(self.conv2(y), use_running_average=ura))
        y = self.bn3(self.conv3(y), use_running_average=ura)
        skip = x_BxHxWxC if self.shortcut is None else self.shortcut(x_BxHxWxC, train=train)
        return nnx.relu(y + skip)


class ResNet(nnx.Module):
    """A ResNet classifier: stem, stages of residual blocks, global average pool, linear head.

    Args:
      stage_sizes: blocks per stage; every stage after the first halves the resolution.
      num_classes: width of the logits.
      block: "basic" or "bottleneck".
      widths: base width of each stage (a bottleneck stage outputs 4x this).
      stem: "imagenet" (7x7/2 conv + 3x3/2 max pool, for 224 px) or "cifar" (3x3/1 conv, for 8-32 px).
      in_channels: channels of the input images (3 for RGB, 1 for digits).
      zero_init_residual: start every block's last BN scale at 0, so each block begins as the identity.
      dtype: computation dtype (e.g. jnp.bfloat16); logits are always returned in float32.
      param_dtype: storage dtype of parameters and BN statistics.
      rngs: initialisation keys.
    """

    def __init__(
        self,
        stage_sizes: Sequence[int],
        num_classes: int,
        *,
        block: str = "basic",
        widths: Sequence[int] = (64, 128, 256, 512),
        stem: str = "imagenet",
        in_channels: int = 3,
        zero_init_residual: bool = False,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        _check_layout(stage_sizes, widths, block, stem, num_classes, in_channels)
        prec = _Precision(dtype, param_dtype)
        block_cls = BasicBlock if block == "basic" else Bottleneck
        self.dtype = dtype
        self.stem = stem
        stem_kernel, stem_stride = (7, 2) if stem == "imagenet" else (3, 1)
        self.stem_conv = _conv(in_channels, widths[0], stem_kernel, stem_stride, prec, rngs)
        self.stem_bn = _bn(widths[0], prec, rngs)
        blocks = []
        features = widths[0]
        for stage, (num_blocks, width) in enumerate(zip(stage_sizes, widths)):
            for i in range(num_blocks):
                strides = 2 if stage > 0 and i == 0 else 1
                blocks.append(
                    block_cls(
                        features,
                        width,
                        strides,
                        zero_init_residual=zero_init_residual,
                        prec=prec,
                        rngs=rngs,
                    )
                )
                features = width * block_cls.expansion
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(features, num_classes, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x_BxHxWxC: jax.Array, *, train: bool) -> jax.Array:
        """Returns float32 logits_BxK; `train` selects batch (True) or running (False) BN statistics."""
        x = jnp.asarray(x_BxHxWxC, self.dtype)
        x = nnx.relu(self.stem_bn(self.stem_conv(x), use_running_average=not train))
        if self.stem == "imagenet":
            # torchvision pads the max pool by 1 with -inf, which is what max_pool's padding does.
            x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for blk in self.blocks:
            x = blk(x, train=train)
        pooled_BxD = jnp.mean(x, axis=(1, 2))
        return self.head(pooled_BxD).astype(jnp.float32)


def _check_layout(
    stage_sizes: Sequence[int],
    widths: Sequence[int],
    block: str,
    stem: str,
    num_classes: int,
    in_channels: int,
) -> None:
    """Raises ValueError naming the offending argument."""
    if block not in BLOCKS:
        raise ValueError(f"block={block!r}; expected one of {BLOCKS}")
    if stem not in STEMS:
        raise ValueError(f"stem={stem!r}; expected one of {STEMS}")
    if not stage_sizes or any(int(n) < 1 for n in stage_sizes):
        raise ValueError(f"stage_sizes={tuple(stage_sizes)} must be a non-empty sequence of ints >= 1")
    if len(widths) != len(stage_sizes):
        raise ValueError(
            f"widths={tuple(widths)} must have one entry per stage (stage_sizes={tuple(stage_sizes)})"
        )
    if any(int(w) < 1 for w in widths):
        raise ValueError(f"widths={tuple(widths)} must be ints >= 1")
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes} must be >= 1")
    if in_channels < 1:
        raise ValueError(f"in_channels={in_channels} must be >= 1")


# Named layouts usable from configs. ImageNet ones follow torchvision; "cifar_resnet" is the
# ResNet-20 layout of He et al. (2016, sec. 4.2) but with projection shortcuts (option B).
RESNET_LAYOUTS: dict[str, dict[str, Any]] = {
    "resnet18": dict(stage_sizes=(2, 2, 2, 2), block="basic"),
    "resnet34": dict(stage_sizes=(3, 4, 6, 3), block="basic"),
    "resnet50": dict(stage_sizes=(3, 4, 6, 3), block="bottleneck"),
    "resnet101": dict(stage_sizes=(3, 4, 23, 3), block="bottleneck"),
    "resnet152": dict(stage_sizes=(3, 8, 36, 3), block="bottleneck"),
    "cifar_resnet": dict(stage_sizes=(3, 3, 3), block="basic", widths=(16, 32, 64), stem="cifar"),
}

_OVERRIDABLE = (
    "stage_sizes",
    "block",
    "widths",
    "stem",
    "in_channels",
    "zero_init_residual",
    "dtype",
    "param_dtype",
)


def build_resnet(name: str, num_classes: int, rngs: nnx.Rngs, **overrides: Any) -> ResNet:
    """Builds a named layout from `RESNET_LAYOUTS`; `overrides` replace any `ResNet` keyword.

    Example: `build_resnet("cifar_resnet", 10, nnx.Rngs(0), widths=(8, 16), stage_sizes=(1, 1),
    in_channels=1)` is a two-stage net for 8x8 grey digits. `dtype`/`param_dtype` may be given as
    strings ("bfloat16") so they can live in an ml_collections config.
    """
    if name not in RESNET_LAYOUTS:
        raise ValueError(f"name={name!r} is not a known ResNet; expected one of {sorted(RESNET_LAYOUTS)}")
    unknown = sorted(set(overrides) - set(_OVERRIDABLE))
    if unknown:
        raise ValueError(f"unknown ResNet override(s) {unknown}; allowed: {list(_OVERRIDABLE)}")
    kwargs = {**RESNET_LAYOUTS[name], **overrides}
    for key in ("dtype", "param_dtype"):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = jnp.dtype(kwargs[key])
    for key in ("stage_sizes", "widths"):
        if key in kwargs:
            kwargs[key] = tuple(int(v) for v in kwargs[key])
    stage_sizes = kwargs.pop("stage_sizes")
    return ResNet(stage_sizes, num_classes, rngs=rngs, **kwargs)


def count_params(model: nnx.Module) -> int:
    """Number of trainable scalars (`nnx.Param` leaves); works on `nnx.eval_shape` models too."""
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    return sum(math.prod(leaf.shape) for leaf in leaves)


def apply(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch_stats: nnx.State,
    x_BxHxWxC: jax.Array,
    *,
    train: bool,
) -> tuple[jax.Array, nnx.State]:
    """Pure forward for use inside `jax.jit`/`grad`/`vmap`: returns (logits_BxK, new batch_stats).

    `graphdef, params, batch_stats = nnx.split(model, nnx.Param, nnx.BatchStat)` outside the
    transformation. The merge copies the variables: the ones in `batch_stats` belong to the trace
    that passed them in, and BatchNorm's in-place update under an inner `jax.grad` would otherwise
    fail with a TraceContextError. With `train=False` the returned statistics equal the input ones.
    Per-example gradients: `vmap` a single-example loss over this with `train=False` (with
    `train=True` each vmapped example would be normalised by its own statistics).
    """
    model = nnx.merge(graphdef, params, batch_stats, copy=True)
    logits_BxK = model(x_BxHxWxC, train=train)
    return logits_BxK, nnx.state(model, nnx.BatchStat)
