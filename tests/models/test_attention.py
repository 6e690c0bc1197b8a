"""Tests of sera_jax.models.attention: the span mask against enumeration, the dense reference against a
NumPy softmax, every implementation that runs on CPU (blockwise; cuDNN's span mapping through XLA's
``dot_product_attention``; Pallas TPU flash in interpret mode) equal to dense in values and in gradients
w.r.t. q, k, v, a memory bound that fails if blockwise stores (Q, S) arrays, which implementation "auto"
picks where, and the decoder with blockwise attention equal to the decoder with dense attention."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sera_jax.models import attention as A
from sera_jax.models import decoder as D


def random_inputs(seed, b, q_len, s_len, n_heads=4, n_kv=2, d=8, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, q_len, n_heads, d)), dtype)
    k = jnp.asarray(rng.standard_normal((b, n_kv, s_len, d)), dtype)
    v = jnp.asarray(rng.standard_normal((b, n_kv, s_len, d)), dtype)
    cotangent = jnp.asarray(rng.standard_normal((b, q_len, n_heads, d)), jnp.float32)
    return q, k, v, cotangent


def sequence_spans(prompt_len, prompt_lengths, response_lengths):
    """Spans of [left-padded prompt | right-padded response] rows (as rl.step.sequence_batch lays them)."""
    start = prompt_len - np.asarray(prompt_lengths)
    return jnp.asarray(start, jnp.int32), jnp.asarray(prompt_len + np.asarray(response_lengths), jnp.int32)


def value_and_grads(implementation, cotangent, kv_start, kv_end, offset, **kwargs):
    """Jitted (q, k, v) -> (out, (dq, dk, dv)) of <cotangent, attention(q, k, v)>; the cotangent is zeroed
    on rows that see no key (their outputs are implementation-defined, and nothing reads them)."""
    q_len = cotangent.shape[1]

    def fn(q, k, v, offset):
        seen_BxQ = ~A.empty_rows(kv_start, kv_end, offset, q_len)
        ct = cotangent * seen_BxQ[:, :, None, None]

        def loss(q, k, v):
            out = A.attention(q, k, v, kv_start, kv_end, offset, implementation=implementation, **kwargs)
            return jnp.sum(ct * out.astype(jnp.float32)), out

        (_, out), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
        return out, grads, seen_BxQ

    if isinstance(offset, int):
        return lambda q, k, v: jax.jit(lambda q, k, v: fn(q, k, v, offset))(q, k, v)
    return lambda q, k, v: jax.jit(fn)(q, k, v, offset)


def assert_matches_dense(got, ref, atol):
    out, grads, seen = got
    ref_out, ref_grads, _ = ref
    seen = np.asarray(seen)
    np.testing.assert_allclose(np.asarray(out)[seen], np.asarray(ref_out)[seen], atol=atol, rtol=atol)
    for g, r, name in zip(grads, ref_grads, "qkv"):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=atol, rtol=atol,
                                   err_msg=f"d{name}")
    return np.asarray(out)[~seen]


# --- the span mask and the dense reference, against enumeration ------------------------------------

def test_span_mask_and_empty_rows_enumerate_the_rule():
    start, end = np.array([0, 3, 5, 4, 2]), np.array([9, 7, 6, 4, 0])  # full, both pads, one key, empty x2
    for offset in (0, 2):
        mask = np.asarray(A.span_mask(jnp.asarray(start), jnp.asarray(end), offset, 6, 9))
        empty = np.asarray(A.empty_rows(jnp.asarray(start), jnp.asarray(end), offset, 6))
        for b in range(5):
            for i in range(6):
                expected = [start[b] <= s < end[b] and s <= offset + i for s in range(9)]
                assert mask[b, i].tolist() == expected, (offset, b, i)
                assert empty[b, i] == (not any(expected))


def test_kv_spans_from_valid():
    valid = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]], bool)
    start, end, contiguous = map(np.asarray, A.kv_spans_from_valid(jnp.asarray(valid)))
    assert start.tolist() == [0, 2, 4, 5, 0] and end.tolist() == [5, 4, 5, 0, 3]
    assert contiguous.tolist() == [True, True, True, True, False]


def test_dense_matches_numpy_softmax():
    """The reference itself: per (row, head, query) a float64 softmax over the visible slots by enumeration;
    rows that see nothing average all S values (float32's minimum everywhere: a uniform softmax)."""
    q, k, v, _ = random_inputs(0, 3, 6, 9, n_heads=4, n_kv=2)
    start, end, offset = np.array([0, 4, 5]), np.array([9, 8, 2]), 2
    out = np.asarray(A.attention(q, k, v, jnp.asarray(start), jnp.asarray(end), offset, implementation="dense"))
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    for b in range(3):
        for h in range(4):
            m = h // 2  # query head h reads KV head h // groups
            for i in range(6):
                slots = [s for s in range(9) if start[b] <= s < end[b] and s <= offset + i]
                if slots:
                    scores = np.array([qn[b, i, h] @ kn[b, m, s] for s in slots]) * 8**-0.5
                    p = np.exp(scores - scores.max())
                    expected = (p / p.sum()) @ vn[b, m, slots]
                else:
                    expected = vn[b, m].mean(0)
                np.testing.assert_allclose(out[b, i, h], expected, atol=1e-5)


# --- blockwise == dense ----------------------------------------------------------------------------

# Full sequences: [left-padded prompt of 20 | right-padded response of 17], L = 37, prompt lengths 20, 9, 1
# and 4 with responses 17, 5, 0 and 12: a full row, padding on both sides, a row with a single valid key,
# and one more; plus a row with an empty span (start 20 > end 0 after the clip, nothing valid).
FULL_START, FULL_END = sequence_spans(20, [20, 9, 1, 4], [17, 5, 0, 12])
FULL_START = jnp.concatenate([FULL_START, jnp.array([20], jnp.int32)])
FULL_END = jnp.concatenate([FULL_END, jnp.array([0], jnp.int32)])


@pytest.mark.parametrize("blocks", [dict(block_q=16, block_k=8), dict(block_q=5, block_k=16), {}],
                         ids=["q16_k8", "q5_k16", "default_one_block"])
def test_blockwise_equals_dense_on_full_sequences(blocks):
    """Q = S = 37 is a multiple of no block (padded inside); GQA with 2 query heads per KV head."""
    q, k, v, ct = random_inputs(1, 5, 37, 37)
    ref = value_and_grads("dense", ct, FULL_START, FULL_END, 0)(q, k, v)
    got = value_and_grads("blockwise", ct, FULL_START, FULL_END, 0, **blocks)(q, k, v)
    empty_out = assert_matches_dense(got, ref, atol=2e-5)
    assert empty_out.size and not empty_out.any()  # rows that see nothing: 0 (finite)


def test_blockwise_equals_dense_against_a_cache():
    """A chunk of Q = 5 queries written at slot 7 of a 23-slot cache (a static offset), and one decoding
    step (Q = 1) at a traced write index with key blocks of 4 (block_q=1 keeps them at 4): the blocks past
    the write index are skipped."""
    q, k, v, ct = random_inputs(2, 3, 5, 23, n_heads=6, n_kv=2)
    start, end = jnp.array([0, 3, 7], jnp.int32), jnp.array([23, 23, 12], jnp.int32)
    ref = value_and_grads("dense", ct, start, end, 7)(q, k, v)
    assert_matches_dense(value_and_grads("blockwise", ct, start, end, 7, block_q=2, block_k=4)(q, k, v), ref, 2e-5)

    q1, ct1 = q[:, :1], ct[:, :1]
    for write_index in (jnp.int32(12), jnp.int32(3)):
        ref = value_and_grads("dense", ct1, start, end, write_index)(q1, k, v)
        got = value_and_grads("blockwise", ct1, start, end, write_index, block_q=1, block_k=4)(q1, k, v)
        assert_matches_dense(got, ref, 2e-5)


def test_blockwise_bfloat16_is_close_to_dense():
    q, k, v, ct = random_inputs(3, 4, 37, 37, dtype=jnp.bfloat16)
    ref = value_and_grads("dense", ct, FULL_START[:4], FULL_END[:4], 0)(q, k, v)
    got = value_and_grads("blockwise", ct, FULL_START[:4], FULL_END[:4], 0, block_q=16, block_k=8)(q, k, v)
    assert got[0].dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in got[1])
    assert_matches_dense(got, ref, atol=6e-2)


def test_blockwise_memory_is_not_quadratic():
    """Forward + backward at B=2, A=4, Q=S=1024, D=64 (compiled, not run): blockwise must allocate less
    than a quarter of dense's temporaries (dense keeps float32 (B, A, Q, S) scores and probabilities)."""
    b, length, heads, d = 2, 1024, 4, 64
    q = jax.ShapeDtypeStruct((b, length, heads, d), jnp.float32)
    kv = jax.ShapeDtypeStruct((b, 2, length, d), jnp.float32)
    start, end = jnp.zeros((b,), jnp.int32), jnp.full((b,), length, jnp.int32)

    def train(implementation, **kwargs):
        def fn(q, k, v):
            loss = lambda q, k, v: jnp.sum(A.attention(q, k, v, start, end, 0, implementation=implementation,
                                                       **kwargs) ** 2)
            return jax.grad(loss, (0, 1, 2))(q, k, v)
        return fn

    dense = A.temp_bytes(train("dense"), q, kv, kv)
    blockwise = A.temp_bytes(train("blockwise", block_q=128, block_k=128), q, kv, kv)
    scores = b * heads * length * length * 4
    assert dense >= scores  # the reference really materialises (Q, S)
    assert blockwise < dense / 4, (blockwise, dense)


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_blockwise_sharded_equals_unsharded(axis_type):
    """Rows split over the 8 forced CPU devices (the flat rollout axis is the data axis), on meshes of
    both axis types sharding.make_mesh builds."""
    start, end = sequence_spans(12, [12, 5, 1, 8, 3, 12, 7, 2], [9, 0, 9, 4, 6, 1, 9, 3])
    q, k, v, ct = random_inputs(6, 8, 21, 21)
    fn = value_and_grads("blockwise", ct, start, end, 0, block_q=8, block_k=8)
    kind = {"auto": jax.sharding.AxisType.Auto, "explicit": jax.sharding.AxisType.Explicit}[axis_type]
    mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,))
    rows = jax.sharding.NamedSharding(mesh, jax.P("data"))
    sharded = fn(*(jax.device_put(x, rows) for x in (q, k, v)))
    assert sharded[0].sharding.spec[0] == "data"
    for got, ref in zip(jax.tree.leaves(sharded), jax.tree.leaves(fn(q, k, v))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=1e-5)


# --- the other implementations' span mappings -------------------------------------------------------

def test_cudnn_mapping_equals_dense():
    """cuDNN needs a GPU; its span mapping (rows rotated by kv_start, right-padding lengths, causal) runs
    through XLA's ``dot_product_attention`` here, values and gradients."""
    q, k, v, ct = random_inputs(4, 5, 37, 37)

    def via_xla(q, k, v):
        out = A.cudnn_attention(q, k, v, FULL_START, FULL_END, sdpa_implementation="xla")
        return jnp.where(A.empty_rows(FULL_START, FULL_END, 0, 37)[:, :, None, None], 0.0, out)

    seen = ~A.empty_rows(FULL_START, FULL_END, 0, 37)
    masked_ct = ct * seen[:, :, None, None]
    loss = lambda fn: jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(masked_ct * fn(q, k, v)), (0, 1, 2)))
    dense = lambda q, k, v: A.attention(q, k, v, FULL_START, FULL_END, 0, implementation="dense")
    got, ref = loss(via_xla)(q, k, v), loss(dense)(q, k, v)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(via_xla(q, k, v))[np.asarray(seen)],
                               np.asarray(dense(q, k, v))[np.asarray(seen)], atol=2e-5)


def test_pallas_tpu_interpret_equals_dense():
    """JAX's Pallas TPU flash kernel in interpret mode on CPU (L = 37 padded to 128 inside)."""
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu", reason="this JAX has no Pallas TPU")
    if not hasattr(pltpu, "force_tpu_interpret_mode"):
        pytest.skip("this JAX cannot interpret TPU kernels on CPU (no pltpu.force_tpu_interpret_mode)")
    q, k, v, ct = random_inputs(5, 5, 37, 37)
    ref = value_and_grads("dense", ct, FULL_START, FULL_END, 0)(q, k, v)
    with pltpu.force_tpu_interpret_mode():
        got = value_and_grads("pallas_tpu", ct, FULL_START, FULL_END, 0)(q, k, v)
    empty_out = assert_matches_dense(got, ref, atol=3e-5)
    assert not empty_out.any()


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_pallas_tpu_on_a_mesh_runs_per_device_and_equals_dense(axis_type):
    """On a mesh the kernel runs under shard_map (the compiler cannot partition a Mosaic kernel), interpreted:
    6 rows placed over "model" and 4 query heads (2 KV heads) over "data"; values and gradients equal dense.
    Explicit axes: the shard_map splits rows and heads as the types say; automatic: as _kernel_layout picks
    (rows over the axes that divide B, "data"; then heads, "model"), the compiler resharding the inputs into
    it. 4 of the 8 CPU devices: the interpreter's per-kernel barrier across devices deadlocks on 8 (XLA:CPU
    runs fewer device programs at once on 2 cores)."""
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu", reason="this JAX has no Pallas TPU")
    if not hasattr(pltpu, "force_tpu_interpret_mode"):
        pytest.skip("this JAX cannot interpret TPU kernels on CPU (no pltpu.force_tpu_interpret_mode)")
    start = jnp.concatenate([FULL_START, jnp.array([3], jnp.int32)])  # FULL's 5 rows and one more
    end = jnp.concatenate([FULL_END, jnp.array([30], jnp.int32)])
    q, k, v, ct = random_inputs(7, 6, 37, 37)
    kind = {"auto": jax.sharding.AxisType.Auto, "explicit": jax.sharding.AxisType.Explicit}[axis_type]
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(kind, kind), devices=jax.devices()[:4])
    on = lambda *spec: jax.sharding.NamedSharding(mesh, jax.P(*spec))
    args = (jax.device_put(q, on("model", None, "data")), jax.device_put(k, on("model", "data")),
            jax.device_put(v, on("model", "data")))
    ref = value_and_grads("dense", ct, start, end, 0)(q, k, v)
    fn = value_and_grads("pallas_tpu", ct, start, end, 0)
    with pltpu.force_tpu_interpret_mode():
        got = fn(*args)
        jaxpr = str(jax.make_jaxpr(fn)(*args))
    split = "P('model', 'data')" if axis_type == "explicit" else "P('data', 'model')"
    assert "shard_map" in jaxpr and split in jaxpr, jaxpr[:3000]
    assert not assert_matches_dense(got, ref, atol=3e-5).any()


# --- choosing an implementation --------------------------------------------------------------------

def test_auto_and_fallbacks():
    pick = A.resolve_implementation
    bf16, f32 = jnp.bfloat16, jnp.float32
    assert pick("auto", 64, 64, f32, 64, 0, backend="cpu") == "blockwise"
    assert pick("auto", 64, 64, f32, 64, 0, backend="tpu") == "pallas_tpu"
    assert pick("auto", 1, 64, f32, 64, jnp.int32(5), backend="tpu") == "blockwise"  # decoding step
    assert pick("auto", 64, 64, bf16, 64, 0, backend="gpu") == "cudnn"
    assert pick("auto", 64, 64, f32, 64, 0, backend="gpu") == "blockwise"  # cuDNN flash: half precision
    assert pick("auto", 64, 64, bf16, 60, 0, backend="gpu") == "blockwise"  # head_dim not a multiple of 8
    assert pick("auto", 8, 64, bf16, 64, 0, backend="gpu") == "blockwise"  # prefill into a larger cache
    assert pick("cudnn", 1, 64, bf16, 64, 3, backend="gpu") == "blockwise"
    assert pick("pallas_tpu", 64, 64, f32, 64, jnp.int32(0), backend="tpu") == "blockwise"  # traced offset
    assert pick("dense", 1, 64, f32, 64, 3) == "dense"
    assert pick("auto", 64, 64, f32, 192, 0, backend="tpu") == "blockwise"  # the kernel's head_dim limit
    with pytest.raises(ValueError, match="cudnn"):
        pick("cudnn", 64, 64, f32, 64, 0, backend="gpu")
    q, k, v, _ = random_inputs(0, 2, 4, 4)
    with pytest.raises(ValueError, match="implementation='flash'"):
        A.attention(q, k, v, jnp.zeros(2, jnp.int32), jnp.full(2, 4, jnp.int32), implementation="flash")
    with pytest.raises(ValueError, match="block_k"):
        A.attention(q, k, v, jnp.zeros(2, jnp.int32), jnp.full(2, 4, jnp.int32), block_k=0)
    with pytest.raises(ValueError, match="DecoderConfig.attention='flash'"):
        D.tiny(attention="flash")
    with pytest.raises(ValueError, match="DecoderConfig.attention_block_q"):
        D.tiny(attention_block_q=-1)



@pytest.mark.parametrize("implementation", ["auto", "dense", "blockwise"])
@pytest.mark.parametrize("q_len, s_len", [(0, 4), (4, 0), (0, 0)])
def test_an_empty_sequence_is_a_value_error(implementation, q_len, s_len):
    """Q = 0 or S = 0 was a ZeroDivisionError (blockwise block sizes) or a reduction error; now it is named."""
    q, k, v, _ = random_inputs(0, 2, q_len, s_len)
    with pytest.raises(ValueError, match=f"empty sequence.*Q={q_len}.*S={s_len}"):
        A.attention(q, k, v, jnp.zeros(2, jnp.int32), jnp.full(2, s_len, jnp.int32), implementation=implementation)


def test_lowering_for_resolves_auto_as_the_target_platform_would():
    """Inside ``lowering_for(p)`` "auto" picks p's kernel on this CPU machine (what ``plan --platform`` lowers)."""
    bf16, f32 = jnp.bfloat16, jnp.float32
    assert A.target_platform() == "cpu" and A.resolve_implementation("auto", 64, 64, bf16, 64) == "blockwise"
    with A.lowering_for("tpu"):
        assert A.target_platform() == "tpu"
        assert A.resolve_implementation("auto", 64, 64, f32, 64) == "pallas_tpu"
        assert A.resolve_implementation("auto", 1, 64, f32, 64, jnp.int32(5)) == "blockwise"  # decoding
        with A.lowering_for("cuda"):
            assert A.resolve_implementation("auto", 64, 64, bf16, 64) == "cudnn"
            assert A.resolve_implementation("auto", 64, 64, f32, 64) == "blockwise"  # cuDNN: half precision
        assert A.target_platform() == "tpu"
    assert A.target_platform() == "cpu"
    with pytest.raises(ValueError, match="platform='metal'"):
        with A.lowering_for("metal"):
            pass


def _dot_operand_dtypes(fn, *args):
    (eqn,) = [e for e in jax.make_jaxpr(fn)(*args).eqns if e.primitive.name == "dot_general"]
    return tuple(v.aval.dtype for v in eqn.invars), eqn.outvars[0].aval.dtype


def test_f32_einsum_upcasts_low_precision_operands_only_on_cpu():
    """XLA:CPU has no BF16 x BF16 = F32 dot: on CPU the operands are upcast (exactly: a bf16 product fits
    f32), elsewhere the mixed-precision dot is kept."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5)), jnp.bfloat16)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((5, 4)), jnp.bfloat16)
    f32 = jnp.dtype(jnp.float32)
    assert _dot_operand_dtypes(lambda x, y: A.f32_einsum("ij,jk->ik", x, y), a, b) == ((f32, f32), f32)
    with A.lowering_for("tpu"):
        assert _dot_operand_dtypes(lambda x, y: A.f32_einsum("ij,jk->ik", x, y), a, b) == (
            (jnp.dtype(jnp.bfloat16),) * 2, f32)
    with A.compile_only():  # the planner's memory plans: the accelerator's dot, compiled on CPU and never run
        assert _dot_operand_dtypes(lambda x, y: A.f32_einsum("ij,jk->ik", x, y), a, b) == (
            (jnp.dtype(jnp.bfloat16),) * 2, f32)
        jax.jit(lambda x, y: A.f32_einsum("ij,jk->ik", x, y)).lower(a, b).compile()  # XLA:CPU compiles it
    assert A.cpu_workarounds()
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)  # products of bf16 values are exact in f32
    np.testing.assert_allclose(A.f32_einsum("ij,jk->ik", a, b), exact, rtol=1e-6, atol=1e-6)


# --- the decoder with each implementation ----------------------------------------------------------

def test_decoder_blockwise_equals_dense():
    """Logits at valid positions and the gradient of a log-prob loss, on [left-padded prompt | right-padded
    response] rows, with blocks of 4 (several query and key blocks over L = 13) and with the default."""
    dense_cfg = D.tiny(vocab_size=24, attention="dense", qk_norm=True)
    state = nnx.state(D.random_decoder(dense_cfg, seed=3))
    tokens = jax.random.randint(jax.random.key(0), (4, 13), 0, 24)
    start, end = sequence_spans(7, [7, 3, 1, 5], [6, 2, 6, 0])
    col = jnp.arange(13)
    valid = (col[None] >= start[:, None]) & (col[None] < end[:, None])
    positions = D.positions_from_valid(valid)

    def logits_and_grads(cfg):
        """The same parameters under ``cfg`` (only the attention fields differ): logits and the gradient."""
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0))))

        @jax.jit
        def fn(state):
            def loss(state):
                m = nnx.merge(graphdef, state)
                return -jnp.sum(D.token_logprobs(m, tokens, positions, valid)), m(tokens, positions, valid)
            (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(state)
            return logits, grads
        return fn(state)

    ref_logits, ref_grads = logits_and_grads(dense_cfg)
    mask = np.asarray(valid)
    for blocks in (dict(attention_block_q=4, attention_block_k=4), {}):
        logits, grads = logits_and_grads(dataclasses.replace(dense_cfg, attention="blockwise", **blocks))
        np.testing.assert_allclose(np.asarray(logits)[mask], np.asarray(ref_logits)[mask], atol=2e-5)
        for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=1e-4)


def test_decoder_needs_contiguous_valid_tokens():
    model = D.random_decoder(D.tiny(vocab_size=24), seed=0)
    tokens = jnp.zeros((2, 6), jnp.int32)
    holes = np.array([[1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 0]], bool)
    with pytest.raises(ValueError, match=r"rows \[1\] have holes"):
        model(tokens, None, holes)
    graphdef, state = nnx.split(model)
    logits = jax.jit(lambda st, v: nnx.merge(graphdef, st)(tokens, None, v))(state, jnp.asarray(holes))
    assert np.isfinite(np.asarray(logits[0])).all() and np.isnan(np.asarray(logits[1])).all()
    with pytest.raises(ValueError, match="kv_start_B"):
        model.decode(tokens, tokens, D.init_cache(model.cfg, 2, 6), 0, jnp.asarray(holes))
