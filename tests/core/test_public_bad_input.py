"""Every name ``sera_jax`` exports refuses bad input where it is entered, with a ValueError naming the problem.

The table below has an entry for each name in ``sera_jax.__all__`` (a test fails when a new export has none):
functions get calls with bad arguments; registries and state types get the calls that read them. Under ``jit``
a check that needs a traced value runs inside ``jax.experimental.checkify.checkify`` and reports the same message
(plain jit skips it: XLA cannot stop a compiled program with a Python error).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import sera_jax as sj

P4 = jnp.asarray([0.05, 0.3, 0.6, 0.9])
IDS = jnp.asarray([0, 0, 1, 1])
REWARDS = jnp.asarray([1.0, 0.0, 0.0, 1.0])
POST = sj.BetaPosterior(jnp.ones(4), jnp.ones(4))
BAD_POST = sj.BetaPosterior(jnp.asarray([1.0, -1.0, 1.0, 1.0]), jnp.ones(4))
TREE = {"w": jnp.ones(3), "b": jnp.ones(2)}


def _history():
    return sj.epoch_history_start_epoch(sj.epoch_history_init(6))


def _bad_history():
    return _history()._replace(mean_E=jnp.zeros(5))


def _tracker():
    return sj.tracker_update(sj.tracker_init(6), jnp.asarray([0, 1]), jnp.asarray([1.0, 0.0]), jnp.asarray([2, 2]))


IDS_RANGE = r"prompt_ids_B must lie in \[0, num_prompts\) = \[0, 2\)"
KEYS_RANGE = r"keys_P must lie in \[0, 6\)"
N_RANGE = r"rollout counts n must be 0 \(no rollouts\) or >= 1"

# name -> [(bad call, what the message must say)]
BAD_CALLS = {
    # registries and constants: the calls that look a name up in them
    "AGGREGATIONS": [(lambda: sj.loss_weights(IDS, 2, aggregation="median"), "unknown aggregation 'median'")],
    "ALLOCATORS": [(lambda: sj.allocate(P4, 16, n_max=8, method="serra"), "unknown allocation method 'serra'")],
    "ESTIMATORS": [(lambda: sj.scale_factor(P4, 4, "ppo"), "unknown estimator 'ppo'")],
    "get_allocator": [(lambda: sj.get_allocator("ppo"), "unknown allocation method 'ppo'")],
    "get_estimator": [(lambda: sj.get_estimator("ppo"), "unknown estimator 'ppo'")],
    # state and result types: what reads them
    "Allocator": [(lambda: sj.get_allocator("sera").counts(P4, 16, n_min=2, n_max=8, estimator="grpo"),
                   r"(?=.*'sera')(?=.*'grpo')")],
    "BetaPosterior": [(lambda: sj.allocate(BAD_POST, 16, n_max=8, method="sera_all_active"),
                       "posterior alpha and beta must be finite and > 0"),
                      (lambda: sj.posterior_scale_factor(BAD_POST, 4), "posterior alpha and beta must be finite")],
    "Estimator": [(lambda: sj.advantages(REWARDS, IDS, 2, "ppo"), "unknown estimator 'ppo'")],
    "EpochHistoryState": [(lambda: sj.epoch_history_lookup(_bad_history(), jnp.asarray([0])),
                           r"state\.successes_E must have shape \(E,\)")],
    "ReleasedAllocation": [(lambda: sj.released_allocation(P4, 40, n_max=8), "infeasible budget 40")],
    "SkipState": [(lambda: sj.greso_update(sj.skip_state_init(6), jnp.asarray([0, 9]), jnp.asarray([1, 0]),
                                           jnp.asarray([2, 2]), epoch_started=False), r"keys_P must lie in \[0, 6\)")],
    "TrackerState": [(lambda: sj.tracker_predict(sj.TrackerState(jnp.zeros(6), jnp.zeros(5)), jnp.asarray([0])),
                      r"state\.failures must have shape \(6,\) like state\.successes")],
    # functions
    "epoch_history_advance": [(lambda: sj.epoch_history_advance(_history(), -1, 4), "step must be >= 0")],
    "epoch_history_all_known": [(lambda: sj.epoch_history_all_known(_history(), jnp.asarray([0, 6])), KEYS_RANGE)],
    "epoch_history_init": [(lambda: sj.epoch_history_init(0), "num_keys must be >= 1")],
    "epoch_history_lookup": [(lambda: sj.epoch_history_lookup(_history(), jnp.asarray([-1])), KEYS_RANGE)],
    "epoch_history_record": [(lambda: sj.epoch_history_record(_history(), jnp.asarray([0]), jnp.asarray([3.0]),
                                                              jnp.asarray([2.0])), r"successes_P must lie in \[0, counts_P\]")],
    "epoch_history_start_epoch": [(lambda: sj.epoch_history_start_epoch(_history(), discount=2.0),
                                   r"discount must lie in \[0, 1\]")],
    "epoch_length": [(lambda: sj.epoch_length(3, 5), r"prompts_per_step \(5\) must be <= num_train_prompts \(3\)")],
    "epoch_of_step": [(lambda: sj.epoch_of_step(-1, 4), "step must be >= 0")],
    "group_outcomes": [(lambda: sj.group_outcomes(jnp.asarray([3.0, 0.0]), jnp.asarray([2, 2])),
                        r"successes_P must lie in \[0, counts_P\]"),
                       (lambda: sj.group_outcomes(jnp.asarray([1.0, 0.0]), jnp.asarray([2, -1])),
                        r"counts_P must be >= 0"),
                       (lambda: sj.group_outcomes(jnp.asarray([1.0]), jnp.asarray([2, 2])),
                        r"successes_P must have shape \(P,\) = \(2,\) like counts_P")],
    "mixed_group_chance": [(lambda: sj.mixed_group_chance(jnp.asarray([0.5, 1.5]), jnp.asarray([2, 2])),
                            r"p_P must be probabilities in \[0, 1\]"),
                           (lambda: sj.mixed_group_chance(jnp.asarray([0.5, 0.5]), jnp.asarray([2, -2])),
                            r"counts_P must be >= 0")],
    "released_allocation": [(lambda: sj.released_allocation(jnp.asarray([0.5, 1.5]), 8, n_max=8),
                             r"p_P must be probabilities in \[0, 1\]")],
    "balanced_subset": [(lambda: sj.balanced_subset(REWARDS, IDS, 2, 0), "keep must be >= 1")],
    "greso_update": [(lambda: sj.greso_update(sj.skip_state_init(6), jnp.asarray([0, 1]), jnp.asarray([1, 0]),
                                              jnp.asarray([0, 2]), epoch_started=False), "counts_P must be integers >= 1")],
    "kept_groups": [(lambda: sj.kept_groups(jnp.ones(3), IDS, 2), r"prompt_ids_B must have shape \(B,\)"),
                    (lambda: sj.kept_groups(jnp.ones(4), jnp.asarray([0, 0, 1, 2]), 2),
                     r"prompt_ids_B of kept rows must lie in \[0, num_prompts\) = \[0, 2\)")],
    "max_variance_subset": [(lambda: sj.max_variance_subset(jnp.asarray([2.0, 0, 0, 1]), IDS, 2, 1),
                             r"rewards_B must be binary")],
    "mixed_groups": [(lambda: sj.mixed_groups(REWARDS, jnp.asarray([0, 0, 1, 2]), 2), r"prompt_ids_B of valid rows")],
    "skip_state_init": [(lambda: sj.skip_state_init(0), "num_keys must be >= 1")],
    "advantages": [(lambda: sj.advantages(jnp.asarray([1.0, 0.0, 2.0, 0.0]), IDS, 2), r"rewards_B must be binary"),
                   (lambda: sj.advantages(jnp.asarray([1.0, 0.0, 0.5, 0.0]), IDS, 2, "grpo"), r"rewards_B must be binary"),
                   (lambda: sj.advantages(REWARDS, jnp.asarray([0, 0, 1, 2]), 2), IDS_RANGE)],
    "allocate": [(lambda: sj.allocate(P4, 40, n_max=8), "infeasible budget 40"),
                 (lambda: sj.allocate(jnp.asarray([0.5, jnp.nan]), 8, n_max=8), "p_hat must be probabilities"),
                 (lambda: sj.allocate(P4, 16, n_max=8, method="reinforce_ada"), "samples in rounds")],
    "allocate_tokens": [(lambda: sj.allocate_tokens(P4, 100.0, -jnp.ones(4), 16, n_max=8), "costs_P must be > 0")],
    "cosine_similarity": [(lambda: sj.cosine_similarity(TREE, {"w": jnp.ones(3)}), "a and b must have the same "
                                                                                    "tree structure")],
    "counts_from_prompt_ids": [(lambda: sj.counts_from_prompt_ids(jnp.asarray([0, 2]), 2), IDS_RANGE)],
    "effective_prompt_weights": [(lambda: sj.effective_prompt_weights(jnp.ones(3), jnp.ones(2)),
                                  r"counts_P must have shape \(P,\) = \(3,\) like scales_P")],
    "expected_scale_factor": [(lambda: sj.expected_scale_factor(POST, 0.5), N_RANGE)],
    "fitted_prior": [(lambda: sj.fitted_prior(_tracker(), min_strength=5.0, max_strength=1.0),
                      r"min_strength \(5.0\) must be <= max_strength \(1.0\)")],
    "loss_weights": [(lambda: sj.loss_weights(jnp.asarray([0, 0, 1, 2]), 2), IDS_RANGE)],
    "mean_pass_at_k": [(lambda: sj.mean_pass_at_k(4, [5], [1]), "0 <= c <= n")],
    "pass_at_k": [(lambda: sj.pass_at_k(4, 5, 1), "0 <= c <= n")],
    "pass_at_k_curve": [(lambda: sj.pass_at_k_curve(4, [2], [5]), "1 <= k <= n")],
    "pilot_allocate": [(lambda: sj.pilot_allocate(jnp.asarray([5.0, 0, 1, 2]), 4, 32, n_max=16),
                        r"successes_P must lie in \[0, n0\] = \[0, 4\]")],
    "pilot_posterior": [(lambda: sj.pilot_posterior(jnp.asarray([5.0, 0.0]), 4), r"successes_P must lie in \[0, n0\]"),
                        (lambda: sj.pilot_posterior(jnp.asarray([0.0]), 0), "n0 must be >= 1")],
    "posterior_scale_factor": [(lambda: sj.posterior_scale_factor(POST, -1), N_RANGE)],
    "prompt_ids_from_counts": [(lambda: sj.prompt_ids_from_counts(jnp.asarray([3, 3]), 8), "counts_P must sum to total"),
                               (lambda: sj.prompt_ids_from_counts(jnp.asarray([3, -1]), 2), "counts_P must be >= 0")],
    "rank_within_prompt": [(lambda: sj.rank_within_prompt(jnp.asarray([0, 2]), 2), IDS_RANGE)],
    "relative_error": [(lambda: sj.relative_error(TREE, {"w": jnp.ones(3), "b": jnp.ones(3)}),
                        r"estimate and target must have the same shapes")],
    "rollout_weights": [(lambda: sj.rollout_weights(jnp.asarray([0, 0, 1, 2]), 2), IDS_RANGE)],
    "scale_factor": [(lambda: sj.scale_factor(P4, -1), N_RANGE), (lambda: sj.scale_factor(P4, 0.5), N_RANGE),
                     (lambda: sj.scale_factor(jnp.asarray([1.5]), 4), r"p must be probabilities in \[0, 1\]")],
    "scale_factor_stats": [(lambda: sj.scale_factor_stats(jnp.zeros(0)), "scales must hold at least one factor")],
    "segment_mean": [(lambda: sj.segment_mean(jnp.ones(2), jnp.asarray([0, 2]), 2), IDS_RANGE)],
    "segment_sum": [(lambda: sj.segment_sum(jnp.ones(2), jnp.asarray([-1, 0]), 2), IDS_RANGE)],
    "tracker_init": [(lambda: sj.tracker_init(0), "num_keys must be >= 1")],
    "tracker_posterior": [(lambda: sj.tracker_posterior(_tracker(), jnp.asarray([0, 6])), KEYS_RANGE)],
    "tracker_predict": [(lambda: sj.tracker_predict(_tracker(), jnp.asarray([-1])), KEYS_RANGE)],
    "tracker_update": [(lambda: sj.tracker_update(_tracker(), jnp.asarray([0]), jnp.asarray([3.0]), jnp.asarray([2])),
                        r"successes_P must lie in \[0, counts_P\]"),
                       (lambda: sj.tracker_update(_tracker(), jnp.asarray([7]), jnp.asarray([1.0]), jnp.asarray([2])),
                        KEYS_RANGE),
                       (lambda: sj.tracker_update(_tracker(), jnp.asarray([0]), jnp.asarray([1.0]), jnp.asarray([2]),
                                                  decay=1.5), r"decay must lie in \[0, 1\]")],
    "tree_dot": [(lambda: sj.tree_dot(TREE, {"w": jnp.ones(3)}), "a and b must have the same tree structure")],
    "tree_norm": [(lambda: sj.tree_norm({"w": jnp.ones(2), "name": "resnet"}), "leaves must be numeric arrays")],
    "uniform_counts": [(lambda: sj.uniform_counts(0, 8), "num_prompts must be >= 1"),
                       (lambda: sj.uniform_counts(4, -1), "budget must be >= 0")],
    "waterline": [(lambda: sj.waterline(P4, 16, n_min=2, n_max=8, estimator="grpo"), "power-law estimators")],
}


def test_every_exported_name_has_a_bad_input_case():
    missing = sorted(set(sj.__all__) - set(BAD_CALLS))
    stale = sorted(set(BAD_CALLS) - set(sj.__all__))
    assert not missing and not stale, f"no bad-input case for {missing}; cases for names not exported: {stale}"


@pytest.mark.parametrize("name, index", [(n, i) for n in sorted(BAD_CALLS) for i in range(len(BAD_CALLS[n]))])
def test_bad_input_raises_a_value_error_naming_the_problem(name, index):
    call, match = BAD_CALLS[name][index]
    with pytest.raises(ValueError, match=match):
        call()


# Under jit: the checks that need a traced value, through checkify; the message is the eager one.
TRACED_CALLS = {
    "scale_factor": (lambda n: sj.scale_factor(P4, n), jnp.asarray([4, 4, -1, 4]), N_RANGE),
    "advantages": (lambda r: sj.advantages(r, IDS, 2), jnp.asarray([1.0, 0.0, 2.0, 0.0]), "rewards_B must be binary"),
    "loss_weights": (lambda ids: sj.loss_weights(ids, 2), jnp.asarray([0, 0, 1, 2]), IDS_RANGE),
    "prompt_ids_from_counts": (lambda c: sj.prompt_ids_from_counts(c, 8), jnp.asarray([3, 3]),
                               "counts_P must sum to total"),
    # sera_all_active: the same p_hat check as the default rule, at a quarter of its compile time
    "allocate": (lambda p: sj.allocate(p, 8, n_max=8, method="sera_all_active"), jnp.asarray([0.5, jnp.nan]),
                 "p_hat must be probabilities"),
}


@pytest.mark.parametrize("name", sorted(TRACED_CALLS))
def test_under_jit_checkify_reports_the_same_readable_message(name):
    fn, bad, match = TRACED_CALLS[name]
    err, _ = checkify.checkify(jax.jit(fn))(bad)
    with pytest.raises(checkify.JaxRuntimeError, match=match) as raised:
        err.throw()
    assert "INTERNAL" not in str(raised.value) and "Callback" not in str(raised.value)


def test_plain_jit_skips_the_value_checks():
    """What the docs say: without checkify a compiled program runs on (no host callback that would fail it with
    ``INTERNAL: CpuCallback error``, and no host sync in a hot loop)."""
    s = np.asarray(jax.jit(lambda p: sj.scale_factor(p, 4))(jnp.asarray([0.5, jnp.nan])))
    assert s[0] == pytest.approx(1 - 0.5**3) and np.isnan(s[1])
