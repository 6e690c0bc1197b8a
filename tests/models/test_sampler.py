"""Tests of the KV-cache sampler against repeated full forward passes (no cache), exact softmax and nucleus
probabilities (Monte Carlo with stated tolerances), stop-token handling and sharded == unsharded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sera_jax.models import decoder as D
from sera_jax.models import sampler as S

VOCAB = 12
PAD = 0
N_NEW = 6
B = 16  # 2 rows per device on the 8 forced CPU devices
CFG = D.tiny(vocab_size=VOCAB)


def make_model(cfg: D.DecoderConfig, seed: int) -> D.Decoder:
    """Random parameters (0.3 N(0, 1); norm scales 1 + 0.3 N(0, 1)) without compiling initializers."""
    model = nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)

    def fill(x):
        return jnp.asarray(0.3 * rng.standard_normal(x.shape) + (x.ndim == 1), x.dtype)

    nnx.update(model, jax.tree.map(fill, nnx.state(model, nnx.Param)))
    return model


@pytest.fixture(scope="module")
def setup():
    model = make_model(CFG, seed=0)
    graphdef, state = nnx.split(model)
    # Three left-padded prompts of lengths 5, 3, 1 (PAD in front).
    prompts = jnp.array([[3, 4, 5, 6, 7], [PAD, PAD, 8, 9, 10], [PAD, PAD, PAD, PAD, 11]], jnp.int32)
    lengths = jnp.array([5, 3, 1], jnp.int32)
    ids = jnp.array([0, 1, 2, 0, 0, 1, 2, 2, 0, 1, 1, 0, 2, 2, 0, 1], jnp.int32)  # uneven counts
    fn = S.make_sample_fn(graphdef, max_new_tokens=N_NEW, pad_id=PAD)
    greedy_fn = S.make_sample_fn(graphdef, max_new_tokens=N_NEW, pad_id=PAD, greedy=True)

    @jax.jit
    def logits_fn(state, tokens_BxL, valid_BxL):
        """Full forward without a cache (the reference): logits (B, L, V)."""
        model = nnx.merge(graphdef, state)
        return model(tokens_BxL, D.positions_from_valid(valid_BxL), valid_BxL)

    @jax.jit
    def logprobs_fn(state, tokens_BxL, valid_BxL):
        model = nnx.merge(graphdef, state)
        return D.token_logprobs(model, tokens_BxL, D.positions_from_valid(valid_BxL), valid_BxL)

    return dict(graphdef=graphdef, state=state, prompts=prompts, lengths=lengths, ids=ids, fn=fn,
                greedy_fn=greedy_fn, logits_fn=logits_fn, logprobs_fn=logprobs_fn)


def reference_sequences(s, tokens_BxR, mask_BxR):
    """Full rows (left-padded prompt + response) and their validity, for the reference forward."""
    rows = np.asarray(s["prompts"])[np.asarray(s["ids"])]
    valid = rows != PAD
    return (jnp.asarray(np.concatenate([rows, np.asarray(tokens_BxR)], 1)),
            jnp.asarray(np.concatenate([valid, np.asarray(mask_BxR)], 1)))


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def greedy_reference(s, stop_tokens=()):
    """Greedy decoding by a full forward over the whole prefix at every step."""
    tp = s["prompts"].shape[1]
    tokens = np.full((B, N_NEW), PAD, np.int32)
    mask = np.zeros((B, N_NEW), bool)
    done = np.zeros(B, bool)
    for t in range(N_NEW):
        seq, valid = reference_sequences(s, tokens, mask)
        logits = np.asarray(s["logits_fn"](s["state"], seq, valid))[:, tp - 1 + t]
        nxt = logits.argmax(-1)
        tokens[~done, t] = nxt[~done]
        mask[~done, t] = True
        done = done | np.isin(nxt, stop_tokens)
    return tokens, mask


def call(s, key=0, temperature=1.0, stop=(), ids=None, greedy=False):
    """The shared jitted sampler (``greedy``: its greedy twin); stop sets are padded with -1 to two entries so
    shapes never change."""
    ids = s["ids"] if ids is None else ids
    stop = tuple(stop) + (-1,) * (2 - len(stop))
    fn = s["greedy_fn" if greedy else "fn"]
    return fn(s["state"], s["prompts"], s["lengths"], ids, jax.random.key(key), jnp.float32(temperature),
              jnp.asarray(stop, jnp.int32))


def test_greedy_equals_argmax_of_full_forwards(setup):
    out = call(setup, greedy=True)
    ref_tokens, _ = greedy_reference(setup)
    np.testing.assert_array_equal(out.tokens_BxR, ref_tokens)
    assert out.mask_BxR.all() and (out.lengths_B == N_NEW).all() and not out.finished_B.any()
    assert (out.logp_sample_BxR == 0).all()  # a greedy draw is deterministic
    # Rows that share a prompt share the greedy answer.
    for p in range(3):
        rows = np.asarray(out.tokens_BxR)[np.asarray(setup["ids"]) == p]
        assert (rows == rows[0]).all()


def test_stop_tokens_end_rows(setup):
    greedy, _ = greedy_reference(setup)
    # A stop token that some rows emit after their first step and other rows never emit.
    candidates = [v for v in range(VOCAB)
                  if np.isin(v, greedy[:, 1:]).any() and not np.isin(greedy, v).any(axis=1).all()]
    assert candidates, "the random model's greedy outputs admit no informative stop token"
    stop = (candidates[0],)
    out = call(setup, greedy=True, stop=stop)
    ref_tokens, ref_mask = greedy_reference(setup, stop_tokens=stop)
    np.testing.assert_array_equal(out.tokens_BxR, ref_tokens)
    np.testing.assert_array_equal(out.mask_BxR, ref_mask)
    for b in range(B):
        row, hits = greedy[b], np.flatnonzero(np.isin(greedy[b], stop))
        end = hits[0] + 1 if len(hits) else N_NEW
        assert int(out.lengths_B[b]) == end and bool(out.finished_B[b]) == bool(len(hits))
        np.testing.assert_array_equal(out.tokens_BxR[b, :end], row[:end])
        assert (out.tokens_BxR[b, end:] == PAD).all() and not out.mask_BxR[b, end:].any()
        assert (out.logp_policy_BxR[b, end:] == 0).all()
    assert out.finished_B.any() and not out.finished_B.all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_full_forward(setup, temperature):
    tp = setup["prompts"].shape[1]
    out = call(setup, key=1, temperature=temperature, stop=(1, 2))
    seq, valid = reference_sequences(setup, out.tokens_BxR, out.mask_BxR)
    logits = np.asarray(setup["logits_fn"](setup["state"], seq, valid))[:, tp - 1 : tp - 1 + N_NEW]
    tokens = np.asarray(out.tokens_BxR)[..., None]
    policy = np.take_along_axis(log_softmax(logits), tokens, -1)[..., 0]
    sampling = np.take_along_axis(log_softmax(logits / temperature), tokens, -1)[..., 0]
    mask = np.asarray(out.mask_BxR)
    np.testing.assert_allclose(out.logp_policy_BxR, np.where(mask, policy, 0), atol=1e-4)
    np.testing.assert_allclose(out.logp_sample_BxR, np.where(mask, sampling, 0), atol=1e-4)
    # The policy log-probs are what D.token_logprobs recomputes from the full rows.
    recomputed = setup["logprobs_fn"](setup["state"], seq, valid)
    np.testing.assert_allclose(out.logp_policy_BxR, np.asarray(recomputed)[:, tp:], atol=1e-4)


def test_counts_change_without_recompiling(setup):
    call(setup, key=2)
    size = setup["fn"]._cache_size()
    other_ids = jnp.array([0] * 10 + [1] * 5 + [2], jnp.int32)  # a different allocation, same B
    out = call(setup, key=2, ids=other_ids)
    assert setup["fn"]._cache_size() == size
    assert out.tokens_BxR.shape == (B, N_NEW)


def test_jitted_is_the_function_a_call_runs_and_exports(setup):
    """SampleFn.jitted: the jax.jit function a call with these arguments runs (chosen by their layout alone, so
    abstract arguments get the same one), the one jax.export takes; check=True is the run-time-checked twin."""
    fn = setup["fn"]
    args = (setup["state"], setup["prompts"], setup["lengths"], setup["ids"], jax.random.key(4), jnp.float32(1.0),
            jnp.asarray((-1, -1), jnp.int32))
    out = fn(*args)
    size = fn._cache_size()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    jitted = fn.jitted(*abstract)
    assert jitted is fn.jitted(*args) and jitted is not fn.jitted(*args, check=True)
    again = jitted(*args)
    assert fn._cache_size() == size  # the call's own compiled program
    np.testing.assert_array_equal(again.tokens_BxR, out.tokens_BxR)
    exported = jax.export.export(jitted, platforms=["cpu"])(*abstract)
    assert exported.out_avals[0].shape == (B, N_NEW)


# --- sampling distributions (Monte Carlo) ----------------------------------------------------------

N_MC = 2048  # rows per prompt in the Monte Carlo tests


@pytest.fixture(scope="module")
def first_token_logits(setup):
    """Exact next-token logits after each prompt (from the reference full forward), shape (3, V).
    Uses the (B, T + N) reference shape with an empty response: causal, so only the prompt matters."""
    empty = np.zeros((B, N_NEW), bool)
    seq, valid = reference_sequences(setup, np.full((B, N_NEW), PAD), empty)
    logits = np.asarray(setup["logits_fn"](setup["state"], seq, valid))[:, setup["prompts"].shape[1] - 1]
    ids = np.asarray(setup["ids"])
    return np.stack([logits[np.flatnonzero(ids == p)[0]] for p in range(3)])


def assert_frequencies_match(tokens_N, probs_V):
    """Each token's frequency within 5 binomial standard deviations (+ 1/N) of its probability."""
    freq = np.bincount(tokens_N, minlength=len(probs_V)) / len(tokens_N)
    tol = 5 * np.sqrt(probs_V * (1 - probs_V) / len(tokens_N)) + 1.0 / len(tokens_N)
    assert (np.abs(freq - probs_V) <= tol).all(), (freq, probs_V)


def nucleus(probs_V, top_p):
    """Top-p set: sort by probability; keep a token iff the mass strictly before it is < top_p."""
    order = np.argsort(-probs_V, kind="stable")
    before = np.cumsum(probs_V[order]) - probs_V[order]
    keep = np.zeros(len(probs_V), bool)
    keep[order[before < top_p]] = True
    return keep


@pytest.mark.parametrize("top_p,temperature", [(1.0, 0.7), (0.6, 1.0)])
def test_sampling_frequencies(setup, first_token_logits, top_p, temperature):
    """First-token frequencies over N_MC rows per prompt. Temperature only: many calls of the shared
    B-row sampler (no new compilation); top-p needs its own compilation, so it samples 2 N_MC rows at once."""
    if top_p == 1.0:
        fn, rows_per_call, calls = setup["fn"], B, 2 * N_MC // B
    else:
        fn = S.make_sample_fn(setup["graphdef"], max_new_tokens=1, top_p=top_p, pad_id=PAD)
        rows_per_call, calls = 2 * N_MC, 1
    ids = jnp.arange(rows_per_call, dtype=jnp.int32) % 2  # prompts 0 and 1, half the rows each
    outs = [fn(setup["state"], setup["prompts"], setup["lengths"], ids, jax.random.key(100 + i),
               jnp.float32(temperature), jnp.array([-1, -1], jnp.int32)) for i in range(calls)]
    tokens = np.concatenate([np.asarray(o.tokens_BxR[:, 0]) for o in outs])
    logp_policy = np.concatenate([np.asarray(o.logp_policy_BxR[:, 0]) for o in outs])
    logp_sample = np.concatenate([np.asarray(o.logp_sample_BxR[:, 0]) for o in outs])
    prompt = np.tile(np.asarray(ids), calls)
    for p in range(2):
        logits = first_token_logits[p]
        probs = np.exp(log_softmax(logits / temperature))
        keep = nucleus(probs, top_p)
        if top_p < 1:
            assert 1 < keep.sum() < VOCAB, "the test needs a nucleus that is neither one token nor all"
        target = np.where(keep, probs, 0) / probs[keep].sum()
        rows = prompt == p
        assert rows.sum() == N_MC
        assert keep[tokens[rows]].all(), "a token outside the nucleus was sampled"
        assert_frequencies_match(tokens[rows], target)
        # Log-probs: policy = raw softmax; sampling = renormalised nucleus at this temperature.
        np.testing.assert_allclose(logp_policy[rows], log_softmax(logits)[tokens[rows]], atol=1e-5)
        np.testing.assert_allclose(logp_sample[rows], np.log(target[tokens[rows]]), atol=1e-5)


# --- sharding --------------------------------------------------------------------------------------

def test_sharded_sampling_equals_unsharded(setup):
    mesh = jax.make_mesh((8,), ("data",))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    state_sharding = jax.tree.map(lambda _: rep, setup["state"])
    fn = S.make_sample_fn(
        setup["graphdef"], max_new_tokens=N_NEW, pad_id=PAD,
        in_shardings=(state_sharding, rep, rep, rows, rep, rep, rep),
        out_shardings=S.SampleOutput(*([rows] * len(S.SampleOutput._fields))),
    )
    args = (setup["state"], setup["prompts"], setup["lengths"], setup["ids"], jax.random.key(4), jnp.float32(1.0),
            jnp.array([1, 2], jnp.int32))
    sharded, plain = fn(*args), setup["fn"](*args)
    assert sharded.tokens_BxR.sharding.spec == P("data")
    np.testing.assert_array_equal(sharded.tokens_BxR, plain.tokens_BxR)
    np.testing.assert_array_equal(sharded.mask_BxR, plain.mask_BxR)
    np.testing.assert_allclose(sharded.logp_policy_BxR, plain.logp_policy_BxR, atol=1e-5)
    np.testing.assert_allclose(sharded.logp_sample_BxR, plain.logp_sample_BxR, atol=1e-5)


# --- small pieces ----------------------------------------------------------------------------------

def test_left_align():
    right = jnp.array([[5, 6, 0, 0], [7, 8, 9, 1], [4, 0, 0, 0]])
    np.testing.assert_array_equal(S.left_align(right, jnp.array([2, 4, 1])), [[0, 0, 5, 6], [7, 8, 9, 1], [0, 0, 0, 4]])


def test_bad_arguments_raise(setup):
    with pytest.raises(ValueError, match="max_new_tokens"):
        S.sample(setup["graphdef"], setup["state"], setup["prompts"], setup["lengths"], setup["ids"],
                 jax.random.key(0), max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        S.sample(setup["graphdef"], setup["state"], setup["prompts"], setup["lengths"], setup["ids"],
                 jax.random.key(0), max_new_tokens=2, top_p=0.0)


@pytest.mark.parametrize("lengths,index,value", [([5, 0, 1], 1, 0), ([5, 3, 6], 2, 6), ([-1, 3, 1], 0, -1)])
def test_bad_prompt_lengths_are_named_before_any_work(setup, lengths, index, value):
    """T = 5 here: a length of 0, above T or negative used to be sampled silently."""
    bad = jnp.asarray(lengths, jnp.int32)
    message = rf"prompt_lengths_P must be in \[1, T=5\].*prompt_lengths_P\[{index}\]={value}"
    with pytest.raises(ValueError, match=message):
        setup["fn"](setup["state"], setup["prompts"], bad, setup["ids"], jax.random.key(0), jnp.float32(1.0),
                    jnp.asarray([-1, -1], jnp.int32))
    with pytest.raises(ValueError, match=rf"prompt_lengths_P\[{index}\]={value}"):
        S.sample(setup["graphdef"], setup["state"], setup["prompts"], bad, setup["ids"], jax.random.key(0),
                 max_new_tokens=N_NEW)
    with pytest.raises(ValueError, match="prompt_lengths_P must be integers"):
        S.sample(setup["graphdef"], setup["state"], setup["prompts"], bad.astype(jnp.float32), setup["ids"],
                 jax.random.key(0), max_new_tokens=N_NEW)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_temperature_must_be_positive_greedy_is_asked_for(setup, temperature):
    with pytest.raises(ValueError, match="temperature must be finite and > 0.*greedy=True"):
        call(setup, temperature=temperature)
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        S.sample(setup["graphdef"], setup["state"], setup["prompts"], setup["lengths"], setup["ids"],
                 jax.random.key(0), temperature, max_new_tokens=N_NEW)


def test_traced_bad_values_fail_at_run_time(setup):
    """Under the caller's jit the lengths and temperature are only known when the program runs: the run-time
    check raises the same message then (one compile: both values are arguments)."""
    fn = jax.jit(lambda lengths, t: S.sample(setup["graphdef"], setup["state"], setup["prompts"], lengths,
                                             setup["ids"], jax.random.key(0), t, max_new_tokens=1, num_slots=1))
    good = fn(setup["lengths"], jnp.float32(1.0))
    assert good.mask_BxR.all()
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"prompt_lengths_P\[2\]=0"):
        jax.block_until_ready(fn(jnp.asarray([5, 3, 0], jnp.int32), jnp.float32(1.0)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="temperature must be finite and > 0"):
        jax.block_until_ready(fn(setup["lengths"], jnp.float32(0.0)))


# --- slot refill: results are a function of (key, inputs), not of slots, order or implementation -----

STOPS = (1, 2)  # frequent enough in the random model that rollouts end at different steps


def sample_with(s, key=5, temperature=1.0, stop=STOPS, **kwargs):
    """``S.sample`` jitted with extra static keywords (slots, tile, attention; pending order traced)."""
    order = kwargs.pop("pending_order_B", None)
    fn = jax.jit(lambda st, order: S.sample(s["graphdef"], st, s["prompts"], s["lengths"], s["ids"],
                                            jax.random.key(key), jnp.float32(temperature), jnp.asarray(stop, jnp.int32),
                                            max_new_tokens=N_NEW, pad_id=PAD, pending_order_B=order, **kwargs))
    return fn(s["state"], order)


def assert_same_samples(a, b):
    np.testing.assert_array_equal(a.tokens_BxR, b.tokens_BxR)
    np.testing.assert_array_equal(a.mask_BxR, b.mask_BxR)
    np.testing.assert_array_equal(a.lengths_B, b.lengths_B)
    np.testing.assert_array_equal(a.finished_B, b.finished_B)
    np.testing.assert_allclose(a.logp_policy_BxR, b.logp_policy_BxR, atol=1e-5)
    np.testing.assert_allclose(a.logp_sample_BxR, b.logp_sample_BxR, atol=1e-5)


@pytest.fixture(scope="module")
def all_slots(setup):
    """Every rollout in its own slot (no refill): the comparison point of the refill tests."""
    out = sample_with(setup)
    lengths = np.asarray(out.lengths_B)
    assert out.finished_B.any() and lengths.min() < lengths.max(), "the test needs rollouts of different lengths"
    return out


@pytest.mark.parametrize("num_slots,prompt_tile", [(5, None), (1, None), (3, 2)])
def test_refill_does_not_change_samples(setup, all_slots, num_slots, prompt_tile):
    assert_same_samples(sample_with(setup, num_slots=num_slots, prompt_tile=prompt_tile), all_slots)


def test_pending_order_does_not_change_samples(setup, all_slots):
    order = jnp.asarray(np.random.default_rng(0).permutation(B), jnp.int32)
    assert_same_samples(sample_with(setup, num_slots=4, pending_order_B=order), all_slots)


@pytest.mark.parametrize("attention", ["batched", "dense"])
def test_attention_implementations_agree(setup, all_slots, attention):
    assert_same_samples(sample_with(setup, num_slots=6, attention=attention), all_slots)


def test_refill_logprobs_equal_teacher_forcing(setup):
    """With 3 slots for 16 rollouts (rings wrap, slots change prompts), every recorded log-prob equals the
    full forward's on the sampled rows, and the recorded lengths/mask/finished flags match the tokens."""
    tp = setup["prompts"].shape[1]
    out = sample_with(setup, key=9, temperature=0.8, num_slots=3)
    seq, valid = reference_sequences(setup, out.tokens_BxR, out.mask_BxR)
    logits = np.asarray(setup["logits_fn"](setup["state"], seq, valid))[:, tp - 1 : tp - 1 + N_NEW]
    tokens, mask = np.asarray(out.tokens_BxR), np.asarray(out.mask_BxR)
    policy = np.take_along_axis(log_softmax(logits), tokens[..., None], -1)[..., 0]
    sampling = np.take_along_axis(log_softmax(logits / 0.8), tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.logp_policy_BxR, np.where(mask, policy, 0), atol=1e-4)
    np.testing.assert_allclose(out.logp_sample_BxR, np.where(mask, sampling, 0), atol=1e-4)
    recomputed = np.asarray(setup["logprobs_fn"](setup["state"], seq, valid))[:, tp:]
    np.testing.assert_allclose(out.logp_policy_BxR, recomputed, atol=1e-4)
    lengths = np.asarray(out.lengths_B)
    np.testing.assert_array_equal(mask.sum(1), lengths)
    for b in range(B):
        hits = np.flatnonzero(np.isin(tokens[b, : lengths[b]], STOPS))
        assert bool(out.finished_B[b]) == (len(hits) > 0)
        assert (len(hits) == 0 and lengths[b] == N_NEW) or (len(hits) == 1 and hits[0] == lengths[b] - 1)
        assert (tokens[b, lengths[b]:] == PAD).all()


def test_refill_greedy_equals_argmax_of_full_forwards(setup):
    greedy, _ = greedy_reference(setup)
    stop = (int(greedy[0, 2]),)  # row 0 (and its prompt's other rows) stop at step 3 at the latest
    out = sample_with(setup, greedy=True, stop=stop, num_slots=4)
    ref_tokens, ref_mask = greedy_reference(setup, stop_tokens=stop)
    np.testing.assert_array_equal(out.tokens_BxR, ref_tokens)
    np.testing.assert_array_equal(out.mask_BxR, ref_mask)


def test_sharded_refill_equals_unsharded(setup, all_slots):
    mesh = jax.make_mesh((8,), ("data",))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    fn = S.make_sample_fn(
        setup["graphdef"], max_new_tokens=N_NEW, pad_id=PAD, num_slots=8,
        in_shardings=(jax.tree.map(lambda _: rep, setup["state"]), rep, rep, rows, rep, rep, rep),
        out_shardings=S.SampleOutput(*([rows] * len(S.SampleOutput._fields))))
    out = fn(setup["state"], setup["prompts"], setup["lengths"], setup["ids"], jax.random.key(5), jnp.float32(1.0),
             jnp.asarray(STOPS, jnp.int32))
    assert out.tokens_BxR.sharding.spec == P("data")
    assert_same_samples(out, all_slots)


def test_default_prompt_tile():
    assert [S.default_prompt_tile(s, p) for s, p in [(64, 64), (256, 16), (512, 256), (16, 3), (7, 9)]] == \
        [1, 16, 2, 4, 1]


def test_bad_slot_arguments_raise(setup):
    args = (setup["graphdef"], setup["state"], setup["prompts"], setup["lengths"], setup["ids"], jax.random.key(0))
    with pytest.raises(ValueError, match="num_slots"):
        S.sample(*args, max_new_tokens=2, num_slots=0)
    with pytest.raises(ValueError, match="prompt_tile"):
        S.sample(*args, max_new_tokens=2, prompt_tile=0)
    with pytest.raises(ValueError, match="implementation"):
        S.sample(*args, max_new_tokens=2, attention="flash")


def test_sharded_refill_on_an_auto_mesh_splits_the_slots(setup, all_slots):
    """On a mesh with automatic axes (the project's default; the slots get sharding constraints there, see the
    planner's figures for their memory effect) the samples are those of one device."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))
    fn = S.make_sample_fn(setup["graphdef"], max_new_tokens=N_NEW, pad_id=PAD, num_slots=8)
    ids = jax.device_put(setup["ids"], rows)
    args = (setup["state"], setup["prompts"], setup["lengths"], ids, jax.random.key(5), jnp.float32(1.0),
            jnp.asarray(STOPS, jnp.int32))
    assert_same_samples(fn(*args), all_slots)


# --- rollouts keyed by (prompt, rank): common random numbers across calls ---------------------------------------

def call_ranked(s, ids, offset=None, key=11, fn=None):
    """The shared sampler on rows ``ids`` (16 of them: no new shape), with ``rank_offset_P`` as the 8th argument."""
    args = (s["state"], s["prompts"], s["lengths"], jnp.asarray(ids, jnp.int32), jax.random.key(key), jnp.float32(1.0),
            jnp.asarray(STOPS, jnp.int32))
    offset = jnp.zeros(3, jnp.int32) if offset is None else jnp.asarray(offset, jnp.int32)
    return (fn or s["fn"])(*args, offset)


def rows_of(out, ids, prompt):
    """(tokens, mask, logp_policy) of ``prompt``'s rows in row order: its rollouts by rank."""
    rows = np.flatnonzero(np.asarray(ids) == prompt)
    return tuple(np.asarray(x)[rows] for x in (out.tokens_BxR, out.mask_BxR, out.logp_policy_BxR))


def assert_same_ranks(a, ids_a, b, ids_b, prompt, ranks_a, ranks_b):
    for x, y in zip(rows_of(a, ids_a, prompt), rows_of(b, ids_b, prompt)):
        np.testing.assert_allclose(x[ranks_a], y[ranks_b], atol=1e-5, err_msg=f"prompt {prompt}")


def test_rollout_j_of_prompt_i_is_the_same_whatever_else_the_call_holds(setup):
    """Counts (2, 3) and (4, 1) for prompts 0 and 1 (prompt 2 fills the 16 rows, placed first in one call and
    last in the other; prompt 0's rows not contiguous): the same key gives the same rollout for every
    (prompt, rank) both calls hold, although the rows sit at other positions."""
    ids_a = [0, 0, 1, 1, 1] + [2] * 11
    ids_b = [2] * 11 + [0, 1, 0, 0, 0]
    a, b = call_ranked(setup, ids_a), call_ranked(setup, ids_b)
    assert_same_ranks(a, ids_a, b, ids_b, 0, slice(0, 2), slice(0, 2))
    assert_same_ranks(a, ids_a, b, ids_b, 1, slice(0, 1), slice(0, 1))
    assert_same_ranks(a, ids_a, b, ids_b, 2, slice(0, 11), slice(0, 11))
    # The rollouts themselves differ (prompt 2's 11 are not copies of one): the check can fail.
    assert len({tuple(r) for r in rows_of(a, ids_a, 2)[0]}) > 3
    # Seven arguments: the offset defaults to 0.
    assert_same_samples(call(setup, key=11, stop=STOPS, ids=jnp.asarray(ids_a, jnp.int32)), a)


def test_rank_offset_continues_the_ranks_of_an_earlier_call(setup):
    """A pilot-like call of 2 rollouts for prompts 0 and 1, then a call with rank_offset_P = (2, 2, 12): its rows are
    ranks 2 and 3 of prompts 0 and 1 (and 12.. of prompt 2) of one call that draws 4 of each at once."""
    ids_once = [0] * 4 + [1] * 4 + [2] * 8
    ids_split = [0] * 2 + [1] * 2 + [2] * 12
    once = call_ranked(setup, ids_once)
    first, second = call_ranked(setup, ids_split), call_ranked(setup, ids_split, offset=(2, 2, 12))
    for prompt in (0, 1):
        assert_same_ranks(first, ids_split, once, ids_once, prompt, slice(0, 2), slice(0, 2))
        assert_same_ranks(second, ids_split, once, ids_once, prompt, slice(0, 2), slice(2, 4))
    assert_same_ranks(first, ids_split, once, ids_once, 2, slice(0, 8), slice(0, 8))
    assert not np.array_equal(rows_of(first, ids_split, 2)[0], rows_of(second, ids_split, 2)[0])


def test_rank_offset_on_a_mesh_and_bad_offsets(setup):
    """``in_shardings`` for the seven arguments also serve a call with ``rank_offset_P`` (laid out like the
    prompt lengths), with the samples of one device; a bad offset is a ValueError naming it."""
    mesh = jax.make_mesh((8,), ("data",))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    fn = S.make_sample_fn(setup["graphdef"], max_new_tokens=N_NEW, pad_id=PAD,
                          in_shardings=(jax.tree.map(lambda _: rep, setup["state"]), rep, rep, rows, rep, rep, rep),
                          out_shardings=S.SampleOutput(*([rows] * len(S.SampleOutput._fields))))
    ids = [0, 0, 1, 1, 1] + [2] * 11
    assert_same_samples(call_ranked(setup, ids, offset=(3, 0, 5), fn=fn), call_ranked(setup, ids, offset=(3, 0, 5)))
    with pytest.raises(ValueError, match=r"rank_offset_P must be 3 integers"):
        call_ranked(setup, ids, offset=(1, 2))
    with pytest.raises(ValueError, match=r"rank_offset_P must be >= 0, got rank_offset_P\[1\]=-1"):
        call_ranked(setup, ids, offset=(0, -1, 0))


def test_rollout_ranks():
    ids = jnp.asarray([2, 0, 2, 1, 0, 2], jnp.int32)
    np.testing.assert_array_equal(S.rollout_ranks(ids, 3), [0, 0, 1, 0, 1, 2])


# --- the stages of ``S.sample``, called one by one ------------------------------------------------------------

STOP = 2
V_STAGE, R_STAGE, B_STAGE = 8, 3, 8


def forced_logits(tokens) -> jnp.ndarray:
    """One row of logits per entry, its token +50 above the rest: no Gumbel draw (noise of size ~ a few) picks
    another."""
    return jnp.asarray(50.0 * np.eye(V_STAGE)[np.asarray(tokens)], jnp.float32)


def stage_decoding(prompt_tokens=(STOP, 5), **over) -> S.Decoding:
    """A ``Decoding`` for the draw and refill stages (no model): B_STAGE rollouts alternating between 2 prompts,
    each prompt's prefill logits forcing ``prompt_tokens[i]`` as its first token."""
    ids = jnp.asarray(np.arange(B_STAGE) % 2, jnp.int32)
    fields = dict(model=None, prompt_ids_B=ids, order_B=jnp.argsort(ids, stable=True).astype(jnp.int32),
                  row_keys_B=S.rollout_keys(jax.random.key(0), ids, 2), prompt_lengths_P=jnp.asarray([2, 1], jnp.int32),
                  pad_P=jnp.asarray([0, 1], jnp.int32), prompt_logits_PxV=forced_logits(prompt_tokens),
                  temperature=jnp.float32(1.0), stop_ids=jnp.asarray([STOP], jnp.int32), top_p=1.0, greedy=False,
                  max_new_tokens=R_STAGE, num_slots=4, tile=1, attention="auto", layout=S.SlotLayout.of(None))
    return S.Decoding(**{**fields, **over})


def test_prefill_gives_each_prompts_next_token_logits_and_padding(setup):
    """Stage 1 alone: the prompts' next-token logits equal the full forward's at each prompt's last token."""
    fn = jax.jit(lambda state: S.prefill(nnx.merge(setup["graphdef"], state), setup["prompts"], setup["lengths"],
                                         S.SlotLayout.of(None)))
    logits_PxV, cache_P, pad_P = fn(setup["state"])
    np.testing.assert_array_equal(pad_P, [0, 2, 4])
    full = setup["logits_fn"](setup["state"], setup["prompts"], setup["prompts"] != PAD)
    np.testing.assert_allclose(logits_PxV, np.asarray(full)[:, -1], atol=1e-5)
    assert len(cache_P.k) == CFG.n_layers and cache_P.k[0].shape[0] == 3


def test_rollout_keys_are_keyed_by_prompt_and_rank():
    ids, offset = jnp.asarray([1, 0, 1, 1], jnp.int32), jnp.asarray([3, 0], jnp.int32)
    keys = S.rollout_keys(jax.random.key(4), ids, 2, offset)
    for row, (i, j) in enumerate([(1, 0), (0, 3), (1, 1), (1, 2)]):  # prompt 0 starts at rank 3
        want = jax.random.fold_in(jax.random.fold_in(jax.random.key(4), i), j)
        np.testing.assert_array_equal(jax.random.key_data(keys[row]), jax.random.key_data(want))


def test_draw_tokens_records_by_rollout_and_ends_rollouts():
    """The draw of four slots: a stop token ends rollout 3 at length 1 (finished); the R-th token ends rollout 7
    (truncated); an invalid slot writes nothing; rollout 5 runs on. Permuting the slots changes no record."""
    dec = stage_decoding()
    roll_S, t_S = jnp.asarray([3, 7, B_STAGE, 5], jnp.int32), jnp.asarray([0, 2, 1, 1], jnp.int32)
    valid_S = jnp.asarray([True, True, False, True])
    logits_SxV = forced_logits([STOP, 5, 4, 6])
    token_S, ended_S, drawn = S.draw_tokens(dec, logits_SxV, roll_S, t_S, valid_S, S.empty_drawn(B_STAGE, R_STAGE, PAD))
    np.testing.assert_array_equal(token_S, [STOP, 5, 4, 6])
    np.testing.assert_array_equal(ended_S, [True, True, False, False])
    tokens = np.full((B_STAGE, R_STAGE), PAD)
    tokens[3, 0], tokens[7, 2], tokens[5, 1] = STOP, 5, 6
    np.testing.assert_array_equal(drawn.tokens_BxR, tokens)
    np.testing.assert_array_equal(drawn.lengths_B, [0, 0, 0, 1, 0, 0, 0, 3])
    np.testing.assert_array_equal(drawn.finished_B, np.arange(B_STAGE) == 3)
    written = tokens != PAD
    np.testing.assert_allclose(np.asarray(drawn.logp_policy_BxR)[written], 0.0, atol=1e-6)  # log(~1)
    assert not np.asarray(drawn.logp_policy_BxR)[~written].any()
    out = S.finish(drawn)
    np.testing.assert_array_equal(out.mask_BxR, np.arange(R_STAGE)[None] < np.asarray(drawn.lengths_B)[:, None])
    # Noisier logits, so the noise decides: a rollout's token t is its own draw, whichever slot runs it.
    logits_SxV = jax.random.normal(jax.random.key(1), (4, V_STAGE))
    perm = np.array([2, 0, 3, 1])
    a = S.draw_tokens(dec, logits_SxV, roll_S, t_S, valid_S, S.empty_drawn(B_STAGE, R_STAGE, PAD))[2]
    b = S.draw_tokens(dec, logits_SxV[perm], roll_S[perm], t_S[perm], valid_S[perm],
                      S.empty_drawn(B_STAGE, R_STAGE, PAD))[2]
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_refill_slots_starts_the_next_pending_rollouts_in_order():
    """Slot 0 runs on; free slots 1 and 2 take the last two pending rollouts (order_B[6], order_B[7]) and draw
    their first token from their prompt's prefill logits: prompt 1 forces a stop (its rollout ends at once and
    leaves the slot free), prompt 0 a 5; slot 3 finds nothing pending."""
    dec = stage_decoding(order_B=jnp.arange(B_STAGE, dtype=jnp.int32)[::-1], prompt_tokens=(5, STOP))
    slots = S.Slots(roll_S=jnp.asarray([4, B_STAGE, 6, B_STAGE], jnp.int32), t_S=jnp.asarray([2, 0, 3, 0], jnp.int32),
                    token_S=jnp.asarray([7, 0, 3, 0], jnp.int32), active_S=jnp.asarray([True, False, False, False]),
                    next_i=jnp.int32(6))
    slots, drawn = S.refill_slots(dec, slots, S.empty_drawn(B_STAGE, R_STAGE, PAD))
    # order_B[6] = 1 (prompt 1) and order_B[7] = 0 (prompt 0)
    np.testing.assert_array_equal(slots.roll_S, [4, 1, 0, B_STAGE])
    np.testing.assert_array_equal(slots.t_S, [2, 1, 1, 0])
    np.testing.assert_array_equal(slots.token_S, [7, STOP, 5, 0])
    np.testing.assert_array_equal(slots.active_S, [True, False, True, False])
    assert int(slots.next_i) == B_STAGE
    np.testing.assert_array_equal(np.asarray(drawn.tokens_BxR)[[1, 0], 0], [STOP, 5])
    np.testing.assert_array_equal(drawn.lengths_B, [0, 1] + [0] * (B_STAGE - 2))
    np.testing.assert_array_equal(drawn.finished_B, np.arange(B_STAGE) == 1)
    assert (np.asarray(drawn.tokens_BxR)[2:] == PAD).all()


def test_the_stages_composed_step_by_step_give_the_samplers_result(setup):
    """prefill -> empty_slots -> refill_slots -> decode_step while still_decoding -> finish, one jitted decoding
    step at a time from Python, equals ``S.sample`` (3 slots for 16 rollouts: slots are refilled in the loop)."""
    graphdef, prompts, lengths, ids = setup["graphdef"], setup["prompts"], setup["lengths"], setup["ids"]
    key, temperature, stops, num_slots = jax.random.key(5), jnp.float32(1.0), jnp.asarray(STOPS, jnp.int32), 3
    layout = S.SlotLayout.of(None)

    def decoding(state, logits_PxV, pad_P):
        return S.Decoding(model=nnx.merge(graphdef, state), prompt_ids_B=ids,
                          order_B=jnp.argsort(ids, stable=True).astype(jnp.int32),
                          row_keys_B=S.rollout_keys(key, ids, 3), prompt_lengths_P=lengths, pad_P=pad_P,
                          prompt_logits_PxV=logits_PxV, temperature=temperature, stop_ids=stops, top_p=1.0,
                          greedy=False, max_new_tokens=N_NEW, num_slots=num_slots,
                          tile=S.default_prompt_tile(num_slots, 3), attention="auto", layout=layout)

    @jax.jit
    def start(state):
        model = nnx.merge(graphdef, state)
        logits_PxV, cache_P, pad_P = S.prefill(model, prompts, lengths, layout)
        slots, caches = S.empty_slots(model.cfg, cache_P, logits_PxV, num_slots=num_slots, batch=B,
                                      max_new_tokens=N_NEW, layout=layout)
        slots, drawn = S.refill_slots(decoding(state, logits_PxV, pad_P), slots, S.empty_drawn(B, N_NEW, PAD))
        return logits_PxV, pad_P, (jnp.int32(0), slots, caches, drawn)

    step = jax.jit(lambda state, logits_PxV, pad_P, carry: S.decode_step(decoding(state, logits_PxV, pad_P), carry))
    going = jax.jit(lambda state, logits_PxV, pad_P, carry: S.still_decoding(decoding(state, logits_PxV, pad_P),
                                                                             carry))
    logits_PxV, pad_P, carry = start(setup["state"])
    steps = 0
    while going(setup["state"], logits_PxV, pad_P, carry):
        carry = step(setup["state"], logits_PxV, pad_P, carry)
        steps += 1
    assert int(carry[0]) == steps and steps >= N_NEW  # each iteration counts itself; 16 rollouts need refills
    assert_same_samples(S.finish(carry[3]), sample_with(setup, num_slots=num_slots))
