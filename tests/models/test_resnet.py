"""ResNet tests: exact torchvision parameter counts (abstract build), and tiny CIFAR-style nets on CPU."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sera_jax.models import resnet

# Trainable parameters of torchvision.models.resnet18() / resnet50() (weights=None, 1000 classes).
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032}

TINY = dict(widths=(4, 8), stage_sizes=(1, 1))


@functools.lru_cache(maxsize=None)
def _abstract(name):
    """The model with ShapeDtypeStructs instead of arrays: nothing is initialised or compiled."""
    return nnx.eval_shape(lambda: resnet.build_resnet(name, 1000, nnx.Rngs(0)))


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_imagenet_param_counts_match_torchvision(name):
    assert resnet.count_params(_abstract(name)) == TORCHVISION_PARAMS[name]


def test_resnet50_bn_statistics_are_not_params():
    model = _abstract("resnet50")
    num_bn_features = sum(
        bn.num_features for _, bn in nnx.iter_graph(model) if isinstance(bn, nnx.BatchNorm)
    )
    stats = jax.tree.leaves(nnx.state(model, nnx.BatchStat))
    # Mean and variance per BN feature, and nothing else.
    assert sum(math.prod(s.shape) for s in stats) == 2 * num_bn_features
    assert num_bn_features > 0


def _rngs(seed: int) -> nnx.Rngs:
    # XLA:CPU compiles threefry-based initialisers slowly (seconds per shape); rbg compiles fast.
    return nnx.Rngs(jax.random.key(seed, impl="rbg"))


def _tiny_model(seed=0, **overrides):
    kwargs = {**TINY, "in_channels": 3, **overrides}
    return resnet.build_resnet("cifar_resnet", 10, _rngs(seed), **kwargs)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _apply(graphdef, params, stats, x_BxHxWxC, train):
    return resnet.apply(graphdef, params, stats, x_BxHxWxC, train=train)


def _xent(graphdef, params, stats, x_BxHxWxC, y_B, train):
    """Mean cross-entropy through the functional forward (no inner jit: grad traces `apply`)."""
    logits, new_stats = resnet.apply(graphdef, params, stats, x_BxHxWxC, train=train)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y_B[:, None], axis=1)), new_stats


@pytest.fixture(scope="module")
def tiny():
    """A narrow CIFAR-style ResNet on 16x16 RGB, split into (graphdef, params, batch stats)."""
    model = _tiny_model()
    graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    x = jax.random.normal(jax.random.key(1, impl="rbg"), (4, 16, 16, 3))
    y = jnp.array([0, 1, 2, 3])
    return graphdef, params, stats, x, y


def test_cifar_resnet_forward_backward_and_sgd_lowers_loss(tiny):
    graphdef, params, stats, x, y = tiny
    grad_fn = jax.jit(jax.value_and_grad(_xent, argnums=1, has_aux=True), static_argnums=(0, 5))
    (loss0, _), grads = grad_fn(graphdef, params, stats, x, y, True)
    chex.assert_trees_all_equal_shapes(grads, params)
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in leaves), "some parameter gets no gradient"
    loss = loss0
    for _ in range(5):
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        (loss, stats), grads = grad_fn(graphdef, params, stats, x, y, True)
    assert float(loss) < float(loss0) - 0.1


def test_logits_shape_dtype_for_digits_layout():
    model = resnet.build_resnet("cifar_resnet", 10, _rngs(0), in_channels=1, **TINY)
    graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    logits, _ = _apply(graphdef, params, stats, jnp.ones((3, 8, 8, 1)), False)
    chex.assert_shape(logits, (3, 10))
    assert logits.dtype == jnp.float32


def _randomise_stats(stats, key):
    """Non-trivial running statistics, so inference mode is not the identity normalisation."""
    leaves, treedef = jax.tree.flatten(stats)
    keys = jax.random.split(key, len(leaves))
    new = [jax.random.uniform(k, l.shape, minval=0.5, maxval=1.5) for k, l in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, new)


def test_inference_outputs_independent_of_batch_companions(tiny):
    graphdef, params, stats, x, _ = tiny
    stats = _randomise_stats(stats, jax.random.key(3, impl="rbg"))
    others = 5.0 * jax.random.normal(jax.random.key(2, impl="rbg"), (3, 16, 16, 3)) + 2.0
    batch_a = x
    batch_b = jnp.concatenate([x[:1], others], axis=0)
    out_a, stats_a = _apply(graphdef, params, stats, batch_a, False)
    out_b, _ = _apply(graphdef, params, stats, batch_b, False)
    out_1, _ = _apply(graphdef, params, stats, x[:1], False)
    np.testing.assert_allclose(out_a[0], out_b[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out_a[0], out_1[0], rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_equal(stats_a, stats)  # inference never moves the running averages
    # Control: with batch statistics the same example's logits do depend on its companions.
    train_a, _ = _apply(graphdef, params, stats, batch_a, True)
    train_b, _ = _apply(graphdef, params, stats, batch_b, True)
    assert float(jnp.max(jnp.abs(train_a[0] - train_b[0]))) > 1e-3


def test_per_example_gradients_by_vmap_match_batched_inference_gradient(tiny):
    graphdef, params, stats, x, y = tiny
    stats = _randomise_stats(stats, jax.random.key(4, impl="rbg"))

    def loss_one(p, x_HxWxC, label):
        loss, _ = _xent(graphdef, p, stats, x_HxWxC[None], label[None], False)
        return loss

    per_example_fn = jax.jit(jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0)))
    per_example = per_example_fn(params, x, y)
    # Independent path: one backward pass through the batched forward; in inference mode its
    # gradient of the mean loss is the mean of the per-example gradients.
    batched = jax.jit(jax.grad(lambda p: _xent(graphdef, p, stats, x, y, False)[0]))(params)
    mean_per_example = jax.tree.map(lambda g: jnp.mean(g, axis=0), per_example)
    chex.assert_trees_all_close(mean_per_example, batched, rtol=1e-4, atol=1e-6)
    # Example 2's gradient does not depend on the other rows of its batch.
    x_other = x.at[jnp.array([0, 1, 3])].set(-x[jnp.array([3, 0, 1])] * 2.0)
    again = per_example_fn(params, x_other, y)
    chex.assert_trees_all_close(
        jax.tree.map(lambda g: g[2], again), jax.tree.map(lambda g: g[2], per_example), rtol=1e-5, atol=1e-7
    )


def test_train_mode_updates_running_stats_with_momentum():
    model = _tiny_model()
    x = 3.0 * jax.random.normal(jax.random.key(5, impl="rbg"), (6, 16, 16, 3)) + 1.0
    # The stem BN sees the stem conv's output; its batch moments, computed here independently.
    h = jax.lax.conv_general_dilated(
        x,
        model.stem_conv.kernel[...],
        window_strides=(1, 1),
        padding=((1, 1), (1, 1)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    mean_C = jnp.mean(h, axis=(0, 1, 2))
    var_C = jnp.var(h, axis=(0, 1, 2))
    graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    _, new_stats = _apply(graphdef, params, stats, x, True)
    new = new_stats["stem_bn"]
    # Running averages start at mean 0 / var 1 and move by (1 - momentum) toward the batch moments.
    np.testing.assert_allclose(new["mean"][...], 0.1 * mean_C, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new["var"][...], 0.9 * 1.0 + 0.1 * var_C, rtol=1e-4, atol=1e-5)
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new_stats, stats)
    assert all(jax.tree.leaves(changed)), "every BN layer's statistics should move in train mode"


def test_zero_init_residual_makes_blocks_identity_at_init():
    model = _tiny_model(zero_init_residual=True, widths=(4, 4), stage_sizes=(2, 1))
    last_bns = [b.bn2 for b in model.blocks]
    assert all(bool(jnp.all(bn.scale[...] == 0)) for bn in last_bns)
    # A block without projection then returns relu(x); its input is post-ReLU, so it returns x.
    block = model.blocks[1]
    assert block.shortcut is None
    x = nnx.relu(jax.random.normal(jax.random.key(6, impl="rbg"), (2, 8, 8, 4)))
    np.testing.assert_array_equal(block(x, train=False), x)
    default = _tiny_model()
    assert all(bool(jnp.all(b.bn2.scale[...] == 1)) for b in default.blocks)


def test_conv_init_is_he_normal_fan_out():
    model = _tiny_model(widths=(32, 32), stage_sizes=(2, 1))
    kernel = np.asarray(model.blocks[0].conv2.kernel[...])  # 3x3x32x32
    fan_out = 3 * 3 * 32
    # 9216 samples: the std estimate is within ~1.5% (1 sigma); 6% allows for 4 sigma.
    assert abs(kernel.std() / math.sqrt(2.0 / fan_out) - 1.0) < 0.06
    assert abs(kernel.mean()) < 4 * math.sqrt(2.0 / fan_out) / math.sqrt(kernel.size)


def test_bfloat16_compute_keeps_float32_params_and_logits(tiny):
    graphdef32, params, stats, x, _ = tiny
    model16 = _tiny_model(dtype="bfloat16")
    graphdef16, params16, stats16 = nnx.split(model16, nnx.Param, nnx.BatchStat)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params16))
    out32, _ = _apply(graphdef32, params, stats, x, False)
    out16, _ = _apply(graphdef16, params, stats, x, False)  # same weights, bf16 arithmetic
    assert out16.dtype == jnp.float32
    np.testing.assert_allclose(out16, out32, rtol=0.1, atol=0.1)
    assert float(jnp.max(jnp.abs(out16 - out32))) > 0  # the bf16 path really ran in bf16


def test_build_resnet_rejects_bad_arguments():
    with pytest.raises(ValueError, match="name='resnet7'"):
        resnet.build_resnet("resnet7", 10, nnx.Rngs(0))
    with pytest.raises(ValueError, match="depth"):
        resnet.build_resnet("cifar_resnet", 10, nnx.Rngs(0), depth=3)
    with pytest.raises(ValueError, match="widths"):
        resnet.build_resnet("cifar_resnet", 10, nnx.Rngs(0), widths=(8, 16))
    with pytest.raises(ValueError, match="block"):
        resnet.build_resnet("cifar_resnet", 10, nnx.Rngs(0), block="dense")
