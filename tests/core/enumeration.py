"""Independent references for the core tests: exact enumeration over a softmax policy, and the greedy.

Nothing here uses the scale-factor formulas or the allocation code under test.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def policy_p_and_grad_log_p(logits: np.ndarray, success: np.ndarray) -> tuple[float, np.ndarray]:
    """p = sum of the success outcomes' probabilities and d log p / d logits, in closed form."""
    pi = softmax(logits)
    p = float(pi[success].sum())
    grad_p = pi * success - p * pi  # d/dtheta_v sum_{y in succ} pi_y = pi_v 1[v in succ] - p pi_v
    return p, grad_p / p


def expected_estimator_gradient(logits: np.ndarray, success: np.ndarray, n: int, advantage_fn) -> np.ndarray:
    """E[(1/N) sum_j A_j grad log pi(y_j)] by summing over all V^N outcome sequences.

    ``advantage_fn(rewards_YxN) -> A_YxN`` computes the advantages of Y groups (the enumerated outcome
    sequences) of N rollouts at once.
    """
    pi = softmax(logits)
    num_outcomes = len(logits)
    seqs = np.array(list(itertools.product(range(num_outcomes), repeat=n)))  # (Y, N)
    probs = np.prod(pi[seqs], axis=1)  # (Y,)
    adv = np.asarray(advantage_fn(success[seqs].astype(np.float64)), dtype=np.float64)  # (Y, N)
    scores = np.eye(num_outcomes)[seqs] - pi  # grad log pi(y) = e_y - pi: (Y, N, V)
    per_sequence = (adv[:, :, None] * scores).mean(axis=1)
    return probs @ per_sequence


def greedy_allocation(scale_fn, num_prompts: int, budget: int, n_min: int, n_max: int) -> np.ndarray:
    """One rollout at a time to the prompt with the smallest current factor (ties: fewer rollouts, then index).

    ``scale_fn(i, n) -> s_i(n)`` as a float.
    """
    counts = np.full(num_prompts, n_min)
    for _ in range(budget - num_prompts * n_min):
        candidates = [(scale_fn(i, counts[i]), counts[i], i) for i in range(num_prompts) if counts[i] < n_max]
        _, _, best = min(candidates)
        counts[best] += 1
    return counts


def brute_force_max_min(scale_fn, num_prompts: int, budget: int, n_min: int, n_max: int) -> float:
    """max over all feasible integer allocations of min_i s_i(N_i)."""
    best = -np.inf
    for counts in itertools.product(range(n_min, n_max + 1), repeat=num_prompts):
        if sum(counts) == budget:
            best = max(best, min(scale_fn(i, c) for i, c in enumerate(counts)))
    return best


def greedy_allocation_with_costs(scale_fn, costs, budget: float, n_min: int, n_max: int) -> np.ndarray:
    """The costed greedy: one rollout at a time to the prompt with the smallest current factor among those whose
    next rollout costs no more than the budget left (ties: fewer rollouts, then index), until none fits.

    ``costs[i] > 0`` is prompt i's cost per rollout; the budget left is kept in float64, step by step.
    """
    costs = [float(c) for c in costs]
    counts = np.full(len(costs), n_min)
    left = float(budget) - n_min * sum(costs)
    assert left >= 0, "infeasible budget"
    while True:
        candidates = [(scale_fn(i, counts[i]), counts[i], i) for i in range(len(costs))
                      if counts[i] < n_max and costs[i] <= left]
        if not candidates:
            return counts
        _, _, best = min(candidates)
        counts[best] += 1
        left -= costs[best]


@functools.lru_cache(maxsize=4)
def _all_choices(num_prompts: int, num_values: int) -> np.ndarray:
    """(num_values^P, P): every tuple of indices into the allowed counts."""
    choice = np.stack(np.meshgrid(*[np.arange(num_values)] * num_prompts, indexing="ij"), -1)
    return choice.reshape(-1, num_prompts)


@functools.lru_cache(maxsize=4)
def _all_allocations(num_prompts: int, n_min: int, n_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every integer allocation with counts in [n_min, n_max]: its value indices per prompt ``(P, A)`` (a row per
    prompt, for fast gathers), its counts ``(A, P)`` (float64) and its total rollouts ``(A,)``."""
    values = np.arange(n_min, n_max + 1)
    choice = _all_choices(num_prompts, len(values))
    counts = values[choice]
    return np.ascontiguousarray(choice.T.astype(np.intp)), counts.astype(np.float64), counts.sum(axis=1)


def brute_force_max_min_with_costs(scale_fn, costs, budget: float, n_min: int, n_max: int,
                                   max_rows: float = np.inf) -> float:
    """max over all integer allocations with ``sum_i costs_i N_i <= budget`` (and ``sum_i N_i <= max_rows``) of
    min_i s_i(N_i), in float64.

    Vectorised over the (n_max - n_min + 1)^P allocations (262,144 for P = 6, n in [2, 9]): the feasible ones
    first, then the minimum factor of each, a prompt at a time.
    """
    costs = np.asarray(costs, np.float64)
    num_prompts = len(costs)
    values = np.arange(n_min, n_max + 1)
    table = np.array([[scale_fn(i, int(n)) for n in values] for i in range(num_prompts)], np.float64)  # (P, V)
    choice_PxA, counts_AxP, rows_A = _all_allocations(num_prompts, n_min, n_max)
    feasible = np.flatnonzero((counts_AxP @ costs <= budget) & (rows_A <= max_rows))
    if feasible.size == 0:
        return -np.inf
    worst = table[0].take(choice_PxA[0].take(feasible))
    for i in range(1, num_prompts):
        np.minimum(worst, table[i].take(choice_PxA[i].take(feasible)), out=worst)
    return float(worst.max())
