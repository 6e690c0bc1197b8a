"""A run's RL settings, parsed once at the door of a run into frozen, typed records.

Users write and override an ``ml_collections.ConfigDict`` (``sera_jax.rl.config.default_rl_config``: what a
config file says, what the fingerprint hashes and what results.json records). A run turns it into ``RunSettings``
once, with :func:`parse_run_settings`: every field checked (``validate_rl_config``'s messages, naming the dotted
field), the allocator looked up in the registry, the cross-field rules applied. Everything below the door (the
trainer, its step context, metrics, the memory planner) reads these records and never validates or looks up a
dotted path again.

The records keep the config's field names (``settings.rl.steps`` is ``config.rl.steps``), so code written against a
config's attributes reads them unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import ml_collections

import sera_jax.core as core
from sera_jax.rl import config as rl_config
from sera_jax.train import config_utils


@dataclasses.dataclass(frozen=True)
class RLSettings:
    """``config.rl``: steps, batch, optimiser, sampling and memory knobs (``default_rl_config`` documents each)."""

    steps: int
    prompts_per_step: int
    rollouts_per_step: int
    learning_rate: float
    b1: float
    b2: float
    weight_decay: float
    grad_clip: Optional[float]
    temperature: float
    top_p: float
    sample_chunk: int
    update_microbatches: int
    logprob_chunk: int
    share_prompts: bool
    data_order: str
    sample_slots: int


@dataclasses.dataclass(frozen=True)
class SeraSettings:
    """``config.sera``: which allocator, estimator and estimates of p, the bounds, the loss, the peers' knobs."""

    method: str
    estimator: str
    p_estimate: str
    pilot_rollouts: int
    n_min: int
    n_max: int
    correction: bool
    aggregation: str
    history_decay: float
    use_posterior: bool
    keep_per_prompt: int
    round_size: int
    candidate_ratio: int
    target_rate: float
    budget: str
    tokens_per_step: int
    epoch_discount: float
    epoch_prior: tuple[float, float]
    activation_threshold: float
    loss_microbatch_rows: int


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """``config.eval``: when and how held-out pass@k is measured."""

    every: int
    samples_per_prompt: int
    ks: tuple[int, ...]
    temperature: float
    top_p: float
    max_rollouts_per_call: int
    sample_slots: int
    bootstrap_repeats: int
    bootstrap_seed: int


@dataclasses.dataclass(frozen=True)
class CkptSettings:
    """``config.ckpt``: how often a run saves and how many checkpoints it keeps."""

    every: int
    max_to_keep: Optional[int]


@dataclasses.dataclass(frozen=True)
class SftSettings:
    """``config.sft``: the comparison's SFT start (``run_sft``); fields a config leaves out take ``run_sft``'s
    defaults, and ``batch_size`` / ``learning_rate`` are read only when ``steps`` > 0."""

    steps: int
    batch_size: Optional[int] = None
    learning_rate: Optional[float] = None
    warmup_steps: int = 0
    b1: float = 0.9
    b2: float = 0.95
    weight_decay: float = 0.0
    schedule: str = "cosine"
    shared: bool = False
    seed: int = 0

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "SftSettings":
        """``config.sft`` as a record, its fields checked already (``rl_config.sft_rules`` at the door)."""
        return cls(**{f.name: config.sft[f.name] for f in dataclasses.fields(cls) if f.name in config.sft})


def parse_sft_settings(config: ml_collections.ConfigDict) -> SftSettings:
    """``config.sft`` checked (``rl_config.sft_rules``: ValueError naming the field) and parsed: a door's one call."""
    config_utils.check_fields(config, rl_config.sft_rules(config))
    return SftSettings.from_config(config)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """One run's settings, checked: the four groups and the allocator ``sera.method`` names (its registry entry)."""

    rl: RLSettings
    sera: SeraSettings
    eval: EvalSettings
    ckpt: CkptSettings
    allocator: core.Allocator


def frozen(value: Any) -> Any:
    """Lists (and tuples of lists) as tuples: a record's fields are immutable and hashable."""
    return tuple(frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _group(cls, group: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict):
    """``cls`` from ``group``'s fields; a field the group lacks (a config written before it existed) takes
    ``default_rl_config``'s value."""
    return cls(**{f.name: frozen(group[f.name] if f.name in group else defaults[f.name])
                  for f in dataclasses.fields(cls)})


def parse_run_settings(config: ml_collections.ConfigDict, *, endless: bool, knows_success_rates: bool,
                       num_shards: int = 1, extra_rows: Optional[dict[str, int]] = None,
                       num_train_prompts: Optional[int] = None,
                       max_new_tokens: Optional[int] = None) -> RunSettings:
    """The run's settings from ``config``, every field checked once (``rl_config.validate_rl_config``, whose
    arguments these are: the task's properties, as far as they are known at the door). ValueError naming the field."""
    defaults = rl_config.default_rl_config()
    records = _Unchecked(rl=_group(RLSettings, config.rl, defaults.rl),
                         sera=_group(SeraSettings, config.sera, defaults.sera),
                         eval=_group(EvalSettings, config.eval, defaults.eval),
                         ckpt=_group(CkptSettings, config.ckpt, defaults.ckpt))
    # The checks read the records: from here on no dotted path of the config is looked up.
    allocator = rl_config.validate_rl_config(records, endless=endless, knows_success_rates=knows_success_rates,
                                             num_shards=num_shards, extra_rows=extra_rows,
                                             num_train_prompts=num_train_prompts, max_new_tokens=max_new_tokens)
    return RunSettings(rl=records.rl, sera=records.sera, eval=records.eval, ckpt=records.ckpt, allocator=allocator)


class _Unchecked(NamedTuple):
    """The four records before their checks (``validate_rl_config`` reads them as it would a config)."""

    rl: RLSettings
    sera: SeraSettings
    eval: EvalSettings
    ckpt: CkptSettings


def check_task_fit(settings: RunSettings, *, num_train_prompts: Optional[int], max_new_tokens: Optional[int],
                   endless: bool) -> None:
    """The checks that need the built task (its training set's size, its response cap), for settings parsed
    before it was built: ValueError naming the field, as ``validate_rl_config`` would have."""
    allocator = settings.allocator
    rl_config.check_peer_settings(settings, allocator, endless=endless, num_train_prompts=num_train_prompts)
    rl_config.check_token_budget(settings, allocator, max_new_tokens)
    rl_config.check_history_recurs(settings, allocator, num_train_prompts)
