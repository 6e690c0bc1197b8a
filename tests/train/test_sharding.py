"""Mesh construction, logical-axis rules and batch placement on the 8 forced CPU devices."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sera_jax.train import sharding as sh

# Logical names of this test's model (deliberately not the decoder's).
RULES = (
    ("feat_in", "fsdp"),
    ("feat_out", "model"),
    ("hidden", "model"),
    ("hidden", "fsdp"),  # fallback when "model" is taken or does not divide
    ("gain", None),
)


class Stack(nnx.Module):
    """Two annotated Linear layers and an unannotated bias-free head."""

    def __init__(self, rngs: nnx.Rngs):
        init = nnx.initializers.uniform(0.5)  # uniform: much cheaper to compile than (truncated) normal
        self.up = nnx.Linear(
            8, 16, rngs=rngs,
            kernel_init=nnx.with_partitioning(init, ("feat_in", "hidden")),
            bias_init=nnx.with_partitioning(nnx.initializers.uniform(0.1), ("hidden",)))
        self.down = nnx.Linear(
            16, 4, rngs=rngs,
            kernel_init=nnx.with_partitioning(init, ("hidden", "feat_out")),
            bias_init=nnx.with_partitioning(nnx.initializers.uniform(0.1), ("feat_out",)))
        self.scale = nnx.Param(jnp.full((4,), 1.5))  # no annotation: replicated

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x))) * self.scale[...]


@pytest.fixture(scope="module")
def mesh():
    return sh.make_mesh({"axes": ("data", "fsdp", "model"), "shape": (2, 2, -1)})


def test_make_mesh_resolves_minus_one_and_uses_all_devices(mesh):
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}
    assert mesh.devices.size == jax.device_count() == 8
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    default = sh.make_mesh(sh.default_mesh_config())
    assert dict(default.shape) == {"data": 8, "fsdp": 1, "model": 1}


@pytest.mark.parametrize("shape, match", [
    ((3, -1), "does not divide"),
    ((2, 2), "uses 4 devices"),
    ((-1, -1), "at most one"),
    ((0, 8), "positive"),
])
def test_make_mesh_bad_shape_names_field(shape, match):
    with pytest.raises(ValueError, match=match) as err:
        sh.make_mesh({"axes": ("data", "model"), "shape": shape})
    assert "mesh.shape" in str(err.value)


def test_logical_to_mesh_spec_rules_and_fallbacks(mesh):
    spec = sh.logical_to_mesh_spec(("feat_in", "hidden"), RULES, mesh, (8, 16))
    assert spec == P("fsdp", "model")
    # "model" already used by the first dim: "hidden" falls back to "fsdp".
    assert sh.logical_to_mesh_spec(("feat_out", "hidden"), RULES, mesh, (4, 16)) == P("model", "fsdp")
    # Nothing fits a dimension of size 3: replicated.
    assert sh.logical_to_mesh_spec(("hidden",), RULES, mesh, (3,)) == P(None)
    assert sh.logical_to_mesh_spec(("gain", None), RULES, mesh, (4, 4)) == P(None, None)
    # Multi-axis rule.
    assert sh.logical_to_mesh_spec(("x",), (("x", ("data", "fsdp")),), mesh, (8,)) == P(("data", "fsdp"))


def test_unknown_logical_name_and_bad_rule_are_clear(mesh):
    with pytest.raises(ValueError, match=r"'hiden'.*did you mean \['hidden'\]"):
        sh.logical_to_mesh_spec(("hiden",), RULES, mesh, (16,), where="up/kernel")
    with pytest.raises(ValueError, match=r"mesh axis 'tensor'"):
        sh.validate_rules((("hidden", "tensor"),), mesh)


def test_decoder_rules_cover_the_decoder_names(mesh):
    names = ("vocab", "embed", "mlp", "q_heads", "kv_heads", "head_dim", "norm")
    spec = sh.logical_to_mesh_spec(("vocab", "embed"), sh.DECODER_RULES, mesh, (32, 16))
    assert spec == P("model", "fsdp")
    for name in names:
        sh.logical_to_mesh_spec((name,), sh.DECODER_RULES, mesh, (8,))


@pytest.fixture(scope="module")
def sharded_model(mesh):
    graphdef, abstract, shardings = sh.abstract_sharded(lambda: Stack(nnx.Rngs(0)), mesh, RULES)
    _, state = sh.init_sharded(lambda: Stack(nnx.Rngs(0)), mesh, RULES)
    return graphdef, abstract, shardings, state


def test_state_shardings_follow_rules(sharded_model, mesh):
    _, abstract, shardings, state = sharded_model
    expected = {
        ("up", "kernel"): P("fsdp", "model"),
        ("up", "bias"): P("model"),
        # "hidden" takes "model" first; "feat_out" has no other rule, so it is replicated.
        ("down", "kernel"): P("model", None),
        ("down", "bias"): P("model"),
        ("scale",): P(),
    }
    flat = {tuple(str(k.key) for k in path[:-1]): s
            for path, s in jax.tree_util.tree_flatten_with_path(shardings)[0]}
    assert {k: v.spec for k, v in flat.items()} == expected
    # The initialised arrays and the abstract state carry exactly those shardings.
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        key = tuple(str(k.key) for k in path[:-1])
        assert x.sharding == NamedSharding(mesh, expected[key]), key
    for path, x in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        key = tuple(str(k.key) for k in path[:-1])
        assert isinstance(x, jax.ShapeDtypeStruct) and x.sharding.spec == expected[key]
    # Sharded init gives the same numbers as an unsharded init (up to jit-vs-eager rounding).
    with nnx.use_eager_sharding(False):
        plain = nnx.state(Stack(nnx.Rngs(0)))
    chex.assert_trees_all_close(jax.device_get(state), jax.device_get(plain), rtol=1e-6, atol=1e-7)


def test_optimizer_state_gets_matching_shardings(sharded_model, mesh):
    _, _, shardings, state = sharded_model
    opt_state = optax.adam(1e-3).init(state)
    opt_shardings = sh.state_shardings(opt_state, mesh, RULES)
    # Adam's moments mirror the parameters (an nnx.State of annotated Variables): same shardings.
    assert jax.tree.leaves(opt_shardings[0].mu) == jax.tree.leaves(shardings)
    assert jax.tree.leaves(opt_shardings[0].nu) == jax.tree.leaves(shardings)
    assert opt_shardings[0].mu["up"]["kernel"].get_value().spec == P("fsdp", "model")
    assert opt_shardings[0].count.spec == P()  # the step counter is replicated


def test_sharded_forward_and_grad_equal_unsharded(sharded_model, mesh):
    graphdef, _, shardings, state = sharded_model
    x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)

    def loss(st, xb):
        model = nnx.merge(graphdef, st)
        return jnp.mean(model(xb) ** 2)

    value_and_grad = jax.value_and_grad(loss)
    batch_sh = sh.batch_sharding(mesh)
    sharded = jax.jit(value_and_grad, in_shardings=(shardings, batch_sh),
                      out_shardings=(NamedSharding(mesh, P()), shardings))
    xs = sh.shard_batch(x, mesh)
    assert xs.sharding == batch_sh
    l_sh, g_sh = sharded(state, xs)
    host_state = jax.device_put(jax.device_get(state), jax.devices()[0])
    l_ref, g_ref = jax.jit(value_and_grad)(host_state, jax.device_put(x, jax.devices()[0]))
    np.testing.assert_allclose(l_sh, l_ref, rtol=1e-6)
    chex.assert_trees_all_close(jax.device_get(g_sh), jax.device_get(g_ref), rtol=1e-5, atol=1e-6)
    assert g_sh["up"]["kernel"].get_value().sharding.spec == P("fsdp", "model")


def test_batch_sharding_and_shard_batch(mesh):
    assert sh.batch_sharding(mesh).spec == P(("data", "fsdp"))
    assert sh.batch_sharding(mesh, ("data",)).spec == P("data")
    assert sh.num_batch_shards(mesh) == 4
    batch = {"tokens": np.arange(24).reshape(8, 3), "prompt_id": np.repeat(np.arange(4), 2)}
    out = sh.shard_batch(batch, mesh)
    np.testing.assert_array_equal(jax.device_get(out["tokens"]), batch["tokens"])
    # Each of the 4 data shards holds 2 rows; the 2 "model" devices hold replicas.
    shard_rows = sorted({s.index[0].start for s in out["tokens"].addressable_shards})
    assert shard_rows == [0, 2, 4, 6]
    assert out["tokens"].addressable_shards[0].data.shape == (2, 3)


def test_shard_batch_errors_name_the_leaf(mesh):
    with pytest.raises(ValueError, match=r"'tokens' has 6 rows.*4 data shards"):
        sh.shard_batch({"tokens": np.zeros((6, 2))}, mesh)
    with pytest.raises(ValueError, match=r"'step' is a scalar"):
        sh.shard_batch({"step": np.int32(3)}, mesh)
    with pytest.raises(ValueError, match=r"'tensor' is not a mesh axis"):
        sh.batch_sharding(mesh, ("tensor",))


@pytest.mark.parametrize("mesh_config, match", [
    ({"axes": ("data", "fsdp", "model"), "shape": (3,)}, "same length"),
    ({"axes": ("data", "data"), "shape": (-1, 1)}, "repeated names"),
    ({"axes": ("data", "model"), "shape": (-1, -1)}, "at most one"),
    ({"axes": ("data",), "shape": (0,)}, "positive"),
    ({"axes": ("data",), "shape": (-1,), "axis_types": "manual"}, "axis_types"),
])
def test_a_single_device_uses_no_mesh_but_still_checks_the_mesh_config(mesh_config, match):
    # The laptop that writes a config runs it on one device, where no mesh is built: a mesh config that no
    # device count could build must fail there, not first on the pod.
    assert sh.make_placement(sh.default_mesh_config(), jax.devices()[:1]).mesh is None
    with pytest.raises(ValueError, match=match):
        sh.make_placement(mesh_config, jax.devices()[:1])
