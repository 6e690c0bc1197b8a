"""Multiplicity correction by Monte Carlo: corrected loss -> (1/P) sum s_i grad log p_i (docs/method.md §4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core import (advantages, effective_prompt_weights, loss_weights, prompt_ids_from_counts, rollout_weights,
                           scale_factor)

# Three prompts, each a softmax over 3 outcomes (outcome 0 succeeds), with heterogeneous rollout counts.
LOGITS_PxV = np.array([[-2.0, 0.5, 0.0], [0.0, 0.3, -0.2], [1.5, -0.4, 0.1]])
COUNTS_P = np.array([12, 5, 2])
NUM_PROMPTS, NUM_OUTCOMES = LOGITS_PxV.shape
BUDGET = int(COUNTS_P.sum())
DRAWS = 40_000


def _pi():
    z = np.exp(LOGITS_PxV - LOGITS_PxV.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def _target(correction):
    """sum_i w_i s_i grad log p_i, from the closed forms (grad log p of a softmax success set)."""
    pi = _pi()
    p = pi[:, 0]
    grad_log_p = (np.eye(NUM_OUTCOMES)[0] * pi - p[:, None] * pi) / p[:, None]  # (P, V)
    s = np.asarray(scale_factor(jnp.asarray(p), jnp.asarray(COUNTS_P), "maxrl"))
    w = np.asarray(effective_prompt_weights(s, COUNTS_P, correction=correction))
    return w[:, None] * grad_log_p


@pytest.fixture(scope="module")
def sampled_gradients():
    """Per-draw gradient of L = -sum_b w_b A_b log pi(y_b) w.r.t. the (P, V) logits, both weightings."""
    ids = prompt_ids_from_counts(jnp.asarray(COUNTS_P), BUDGET)
    logits = jnp.asarray(LOGITS_PxV, jnp.float32)

    def one_draw(key, correction):
        y = jax.random.categorical(key, logits[ids])
        rewards = (y == 0).astype(jnp.float32)
        adv = advantages(rewards, ids, NUM_PROMPTS, "maxrl")
        w = loss_weights(ids, NUM_PROMPTS, correction=correction)

        def loss(theta):
            logp = jax.nn.log_softmax(theta[ids])[jnp.arange(BUDGET), y]
            return -jnp.sum(w * adv * logp)

        return -jax.grad(loss)(logits)  # ascent direction

    keys = jax.random.split(jax.random.key(0), DRAWS)
    return {c: np.asarray(jax.jit(jax.vmap(lambda k: one_draw(k, c)))(keys)) for c in (True, False)}


@pytest.mark.parametrize("correction", [True, False])
def test_expected_gradient(sampled_gradients, correction):
    grads = sampled_gradients[correction]
    mean = grads.mean(0)
    stderr = grads.std(0) / np.sqrt(DRAWS)
    target = _target(correction)
    assert np.all(np.abs(mean - target) <= 5 * stderr + 1e-6), (mean, target, stderr)


def test_correction_matters(sampled_gradients):
    """The two targets differ by many standard errors, so the test above can fail."""
    grads = sampled_gradients[True]
    stderr = grads.std(0) / np.sqrt(DRAWS)
    gap = np.abs(_target(True) - _target(False))
    assert np.max(gap / (stderr + 1e-12)) > 20


def test_token_level_prompt_totals():
    ids = jnp.array([0, 0, 0, 1, 2, 2])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], jnp.float32)
    for agg in ("sequence_mean", "token_mean"):
        w = loss_weights(ids, 3, token_mask_BxR=mask, aggregation=agg)
        totals = jax.ops.segment_sum(jnp.sum(w, 1), ids, num_segments=3)
        np.testing.assert_allclose(totals, 1 / 3, rtol=1e-6)
        assert np.all(np.asarray(w)[np.asarray(mask) == 0] == 0)
    w_tok = loss_weights(ids, 3, token_mask_BxR=mask, aggregation="token_mean")
    np.testing.assert_allclose(w_tok[0, 0], 1 / (3 * 6))  # prompt 0 has 2 + 1 + 3 tokens
    w_sum = loss_weights(ids, 3, token_mask_BxR=mask, aggregation="sequence_sum")
    np.testing.assert_allclose(w_sum[0, :2], 1 / 9)  # 1 / (P N_0) on each token of the sequence
    verl = loss_weights(ids, 3, token_mask_BxR=mask, aggregation="token_mean", correction=False)
    np.testing.assert_allclose(verl, np.asarray(mask) / 12, rtol=1e-6)  # 12 response tokens in the batch


def test_bad_aggregation():
    ids = jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match="unknown aggregation"):
        loss_weights(ids, 1, aggregation="median")
    with pytest.raises(ValueError, match="needs token_mask_BxR"):
        loss_weights(ids, 1, aggregation="token_mean")
    with pytest.raises(ValueError, match="token_mask_BxR must have shape"):
        loss_weights(ids, 1, token_mask_BxR=jnp.ones((3, 2)))



def _compact(prompt_ids, keep):
    """The kept rows alone, their prompts renumbered 0..P_kept-1: an independent route to the masked formulas."""
    rows = np.flatnonzero(keep)
    kept_prompts, ids = np.unique(prompt_ids[rows], return_inverse=True)
    return rows, ids, len(kept_prompts)


@pytest.mark.parametrize("aggregation", ["sequence_sum", "sequence_mean", "token_mean", "token_mean_microbatch"])
@pytest.mark.parametrize("correction", [True, False])
def test_a_train_mask_weighs_the_kept_rollouts_as_a_batch_of_their_own(aggregation, correction):
    """With ``train_B`` the weights equal those of the kept rollouts alone (P -> P_kept, N_i -> kept of prompt i,
    B -> kept rollouts): DAPO's normalisation by the groups that train. Dropped rows weigh 0."""
    rng = np.random.default_rng(0)
    prompt_ids = rng.permutation(np.repeat(np.arange(5), [4, 3, 6, 2, 5]))  # non-contiguous groups
    keep = rng.random(prompt_ids.size) < 0.6
    keep[prompt_ids == 3] = False  # a prompt with nothing kept
    mask = (np.arange(7)[None, :] < rng.integers(1, 8, size=prompt_ids.size)[:, None]).astype(np.float32)
    got = np.asarray(loss_weights(jnp.asarray(prompt_ids), 5, token_mask_BxR=jnp.asarray(mask), aggregation=aggregation,
                                  correction=correction, train_B=jnp.asarray(keep, jnp.float32)))
    rows, ids, num_kept = _compact(prompt_ids, keep)
    want = np.asarray(loss_weights(jnp.asarray(ids), num_kept, token_mask_BxR=jnp.asarray(mask[rows]),
                                   aggregation=aggregation, correction=correction))
    np.testing.assert_allclose(got[rows], want, rtol=1e-6)
    assert np.all(got[~keep] == 0)
    np.testing.assert_allclose(got.sum(), want.sum(), rtol=1e-6)  # nothing weighs outside the kept rows
    everything = loss_weights(jnp.asarray(prompt_ids), 5, token_mask_BxR=jnp.asarray(mask), aggregation=aggregation,
                              correction=correction)
    np.testing.assert_allclose(np.asarray(loss_weights(jnp.asarray(prompt_ids), 5, token_mask_BxR=jnp.asarray(mask),
                                                       aggregation=aggregation, correction=correction,
                                                       train_B=jnp.ones(prompt_ids.size))),
                               np.asarray(everything), rtol=1e-6)


def test_a_train_mask_that_keeps_nothing_gives_zero_weights():
    ids = jnp.array([0, 0, 1, 1])
    w = loss_weights(ids, 2, train_B=jnp.zeros(4))
    assert np.all(np.asarray(w) == 0)
    with pytest.raises(ValueError, match="train_B"):
        loss_weights(ids, 2, train_B=jnp.zeros(3))


# The SERA authors' loss (verl's token-mean per micro-batch / gradient accumulation, advantages times N0 / N_i).
# B = 6 rows in 2 micro-batches of 3, P = 3 prompts of which prompt 1 has no rows: N_0 = 2, N_2 = 4, N0 = B / P = 2.
MB_IDS = np.array([0, 2, 2, 0, 2, 2])
MB_MASK = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], np.float32)  # R_b 2 1 3 1 2 0


def _microbatch_weights(correction, train_B=None, microbatch_rows=3):
    return np.asarray(loss_weights(jnp.asarray(MB_IDS), 3, token_mask_BxR=jnp.asarray(MB_MASK),
                                   aggregation="token_mean_microbatch", correction=correction,
                                   microbatch_rows=microbatch_rows,
                                   train_B=None if train_B is None else jnp.asarray(train_B, jnp.float32)))


@pytest.mark.parametrize("correction", [True, False])
def test_token_mean_microbatch_by_hand(correction):
    """M = 2 micro-batches with T = 2 + 1 + 3 = 6 and 1 + 2 + 0 = 3 tokens; c = N0 / N_i = 2/2 (prompt 0) and 2/4
    (prompt 2) with the correction, 1 without. w_bt = c_b m_bt / (M T_mb)."""
    c0, c2 = (1.0, 0.5) if correction else (1.0, 1.0)
    want_B = np.array([c0 / (2 * 6), c2 / (2 * 6), c2 / (2 * 6), c0 / (2 * 3), c2 / (2 * 3), c2 / (2 * 3)])
    got = _microbatch_weights(correction)
    np.testing.assert_allclose(got, want_B[:, None] * MB_MASK, rtol=1e-6)
    assert np.all(np.isfinite(got))  # prompt 1 has no rows
    if not correction:
        np.testing.assert_allclose(got.sum(), 1.0, rtol=1e-6)  # each micro-batch adds 1/M


def test_token_mean_microbatch_with_a_train_mask_by_hand():
    """Rows 3 and 4 dropped: B_kept = 4, P_kept = 2 (prompt 0 keeps row 0, prompt 2 rows 1, 2, 5), N0 = 4/2 = 2,
    c = 2/1 and 2/3; the first micro-batch keeps its 6 tokens, the second has none (weights 0, not NaN)."""
    train_B = [1, 1, 1, 0, 0, 1]
    want_B = np.array([2 / (2 * 6), (2 / 3) / (2 * 6), (2 / 3) / (2 * 6), 0, 0, 0])
    got = _microbatch_weights(True, train_B)
    np.testing.assert_allclose(got, want_B[:, None] * MB_MASK, rtol=1e-6)
    want_B = np.array([1 / (2 * 6)] * 3 + [0] * 3)  # uncorrected: c = 1 on the kept rows
    np.testing.assert_allclose(_microbatch_weights(False, train_B), want_B[:, None] * MB_MASK, rtol=1e-6)
    assert np.all(_microbatch_weights(True, np.zeros(6)) == 0)


def test_token_mean_microbatch_of_the_whole_batch():
    """One micro-batch (microbatch_rows 0 or B): uncorrected it is verl's batch token-mean (the uncorrected
    ``token_mean``); corrected, prompt i totals (1/P) (T_i / N_i) / (T / B), as the module docstring says."""
    rng = np.random.default_rng(1)
    ids = rng.permutation(np.repeat(np.array([0, 1, 3]), [5, 2, 1]))  # prompt 2 has no rows
    mask = (np.arange(6)[None, :] < rng.integers(0, 7, size=ids.size)[:, None]).astype(np.float32)
    mask[0, 0] = 1  # at least one token
    args = (jnp.asarray(ids), 4)
    verl = np.asarray(mask) / mask.sum()
    np.testing.assert_allclose(loss_weights(*args, token_mask_BxR=jnp.asarray(mask), aggregation="token_mean",
                                            correction=False), verl, rtol=1e-6)
    for rows in (0, ids.size):
        got = loss_weights(*args, token_mask_BxR=jnp.asarray(mask), aggregation="token_mean_microbatch",
                           correction=False, microbatch_rows=rows)
        np.testing.assert_allclose(got, verl, rtol=1e-6)
        got = np.asarray(loss_weights(*args, token_mask_BxR=jnp.asarray(mask), aggregation="token_mean_microbatch",
                                      microbatch_rows=rows))
        for i, n_i in zip([0, 1, 3], [5, 2, 1]):
            tokens_i = mask[ids == i].sum()
            np.testing.assert_allclose(got[ids == i].sum(), (tokens_i / n_i) / (mask.sum() / ids.size) / 4, rtol=1e-6)


def test_token_mean_microbatch_bad_rows():
    for rows in (4, -3, 1.5, True):  # 4 does not divide B = 6
        with pytest.raises(ValueError, match="microbatch_rows"):
            _microbatch_weights(True, microbatch_rows=rows)


def test_token_mean_microbatch_jits_with_static_rows():
    jitted = jax.jit(loss_weights, static_argnames=("num_prompts", "aggregation", "correction", "microbatch_rows"))
    for rows in (0, 2, 3):
        for train_B in (None, jnp.asarray([1, 1, 1, 0, 0, 1], jnp.float32)):
            got = jitted(jnp.asarray(MB_IDS), num_prompts=3, token_mask_BxR=jnp.asarray(MB_MASK),
                         aggregation="token_mean_microbatch", microbatch_rows=rows, train_B=train_B)
            want = _microbatch_weights(True, train_B, microbatch_rows=rows)
            np.testing.assert_allclose(got, want, rtol=1e-6)
            assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(jitted(jnp.asarray(MB_IDS), num_prompts=3, token_mask_BxR=jnp.asarray(MB_MASK),
                                      aggregation="token_mean_microbatch", microbatch_rows=3),
                               np.array([1 / 12, 1 / 24, 1 / 24, 1 / 6, 1 / 12, 0])[:, None] * MB_MASK, rtol=1e-6)


def test_a_prompt_without_rollouts_weighs_nothing_whatever_its_scale():
    """Counts [0, 2, 6]: the prompt with no rollouts has no row in the loss, so its expected weight is 0 even when
    handed a nonzero scale (an older ``s(p, 0) = 1 - 1/(1-p)``, or any factor computed without the counts)."""
    s_P = jnp.asarray([0.7, 0.5, 0.9])
    counts_P = jnp.asarray([0, 2, 6])
    np.testing.assert_allclose(effective_prompt_weights(s_P, counts_P, correction=True), [0, 0.5 / 3, 0.9 / 3])
    np.testing.assert_allclose(effective_prompt_weights(s_P, counts_P, correction=False), [0, 2 * 0.5 / 8, 6 * 0.9 / 8])
    np.testing.assert_array_equal(effective_prompt_weights(s_P, jnp.zeros(3, jnp.int32), correction=False), 0.0)


def test_effective_prompt_weights_refuse_counts_that_are_not_counts():
    with pytest.raises(ValueError, match=r"counts_P must have shape \(P,\) = \(3,\) like scales_P"):
        effective_prompt_weights(jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match=r"counts_P must be >= 0"):
        effective_prompt_weights(jnp.ones(2), jnp.asarray([2, -1]))


@pytest.mark.parametrize("ids", [[0, 0, 1, 3], [0, -1, 1, 2]])
def test_loss_weights_refuse_prompt_ids_outside_the_prompts(ids):
    """A prompt id past P used to get weight 1 / (P * 0) = inf."""
    ids = jnp.asarray(ids)
    match = r"prompt_ids_B must lie in \[0, num_prompts\) = \[0, 3\)"
    for call in (lambda: loss_weights(ids, 3), lambda: rollout_weights(ids, 3),
                 lambda: loss_weights(ids, 3, token_mask_BxR=jnp.ones((4, 2)), aggregation="token_mean"),
                 lambda: loss_weights(ids, 3, train_B=jnp.ones(4))):
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(ValueError, match="train_B must be a 0/1 mask"):
        loss_weights(jnp.asarray([0, 1]), 2, train_B=jnp.asarray([1.0, 2.0]))
    with pytest.raises(ValueError, match="num_prompts must be >= 1"):
        loss_weights(jnp.asarray([0, 1]), 0)
