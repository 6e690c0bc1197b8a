"""Pure jnp math of SERA: scale factors, allocation, advantages, loss weights, estimators of p, metrics.

Nothing here imports flax or optax; everything above (models, RL, experiments) builds on these functions.
"""

from sera_jax.core.advantages import advantages
from sera_jax.core.alignment import cosine_similarity, relative_error, tree_dot, tree_norm
from sera_jax.core.allocators import ALLOCATORS, Allocator, allocate, get_allocator, pilot_allocate
from sera_jax.core.allocation import BetaPosterior, allocate_tokens, expected_scale_factor, uniform_counts, waterline
from sera_jax.core.estimators import ESTIMATORS, Estimator, get_estimator
from sera_jax.core.layout import (counts_from_prompt_ids, prompt_ids_from_counts, rank_within_prompt,
                                  segment_mean, segment_sum)
from sera_jax.core.epoch_history import (EpochHistoryState, epoch_history_advance, epoch_history_all_known,
                                         epoch_history_init, epoch_history_lookup, epoch_history_record,
                                         epoch_history_start_epoch, epoch_length, epoch_of_step)
from sera_jax.core.released_rule import ReleasedAllocation, mixed_group_chance, released_allocation
from sera_jax.core.groups import group_outcomes
from sera_jax.core.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_curve
from sera_jax.core.keep import balanced_subset, kept_groups, max_variance_subset, mixed_groups
from sera_jax.core.selection import SkipState, greso_update, skip_state_init
from sera_jax.core.scale_factors import posterior_scale_factor, scale_factor, scale_factor_stats
from sera_jax.core.success_rates import (TrackerState, fitted_prior, pilot_posterior, tracker_init, tracker_posterior,
                                         tracker_predict, tracker_update)
from sera_jax.core.weights import AGGREGATIONS, effective_prompt_weights, loss_weights, rollout_weights

__all__ = [
    "AGGREGATIONS", "ALLOCATORS", "Allocator", "BetaPosterior", "ESTIMATORS", "Estimator",
    "EpochHistoryState", "ReleasedAllocation", "epoch_history_advance", "epoch_history_all_known", "epoch_history_init",
    "epoch_history_lookup", "epoch_history_record", "epoch_history_start_epoch", "epoch_length", "epoch_of_step",
    "group_outcomes", "mixed_group_chance", "released_allocation",
    "SkipState", "TrackerState", "balanced_subset", "greso_update", "kept_groups", "max_variance_subset",
    "mixed_groups", "skip_state_init",
    "advantages", "allocate", "allocate_tokens", "cosine_similarity", "counts_from_prompt_ids", "effective_prompt_weights",
    "expected_scale_factor", "fitted_prior", "get_allocator", "get_estimator", "loss_weights", "mean_pass_at_k", "pass_at_k",
    "pass_at_k_curve", "pilot_allocate", "pilot_posterior", "posterior_scale_factor", "prompt_ids_from_counts", "rank_within_prompt",
    "relative_error", "rollout_weights", "scale_factor", "scale_factor_stats", "segment_mean", "segment_sum",
    "tracker_init", "tracker_posterior", "tracker_predict", "tracker_update", "tree_dot", "tree_norm",
    "uniform_counts", "waterline",
]
