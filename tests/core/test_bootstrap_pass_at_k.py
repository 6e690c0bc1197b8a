"""The SERA authors' maze pass@k (a seeded bootstrap) against a restatement of their procedure, exact enumeration
of draws with replacement, and the unbiased estimator it approaches."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from sera_jax.core.pass_at_k import (bootstrap_draws, bootstrap_pass_at_k_curve, mean_bootstrap_pass_at_k,
                                     pass_at_k, pass_at_k_curve, with_replacement_pass_at_k)


def their_trainer_best_of_k(values, k, repeats=1000, seed=42):
    """Their trainer's bootstrap_metric(..., reduce_fns=[np.max]) mean, as it runs: the global stream seeded, then
    one choice of k indices with replacement per draw, the best value of each draw averaged (restated with a
    RandomState object, the same MT19937 stream as np.random.seed)."""
    rng = np.random.RandomState(seed)
    best = [max(values[i] for i in rng.choice(len(values), size=k, replace=True)) for _ in range(repeats)]
    return float(np.mean(best))


def random_pools(rng, num_prompts, n):
    p = rng.beta(0.5, 0.5, size=(num_prompts, 1))
    return rng.random((num_prompts, n)) < p


def test_matches_their_trainer_loop_draw_for_draw():
    """Each prompt's value equals their per-prompt loop (reseeded for each prompt and k), bit for bit."""
    rng = np.random.default_rng(0)
    pools = random_pools(rng, 5, 64)
    ks = [1, 2, 3, 8, 33, 64]
    got = bootstrap_pass_at_k_curve(pools, ks, repeats=200, seed=42)
    for i, pool in enumerate(pools):
        values = pool.astype(float).tolist()
        for j, k in enumerate(ks):
            want = float(np.mean(values)) if k == 1 else their_trainer_best_of_k(values, k, repeats=200, seed=42)
            assert got[i, j] == want, (i, k)
    np.testing.assert_allclose(mean_bootstrap_pass_at_k(pools, ks, repeats=200), got.mean(0), rtol=0, atol=0)


def test_draws_are_one_stream_read_in_rows():
    rng = np.random.RandomState(7)
    rows = [rng.choice(10, size=4, replace=True) for _ in range(3)]
    np.testing.assert_array_equal(bootstrap_draws(10, 4, repeats=3, seed=7), np.stack(rows))


def exact_with_replacement(n, c, k):
    """The share of the n^k ordered draws of k indices that hit one of c correct samples, by enumeration."""
    hits = sum(any(i < c for i in draw) for draw in itertools.product(range(n), repeat=k))
    return Fraction(hits, n**k)


@pytest.mark.parametrize("n, c, k", [(5, 0, 3), (5, 1, 1), (5, 2, 3), (6, 5, 4), (4, 4, 2), (7, 3, 5)])
def test_with_replacement_mean_against_enumeration(n, c, k):
    np.testing.assert_allclose(with_replacement_pass_at_k(n, c, k), float(exact_with_replacement(n, c, k)),
                               rtol=1e-14, atol=0)


def test_bootstrap_mean_over_seeds_is_the_with_replacement_chance():
    """Averaged over seeds (one pool, n = 12, c = 3) the bootstrap is 1 - (1 - c/n)^k within 4 standard errors;
    every seed is a different estimate of it."""
    pool = np.zeros((1, 12), bool)
    pool[0, [2, 5, 9]] = True
    ks = [2, 4, 12]
    per_seed = np.stack([bootstrap_pass_at_k_curve(pool, ks, repeats=1000, seed=s)[0] for s in range(200)])
    want = with_replacement_pass_at_k(12, 3, np.array(ks))
    stderr = np.sqrt(want * (1 - want) / (1000 * 200))
    assert np.all(np.abs(per_seed.mean(0) - want) < 4 * stderr)
    assert len({tuple(row) for row in per_seed}) > 100


def test_seeded_and_order_dependent():
    rng = np.random.default_rng(1)
    pools = random_pools(rng, 3, 32)
    a = bootstrap_pass_at_k_curve(pools, [4, 16])
    np.testing.assert_array_equal(a, bootstrap_pass_at_k_curve(pools, [4, 16], repeats=1000, seed=42))
    assert not np.array_equal(a, bootstrap_pass_at_k_curve(pools, [4, 16], seed=43))
    # The same counts in another order: another value (their estimator keeps the sample order).
    shuffled = pools[:, rng.permutation(32)]
    np.testing.assert_array_equal(shuffled.sum(1), pools.sum(1))
    assert not np.array_equal(a, bootstrap_pass_at_k_curve(shuffled, [4, 16]))
    # k = 1 is c / n whatever the order and seed, as theirs.
    np.testing.assert_array_equal(bootstrap_pass_at_k_curve(shuffled, [1], seed=5)[:, 0], pools.mean(1))


def test_tends_to_the_unbiased_estimate_as_the_pool_grows():
    """At fixed k and c/n the with-replacement chance (the bootstrap's mean) approaches the unbiased pass@k from
    below as n grows (the gap falls monotonically, below 1e-3 at n = 2^14); the bootstrap stays within 4 standard
    errors of that mean; at k = 1 all agree exactly, and at k = n the bootstrap reads low (1 - (1 - c/n)^n
    against 1)."""
    for k in (2, 8):
        gaps = [float(pass_at_k(n, n // 8, k) - with_replacement_pass_at_k(n, n // 8, k))
                for n in 2 ** np.arange(6, 15)]
        assert all(g > 0 for g in gaps) and all(b < a for a, b in zip(gaps, gaps[1:])) and gaps[-1] < 1e-3
    rng = np.random.default_rng(2)
    pools = random_pools(rng, 4, 1024)
    ks = np.array([1, 2, 8])
    boot = bootstrap_pass_at_k_curve(pools, ks, repeats=4_000)
    unbiased = pass_at_k_curve(1024, pools.sum(1), ks)
    mean = with_replacement_pass_at_k(1024, pools.sum(1)[:, None], ks)
    np.testing.assert_allclose(boot[:, 0], unbiased[:, 0], rtol=1e-12)
    assert np.all(np.abs(boot - mean) <= 4 * np.sqrt(mean * (1 - mean) / 4_000) + 1e-12)  # 4 standard errors
    assert np.max(unbiased - mean) < 2e-3  # at n = 1024 and k <= 8 the two estimands are this close
    n, c = 64, 1
    assert pass_at_k(n, c, n) == 1.0
    np.testing.assert_allclose(with_replacement_pass_at_k(n, c, n), 1 - (1 - 1 / 64) ** 64)
    assert math.isclose(float(with_replacement_pass_at_k(n, c, n)), 1 - math.exp(-1), rel_tol=0.02)


@pytest.mark.parametrize("kwargs, match", [
    (dict(correct_PxN=np.ones(4, bool), ks=[1]), "must be \\(prompts, samples\\)"),
    (dict(correct_PxN=np.full((2, 4), 2), ks=[1]), "must hold 0/1"),
    (dict(correct_PxN=np.ones((2, 4), bool), ks=[5]), "1 <= k <= n"),
    (dict(correct_PxN=np.ones((2, 4), bool), ks=[2], repeats=0), "repeats=0 must be an int >= 1"),
    (dict(correct_PxN=np.ones((2, 4), bool), ks=[2], seed=-1), "seed=-1 must be an int in \\[0, 2\\^32 - 1\\]"),
    (dict(correct_PxN=np.ones((2, 4), bool), ks=[2], seed=2**32), "seed=4294967296"),
    (dict(correct_PxN=np.ones((2, 4), bool), ks=[2], seed=True), "seed=True"),
])
def test_refuses_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_pass_at_k_curve(**kwargs)
