"""The static knobs of the alignment analysis, read once from the config (``config.analysis``, ``config.sera``)."""

from __future__ import annotations

import dataclasses

from experiments.imagenet_alignment.config import ALLOCATOR_CORRECTION
from sera_jax import core


@dataclasses.dataclass(frozen=True)
class AnalysisSettings:
    """The static knobs of the analysis (from ``config.analysis`` and ``config.sera``)."""

    budgets: tuple[int, ...]
    estimators: tuple[str, ...]
    num_draws: int
    draw_chunk: int
    microbatch: int
    pilot_draws: int
    norm_budget: int
    norm_examples: int
    n_min: int
    n_max_factor: int
    n_max_table: int
    n0: int
    fast_compile: bool = False
    allocators: tuple[str, ...] = tuple(ALLOCATOR_CORRECTION)  # analysis.allocators
    keep_per_prompt: int = 4  # analysis.keep_per_prompt: PODS's m, Reinforce-Ada's n
    round_size: int = 4  # analysis.round_size: Reinforce-Ada's M

    @classmethod
    def from_config(cls, config) -> AnalysisSettings:
        a, s = config.analysis, config.sera
        return cls(budgets=tuple(a.budgets), estimators=tuple(a.estimators), allocators=tuple(a.allocators),
                   num_draws=a.num_draws,
                   draw_chunk=a.draw_chunk, microbatch=a.microbatch, pilot_draws=a.pilot_expectation_draws,
                   norm_budget=a.norm_budget, norm_examples=a.norm_examples, n_min=s.n_min,
                   n_max_factor=s.n_max_factor, n_max_table=s.n_max_table, n0=s.pilot_rollouts,
                   fast_compile=config.fast_compile, keep_per_prompt=a.keep_per_prompt, round_size=a.round_size)

    def bounds(self, n_bar: int, estimator: str) -> tuple[int, int, int]:
        """(n_min, n_max, n0) at average budget ``n_bar``: ``n_max = n_max_factor * N_bar`` (capped at
        ``max(n_max_table, N_bar)`` for estimators allocated from a table), ``n0 = min(pilot, N_bar)``."""
        est = core.get_estimator(estimator)
        n_min = max(self.n_min, est.min_rollouts)
        n_max = self.n_max_factor * n_bar
        if est.power_offset is None:
            n_max = min(n_max, max(self.n_max_table, n_bar))
        return n_min, max(n_max, n_min), min(self.n0, n_bar)
