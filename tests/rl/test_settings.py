"""A run's RL settings parsed once into frozen, typed records (sera_jax.rl.settings)."""

import dataclasses

import pytest

import sera_jax.core as core
from experiments.maze import config as maze_config
from sera_jax.rl.settings import RunSettings, parse_run_settings


def test_the_records_hold_the_configs_values_frozen_and_the_allocator_resolved():
    config = maze_config.get_config("cpu_epochs")
    settings = parse_run_settings(config, endless=False, knows_success_rates=False, num_train_prompts=128)
    assert isinstance(settings, RunSettings) and settings.allocator is core.ALLOCATORS["sera"]
    for group in ("rl", "sera", "eval", "ckpt"):
        record = getattr(settings, group)
        for field in dataclasses.fields(record):
            value = config[group][field.name]
            assert getattr(record, field.name) == (tuple(value) if isinstance(value, (list, tuple)) else value)
    assert settings.eval.ks == (1, 2, 4, 8, 16, 32, 64, 128) and isinstance(settings.sera.epoch_prior, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rl.steps = 3
    hash(settings.rl)  # a key for the updates runs share


def test_a_bad_field_is_named_at_the_door():
    config = maze_config.get_config("tiny")
    config.rl.update_microbatches = 5
    with pytest.raises(ValueError, match=r"config\.rl\.update_microbatches=5: must be an int >= 1 that divides"):
        parse_run_settings(config, endless=True, knows_success_rates=False)


def test_lists_a_config_holds_become_tuples_so_the_records_stay_immutable():
    import ml_collections

    fields = maze_config.get_config("cpu_epochs").to_dict()  # as read back from a results.json: lists, not tuples
    fields["eval"]["ks"], fields["sera"]["epoch_prior"] = [1, 2, 4], [0.5, 0.5]
    config = ml_collections.ConfigDict(fields)
    assert isinstance(config.eval.ks, list)
    settings = parse_run_settings(config, endless=False, knows_success_rates=False, num_train_prompts=128)
    assert settings.eval.ks == (1, 2, 4) and settings.sera.epoch_prior == (0.5, 0.5)
    hash((settings.eval, settings.sera))
