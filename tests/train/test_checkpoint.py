"""Checkpointer: exact sharded round trips, retention, refusals and clear errors."""

import gc
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sera_jax.train import checkpoint as ck
from sera_jax.train import sharding as sh

RULES = (("rows", "data"), ("cols", "model"))
FP = {"model.num_layers": 4, "model.d_model": 8, "sera.estimator": "maxrl"}


class Tiny(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(
            8, 4, rngs=rngs,
            kernel_init=nnx.with_partitioning(nnx.initializers.uniform(0.5), ("rows", "cols")),
            bias_init=nnx.with_partitioning(nnx.initializers.uniform(1.0), ("cols",)))


@pytest.fixture(scope="module")
def mesh():
    return sh.make_mesh({"axes": ("data", "model"), "shape": (4, 2)})


@pytest.fixture(scope="module")
def setup(mesh):
    """(initial train state, its abstract sharded twin, a jitted deterministic 'train step')."""
    _, params = sh.init_sharded(lambda: Tiny(nnx.Rngs(0)), mesh, RULES)
    tx = optax.adam(1e-2)
    arrays = {
        "params": params,
        "opt": tx.init(params),
        "step": jnp.int32(0),
        "tracker": {"alpha": jnp.ones(16), "beta": jnp.full(16, 2.0)},
        "key": jax.random.key(42),
    }
    # Rules for the parameters and their Adam moments, replication elsewhere, tracker split over "data".
    shardings = sh.state_shardings(arrays, mesh, RULES)
    shardings["tracker"] = jax.tree.map(lambda _: NamedSharding(mesh, P("data")), arrays["tracker"])
    arrays = jax.device_put(arrays, shardings)
    state = {**arrays, "data_pos": 0}  # a Python int, as a data iterator reports it
    abstract = ck.abstract_like(state)

    def update_fn(st):
        key, sub = jax.random.split(st["key"])
        noise = jax.random.uniform(sub, (8,), minval=-1.0)
        grads = jax.grad(lambda p: jnp.sum((p["dense"]["kernel"][...].T @ noise + p["dense"]["bias"][...]) ** 2))(
            st["params"])
        upd, opt = tx.update(grads, st["opt"], st["params"])
        tracker = jax.tree.map(lambda c: 0.9 * c + 0.1, st["tracker"])
        return {**st, "params": optax.apply_updates(st["params"], upd), "opt": opt, "step": st["step"] + 1,
                "tracker": tracker, "key": key}

    update = jax.jit(update_fn, in_shardings=(shardings,), out_shardings=shardings)

    def train_step(st):
        new = update({k: v for k, v in st.items() if k != "data_pos"})
        return {**new, "data_pos": st["data_pos"] + 3}

    return state, abstract, train_step


def _assert_same(a, b):
    """Equal values, dtypes and shardings, leaf by leaf (typed keys compared through key_data)."""
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        assert type(x) is type(y)
        if isinstance(x, jax.Array):
            assert x.dtype == y.dtype and x.sharding == y.sharding
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                x, y = jax.random.key_data(x), jax.random.key_data(y)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            assert x == y


def test_round_trip_exact_sharded(tmp_path, setup, mesh):
    state, abstract, train_step = setup
    state = train_step(train_step(state))  # non-trivial optimizer moments and key
    with ck.Checkpointer(tmp_path / "ckpt", config_fingerprint=FP) as c:
        assert c.save(2, state, metadata={"note": "x", "value": np.float32(1.5)})
    # A fresh instance, as after a restart.
    with ck.Checkpointer(tmp_path / "ckpt", config_fingerprint=FP) as c:
        assert c.latest_step() == 2
        restored, meta = c.restore(None, abstract)
        assert c.restore_metadata()["fingerprint_digest"] == ck.config_utils.fingerprint_digest(FP)
    assert meta == {"note": "x", "value": 1.5}
    _assert_same(restored, state)
    assert restored["params"]["dense"]["kernel"].get_value().sharding.spec == P("data", "model")
    assert isinstance(restored["params"], nnx.State)


def test_restore_into_state_built_without_flops(tmp_path, setup, mesh):
    """The resume path: abstract params from eval_shape + rules, optimizer state via eval_shape."""
    state, _, _ = setup
    _, abstract_params, _ = sh.abstract_sharded(lambda: Tiny(nnx.Rngs(1)), mesh, RULES)
    abstract_opt = jax.eval_shape(optax.adam(1e-2).init, abstract_params)
    abstract_opt = sh.with_shardings(abstract_opt, sh.state_shardings(abstract_opt, mesh, RULES))
    abstract = {**ck.abstract_like(state), "params": abstract_params, "opt": abstract_opt}
    with ck.Checkpointer(tmp_path) as c:
        c.save(0, state)
        restored, _ = c.restore(0, abstract)
    _assert_same(restored, state)


def test_restore_reshards_into_another_layout(tmp_path, setup, mesh):
    state, abstract, _ = setup
    replicated = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P()))
        if isinstance(a, jax.ShapeDtypeStruct) else a, abstract)
    with ck.Checkpointer(tmp_path) as c:
        c.save(0, state)
        restored, _ = c.restore(0, replicated)
    kernel = restored["params"]["dense"]["kernel"].get_value()
    assert kernel.sharding.spec == P() and kernel.sharding.is_fully_replicated
    chex.assert_trees_all_equal(jax.device_get(restored["params"]), jax.device_get(state["params"]))


def test_max_to_keep_and_interval(tmp_path, setup):
    state, _, _ = setup
    with ck.Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=2) as c:
        saved = [c.save(s, state) for s in range(7)]
        assert saved == [True, False, True, False, True, False, True]
        assert c.save(7, state, force=True)
        assert c.all_steps() == [6, 7]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["6", "7"]
    # Retention continues across instances: the old ones count.
    with ck.Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=2) as c:
        c.save(8, state)
        assert c.all_steps() == [7, 8]


def test_save_same_or_older_step(tmp_path, setup):
    state, _, _ = setup
    with ck.Checkpointer(tmp_path) as c:
        assert c.save(5, state)
        assert not c.save(5, state)  # already there: no-op
        with pytest.raises(ValueError, match=r"step 3 is before the latest checkpoint 5"):
            c.save(3, state)


def test_non_finite_refused_and_previous_kept(tmp_path, setup, mesh):
    state, abstract, _ = setup
    with ck.Checkpointer(tmp_path) as c:
        c.save(1, state)
        c.wait()
        before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
        bad = jax.tree.map(lambda x: x, state)
        kernel = bad["params"]["dense"]["kernel"]
        kernel.set_value(kernel.get_value().at[0, 0].set(jnp.nan))
        bad["tracker"]["beta"] = bad["tracker"]["beta"].at[3].set(jnp.inf)
        with pytest.raises(ck.NonFiniteStateError,
                           match=r"step 2 .*params/dense/kernel/value, tracker/beta.*latest: 1"):
            c.save(2, bad)
        with pytest.raises(ck.NonFiniteStateError, match=r"data_pos"):
            c.save(3, {**state, "data_pos": float("nan")})
        assert c.all_steps() == [1]
        assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
        restored, _ = c.restore(None, abstract)
    _assert_same(restored, state)


def test_find_non_finite_ignores_ints_and_keys():
    tree = {"i": jnp.arange(3), "k": jax.random.key(0), "f": np.array([1.0, np.nan]), "g": jnp.ones(2),
            "h": jnp.array([jnp.inf], jnp.bfloat16)}
    assert ck.find_non_finite(tree) == ["f", "h"]


def test_config_mismatch_names_fields(tmp_path, setup):
    state, abstract, _ = setup
    with ck.Checkpointer(tmp_path, config_fingerprint=FP) as c:
        c.save(1, state)
    other = {**FP, "model.num_layers": 6, "sera.estimator": "grpo"}
    with ck.Checkpointer(tmp_path, config_fingerprint=other) as c:
        with pytest.raises(ck.ConfigMismatchError) as err:
            c.restore(None, abstract)
        with pytest.raises(ck.ConfigMismatchError):
            c.check_config()
    text = str(err.value)
    assert str(tmp_path / "1") in text
    assert "model.num_layers: checkpoint=4, current=6" in text
    assert 'sera.estimator: checkpoint="maxrl", current="grpo"' in text
    assert "model.d_model" not in text


# A failed orbax restore leaves un-awaited tensorstore coroutines behind; collect them here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupted_checkpoints_name_the_path(tmp_path, setup):
    state, abstract, _ = setup
    with ck.Checkpointer(tmp_path) as c:
        c.save(1, state)
        c.save(2, state)
    # Array data deleted from step 2.
    for p in (tmp_path / "2" / "state").rglob("*"):
        if p.is_dir() and p.name == "d":
            shutil.rmtree(p)
    with ck.Checkpointer(tmp_path) as c:
        with pytest.raises(ck.CheckpointError, match=rf"cannot restore checkpoint {tmp_path / '2'}: it is corrupted"):
            c.restore(2, abstract)
        restored, _ = c.restore(1, abstract)  # the older one is still good
    _assert_same(restored, state)
    # A bare step directory (e.g. a partial copy) is the "latest" but unusable.
    (tmp_path / "9").mkdir()
    with ck.Checkpointer(tmp_path) as c:
        assert c.latest_step() == 9
        with pytest.raises(ck.CheckpointError, match=rf"checkpoint {tmp_path / '9'} is incomplete or corrupted"):
            c.restore(None, abstract)
    # Garbage metadata.
    shutil.rmtree(tmp_path / "9")
    meta_dir = tmp_path / "1" / "meta"
    for p in meta_dir.iterdir():
        p.write_text("{not json")
    with ck.Checkpointer(tmp_path) as c, pytest.raises(
            ck.CheckpointError, match=rf"checkpoint {tmp_path / '1'} has unreadable metadata"):
        c.restore(1, abstract)
    # The directory itself is a file.
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint directory {f} exists and is not a directory"):
        ck.Checkpointer(f)
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_state_mismatch_and_missing_steps(tmp_path, setup):
    state, abstract, _ = setup
    with ck.Checkpointer(tmp_path) as c:
        with pytest.raises(FileNotFoundError, match=rf"no checkpoint in {tmp_path}"):
            c.restore(None, abstract)
        assert c.latest_step() is None
        c.save(1, state)
        with pytest.raises(FileNotFoundError, match=r"step 4 .*available steps: \[1\]"):
            c.restore(4, abstract)
        wrong = {**abstract, "tracker": {"alpha": jax.ShapeDtypeStruct((32,), jnp.float32), "beta": abstract[
            "tracker"]["beta"]}}
        with pytest.raises(ck.CheckpointError, match=r"does not match the requested abstract state"):
            c.restore(1, wrong)
        with pytest.raises(ck.CheckpointError, match=r"does not match"):
            c.restore(1, {k: v for k, v in abstract.items() if k != "data_pos"})
    gc.collect()


def test_resume_from_latest_continues_exactly(tmp_path, setup):
    state0, abstract, train_step = setup
    # Uninterrupted: 8 steps.
    ref = state0
    for _ in range(8):
        ref = train_step(ref)
    # Interrupted after step 5 (last checkpoint at 4), then resumed from the latest checkpoint.
    st = state0
    with ck.Checkpointer(tmp_path, save_interval_steps=2, max_to_keep=2) as c:
        for step in range(1, 6):
            st = train_step(st)
            c.save(step, st)
    with ck.Checkpointer(tmp_path, save_interval_steps=2, max_to_keep=2) as c:
        start = c.latest_step()
        assert start == 4
        st, _ = c.restore(None, abstract)
        assert int(st["step"]) == 4 and st["data_pos"] == 12
        for step in range(start + 1, 9):
            st = train_step(st)
            c.save(step, st)
        assert c.all_steps() == [6, 8]
    _assert_same(st, ref)
