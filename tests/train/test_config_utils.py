"""Config validation messages, fingerprints and JSON conversion."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sera_jax.train import config_utils as cu


def _config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict({"num_layers": 4, "d_model": 256, "dtype": "float32"})
    c.optim = ml_collections.ConfigDict({"lr": 1e-4, "betas": (0.9, 0.95)})
    c.sera = ml_collections.ConfigDict({"estimator": "maxrl", "n_min": 2, "n_max": 128})
    return c


def test_get_field_and_missing_path_message():
    c = _config()
    assert cu.get_field(c, "model.num_layers") == 4
    assert cu.get_field(c, "model.nope", default=7) == 7
    with pytest.raises(ValueError, match=r"config\.model\.num_layer is missing.*did you mean \['num_layers'\]"):
        cu.get_field(c, "model.num_layer")
    with pytest.raises(ValueError, match=r"config\.optim\.lr\.x is missing"):
        cu.get_field(c, "optim.lr.x")


def test_require_types_and_predicates():
    c = _config()
    assert cu.require(c, "optim.lr", float) == 1e-4
    assert cu.require(c, "sera.n_min", lambda n: n >= 1) == 2
    with pytest.raises(ValueError, match=r"config\.model\.num_layers=4: expected str, got int"):
        cu.require(c, "model.num_layers", str)
    c.model.num_layers = True  # bool is not accepted as an int
    with pytest.raises(ValueError, match=r"config\.model\.num_layers=True: expected int"):
        cu.require(c, "model.num_layers", int)
    with pytest.raises(ValueError, match=r"config\.sera\.estimator='maxrl': must be grpo"):
        cu.require(c, "sera.estimator", lambda e: e == "grpo", "must be grpo")
    with pytest.raises(ValueError, match=r"config\.sera\.estimator='maxrl': positive"):
        cu.require(c, "sera.estimator", lambda e: e > 0, "positive")  # predicate crashes on a str


def test_unknown_fields_names_field_and_close_matches():
    ref = _config()
    c = _config()
    c.model.num_layer = 3  # typo
    c.optim.weight_decay = 0.1  # no close match
    found = dict(cu.unknown_fields(c, ref))
    assert found == {"model.num_layer": ["num_layers"], "optim.weight_decay": []}
    with pytest.raises(ValueError, match=r"config\.model\.num_layer \(did you mean num_layers\?\); "
                                         r"config\.optim\.weight_decay"):
        cu.check_no_unknown_fields(c, ref)
    cu.check_no_unknown_fields(_config(), ref)
    # Plain dicts (e.g. a config read back from results.json) work too.
    plain = cu.config_to_dict(_config())
    plain["sera"]["n_mx"] = 4
    assert dict(cu.unknown_fields(plain, ref)) == {"sera.n_mx": ["n_max", "n_min"]}


def test_fingerprint_is_stable_and_diff_names_fields():
    a = cu.fingerprint(_config(), ["model.num_layers", "model.d_model", "optim.betas", "sera.estimator"])
    assert a == {"model.d_model": 256, "model.num_layers": 4, "optim.betas": [0.9, 0.95],
                 "sera.estimator": "maxrl"}
    # Stable across calls and independent of field order and tuple-vs-list spelling.
    b = cu.fingerprint(_config(), ["sera.estimator", "optim.betas", "model.d_model", "model.num_layers"])
    assert cu.fingerprint_digest(a) == cu.fingerprint_digest(b)
    assert cu.fingerprint_digest(a) == cu.fingerprint_digest({**a, "optim.betas": (0.9, 0.95)})
    # A known value pins the digest across processes and Python versions (no hash randomisation).
    assert cu.fingerprint_digest({"x": 1}) == "5041bf1f713df204"
    c = _config()
    c.model.num_layers = 6
    d = cu.fingerprint(c, list(a))
    assert cu.fingerprint_digest(d) != cu.fingerprint_digest(a)
    assert cu.diff_fingerprints(a, d) == ["model.num_layers: checkpoint=4, current=6"]
    assert cu.diff_fingerprints({"x": 1}, {"y": 2}) == ["x: checkpoint=1, current=<absent>",
                                                        "y: checkpoint=<absent>, current=2"]
    assert cu.diff_fingerprints({"x": float("nan")}, {"x": float("nan")}) == []
    with pytest.raises(ValueError, match=r"config\.model\.depth is missing"):
        cu.fingerprint(_config(), ["model.depth"])


def test_to_jsonable_converts_numpy_jax_and_config():
    value = {
        "config": _config(),
        "np_scalar": np.float32(0.5),
        "np_int": np.int64(3),
        "jax_scalar": jnp.asarray(2.0, jnp.bfloat16),
        "array": jnp.arange(4).reshape(2, 2),
        "bool": np.bool_(True),
        "dtype": jnp.bfloat16,
        "np_dtype": np.dtype("float32"),
        "key": jax.random.key(0),
        "nested": ({"a": np.arange(2)},),
    }
    out = cu.to_jsonable(value)
    text = json.dumps(out)  # must not raise
    back = json.loads(text)
    assert back["np_scalar"] == 0.5 and back["np_int"] == 3 and back["jax_scalar"] == 2.0
    assert back["array"] == [[0, 1], [2, 3]] and back["bool"] is True
    assert back["dtype"] == "bfloat16" and back["np_dtype"] == "float32"
    assert back["config"]["optim"]["betas"] == [0.9, 0.95]
    assert back["nested"] == [{"a": [0, 1]}]
    assert len(back["key"]) == 2
    with pytest.raises(ValueError, match=r"results\.bad: cannot convert object"):
        cu.to_jsonable({"results": {"bad": object()}})


def test_fields_added_later_match_a_saved_fingerprint_only_at_their_old_behaviour():
    """A run saved before ``maze.num_train`` existed resumes under num_train 0 (the endless stream it ran) and is
    refused under any other value; a field not declared as added later is refused whenever it is absent."""
    from sera_jax.train import config_utils as cu

    assert cu.diff_fingerprints({"rl.steps": 3}, {"rl.steps": 3, "maze.num_train": 0}) == []
    assert cu.diff_fingerprints({"rl.steps": 3}, {"rl.steps": 3, "maze.num_train": 8}) == [
        "maze.num_train: checkpoint=<absent>, current=8"]
    assert cu.diff_fingerprints({}, {"sera.epoch_prior": (0.5, 0.5)}) == []
    assert cu.diff_fingerprints({}, {"sera.new_thing": 1}) == ["sera.new_thing: checkpoint=<absent>, current=1"]


def test_a_checkpoint_of_the_reconstructed_sera_is_not_resumed_by_the_released_rule():
    """'sera' named the all-active max-min before the released rule took the name: the method's checkpoint
    fingerprint records the rule, so an old checkpoint (without it) is refused with the field named."""
    from experiments.maze import config as maze_config
    from sera_jax.rl import comparison
    from sera_jax.rl import config as rl_config
    from sera_jax.train import config_utils as cu

    config = maze_config.get_config("tiny")
    released = rl_config.method_config(config, maze_config.METHODS, "sera")
    assert comparison.rule_fingerprint(released)
    assert comparison.rule_fingerprint(rl_config.method_config(config, maze_config.METHODS, "uniform")) == {}
    old = {"method": "sera"}
    diff = cu.diff_fingerprints(old, {**old, **comparison.rule_fingerprint(released)})
    assert len(diff) == 1 and diff[0].startswith("sera_rule: checkpoint=<absent>")


@pytest.mark.parametrize("value, number, fraction", [
    (0, True, True), (1, True, True), (0.5, True, True), (1.5, True, False), (-0.1, True, False),
    (float("nan"), False, False), (float("inf"), False, False), (True, False, False), ("0.5", False, False),
    (None, False, False)])
def test_is_number_and_is_fraction(value, number, fraction):
    # A bool is not a number here (True == 1 would pass a [0, 1] check), nor is a NaN or an infinity.
    assert cu.is_number(value) is number
    assert cu.is_fraction(value) is fraction
