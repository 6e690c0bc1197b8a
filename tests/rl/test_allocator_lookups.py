"""The RL modules look a method's allocator up in the registry once, when its settings are parsed, and take it from
there: the memory planner (``memory.planned_rl_calls``) and the comparison runner (``comparison.check_methods``, whose
allocators go on to ``rule_fingerprint``)."""

import pytest
from flax import nnx

import sera_jax.core as core
from sera_jax.models import decoder
from sera_jax.rl import comparison
from sera_jax.rl.config import default_rl_config
from sera_jax.rl.memory import planned_rl_calls
from sera_jax.rl.settings import parse_run_settings
from sera_jax.train.sharding import default_mesh_config


def _model():
    return decoder.Decoder(decoder.tiny(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                                        ffn_dim=32, max_seq_len=8), rngs=nnx.Rngs(0))


def _config(method):
    c = default_rl_config()
    c.rl.update(prompts_per_step=4, rollouts_per_step=16)
    c.sera.update(method=method, n_max=8)
    c.eval.update(samples_per_prompt=4, ks=(1, 2, 4), max_rollouts_per_call=16)
    with c.unlocked():
        c.mesh = default_mesh_config()
    return c


@pytest.fixture
def lookups(monkeypatch):
    """The names ``core.get_allocator`` is asked for (every look-up by name goes through it)."""
    asked, get_allocator = [], core.get_allocator
    monkeypatch.setattr(core, "get_allocator", lambda name: asked.append(name) or get_allocator(name))
    return asked


@pytest.mark.parametrize("method", ["sera", "reinforce_ada"])
def test_the_planner_takes_the_allocator_from_the_parsed_settings(method, lookups):
    """The settings' parse looks the allocator up once; the planner looks nothing up. The plan follows the
    allocator: SERA's pilot call, Reinforce-Ada's rounds of P x round_size rows."""
    config = _config(method)
    settings = parse_run_settings(config, endless=False, knows_success_rates=False)
    assert lookups == [method]
    calls = planned_rl_calls(_model, settings, mesh_config=config.mesh, prompt_len=2, max_new_tokens=2)
    assert lookups == [method]
    assert ("pilot sampling" in [c.name for c in calls]) == (method == "sera")
    sampling = next(c for c in calls if c.name == "rollout sampling")
    rows = 4 * config.sera.round_size if method == "reinforce_ada" else 16 - 4 * config.sera.pilot_rollouts
    assert sampling.note.startswith(f"{rows} of "), sampling.note


def test_the_comparison_hands_each_method_its_allocator_for_the_fingerprint(lookups):
    """``check_methods`` returns each method's allocator (the validation's one look-up); ``rule_fingerprint`` given
    it looks nothing up, and says the same as without it."""
    config = _config("sera")
    with config.unlocked():
        config.methods = ("uniform", "sera")
    experiment = comparison.Experiment(
        name="bandit", methods={"uniform": {"method": "uniform"}, "sera": {"method": "sera"}},
        reference_config=lambda variant: config, make_task=None, build_model=None, make_figures=None)
    allocators = {m: s.allocator for m, s in comparison.check_methods(experiment, config, num_shards=1).items()}
    assert allocators == {"uniform": core.ALLOCATORS["uniform"], "sera": core.ALLOCATORS["sera"]}
    assert lookups == ["uniform", "sera"]
    for method, allocator in allocators.items():
        run_config = comparison.method_config(experiment, config, method)
        assert comparison.rule_fingerprint(run_config, allocator) == comparison.rule_fingerprint(run_config)
        assert bool(comparison.rule_fingerprint(run_config, allocator)) == allocator.may_skip_prompts
    assert lookups == ["uniform", "sera"] * 2  # only the calls without the allocator looked it up
