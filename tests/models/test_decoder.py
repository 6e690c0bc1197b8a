"""Tests of the Llama/Qwen-style decoder: a NumPy re-implementation of Hugging Face's forward pass, KV-cache
decoding == full forward, GQA == explicitly repeated KV heads, padding invariance, parameter counts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sera_jax.models import decoder as D

LOGICAL_AXES = {"vocab", "embed", "mlp", "q_heads", "kv_heads", "head_dim", "norm"}


def make_model(cfg: D.DecoderConfig, seed: int) -> D.Decoder:
    """A decoder with random parameters: 0.3 N(0, 1), and 1 + 0.3 N(0, 1) for the 1-D norm scales, so
    biases and norm scales are not trivial. Built abstractly and filled from NumPy, which avoids compiling
    one random initializer per parameter shape (seconds each on a busy 2-core CI machine)."""
    model = nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)

    def fill(x):
        return jnp.asarray(0.3 * rng.standard_normal(x.shape) + (x.ndim == 1), x.dtype)

    nnx.update(model, jax.tree.map(fill, nnx.state(model, nnx.Param)))
    return model


def params_np(model: D.Decoder) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


# --- NumPy reference, transcribing HF modeling_llama / qwen2 / qwen3 ------------------------------

def hf_rms_norm(x, weight, eps):
    variance = np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return np.concatenate([-x2, x1], axis=-1)


def hf_forward(p: dict, cfg: D.DecoderConfig, input_ids, position_ids, attention_mask):
    """HF-style forward in float64 with (B, heads, L, head_dim) tensors and repeat_kv, causal mask by index
    plus key padding mask. Returns logits (B, L, V)."""
    b, t = input_ids.shape
    h = p["embed"][input_ids].astype(np.float64)
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim))
    freqs = position_ids[..., None] * inv_freq  # (B, L, hd/2)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None], np.sin(emb)[:, None]  # (B, 1, L, hd)
    allowed = np.tril(np.ones((t, t), bool))[None] & attention_mask[:, None, :].astype(bool)
    allowed = allowed[:, None]  # (B, 1, L, L)
    n_rep = cfg.n_heads // cfg.n_kv_heads
    for layer in range(cfg.n_layers):
        blk = p["blocks"][layer]
        a = blk["attn"]
        x = hf_rms_norm(h, blk["attn_norm"]["scale"], cfg.rms_eps)
        # torch Linear weight (out, in) == our kernel (in, heads, hd) reshaped and transposed.
        q_w = a["q_proj"].reshape(cfg.d_model, -1).T
        k_w = a["k_proj"].reshape(cfg.d_model, -1).T
        v_w = a["v_proj"].reshape(cfg.d_model, -1).T
        q, k, v = x @ q_w.T, x @ k_w.T, x @ v_w.T
        if cfg.qkv_bias:
            q, k, v = q + a["q_bias"].reshape(-1), k + a["k_bias"].reshape(-1), v + a["v_bias"].reshape(-1)
        q = q.reshape(b, t, cfg.n_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        k = k.reshape(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        if cfg.qk_norm:
            q = hf_rms_norm(q, a["q_norm"]["scale"], cfg.rms_eps)
            k = hf_rms_norm(k, a["k_norm"]["scale"], cfg.rms_eps)
        q = q * cos + hf_rotate_half(q) * sin
        k = k * cos + hf_rotate_half(k) * sin
        k = np.repeat(k, n_rep, axis=1)  # repeat_kv: head h reads kv head h // n_rep
        v = np.repeat(v, n_rep, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) * cfg.head_dim**-0.5
        scores = np.where(allowed, scores, np.finfo(np.float32).min)  # HF's min_dtype fill
        scores = scores - scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        out = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        o_w = a["o_proj"].reshape(-1, cfg.d_model).T  # (out=d_model, in=heads*hd)
        h = h + out @ o_w.T
        m = blk["mlp"]
        x = hf_rms_norm(h, blk["mlp_norm"]["scale"], cfg.rms_eps)
        gate = x @ m["gate_proj"]
        h = h + ((gate / (1 + np.exp(-gate))) * (x @ m["up_proj"])) @ m["down_proj"]
    h = hf_rms_norm(h, p["final_norm"]["scale"], cfg.rms_eps)
    head = p["embed"].T if cfg.tie_embeddings else p["lm_head"]
    return h @ head


VARIANTS = {
    "qwen2": D.tiny(vocab_size=40, qkv_bias=True),
    "qwen3": D.tiny(vocab_size=40, qkv_bias=False, qk_norm=True),
    "llama_untied": D.tiny(vocab_size=40, qkv_bias=False, tie_embeddings=False, n_kv_heads=1, rope_theta=500.0),
}


@pytest.fixture(scope="module")
def models():
    return {name: make_model(cfg, seed=10 + i) for i, (name, cfg) in enumerate(VARIANTS.items())}


@pytest.fixture(scope="module")
def forward():
    """One jitted full forward per model structure: f(graphdef, state, tokens, positions, valid)."""
    @jax.jit(static_argnums=4)
    def f(state, tokens, positions, valid, graphdef):
        return nnx.merge(graphdef, state)(tokens, positions, valid)

    def call(model, tokens, positions=None, valid=None):
        graphdef, state = nnx.split(model)
        b, t = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(t), (b, t)) if positions is None else positions
        valid = jnp.ones((b, t), bool) if valid is None else valid
        return f(state, tokens, positions, valid, graphdef)

    return call


def batch(seed, b, t, vocab=40):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, vocab)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_numpy_reference_of_hf(models, forward, name):
    model, cfg = models[name], VARIANTS[name]
    tokens = batch(0, 3, 9)
    valid = np.ones((3, 9), bool)
    valid[1, 6:] = False  # right padding
    valid[2, :3] = False  # left padding
    positions = np.asarray(D.positions_from_valid(jnp.asarray(valid)))
    got = np.asarray(forward(model, tokens, jnp.asarray(positions), jnp.asarray(valid)))
    ref = hf_forward(params_np(model), cfg, np.asarray(tokens), positions, valid)
    np.testing.assert_allclose(got[valid], ref[valid], atol=2e-4, rtol=2e-4)


def test_kv_cache_decoding_equals_full_forward(models, forward):
    model = models["qwen2"]
    cfg = model.cfg
    tokens = batch(1, 3, 9)
    full = np.asarray(forward(model, tokens))
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(graphdef, state)
        cache = D.init_cache(cfg, 3, 11)  # spare slots at the end must not matter
        start, end = jnp.zeros((3,), jnp.int32), jnp.full((3,), 9, jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(9), (3, 9))
        prefill, cache = m.decode(tokens[:, :5], pos[:, :5], cache, 0, start, end)
        chunk, cache = m.decode(tokens[:, 5:8], pos[:, 5:8], cache, 5, start)  # kv_end defaults to S
        step, cache = m.decode(tokens[:, 8:], pos[:, 8:], cache, jnp.int32(8), start, end)  # traced index
        return jnp.concatenate([prefill, chunk, step], axis=1), cache

    incremental, cache = run(state, tokens)
    np.testing.assert_allclose(np.asarray(incremental), full, atol=1e-5, rtol=1e-5)
    assert len(cache.k) == cfg.n_layers and cache.k[0].shape == (3, cfg.n_kv_heads, 11, cfg.head_dim)
    assert not np.asarray(cache.k[0][:, :, 9:]).any()  # unwritten slots untouched


def test_gqa_equals_repeated_kv_heads(models, forward):
    gqa = models["qwen2"]
    cfg = gqa.cfg
    groups = cfg.n_heads // cfg.n_kv_heads
    assert groups > 1
    mha = make_model(dataclasses.replace(cfg, n_kv_heads=cfg.n_heads), seed=0)
    p = nnx.to_pure_dict(nnx.state(gqa, nnx.Param))
    for blk in p["blocks"].values():
        a = blk["attn"]
        # Query head h reads KV head h // groups, so repeat each KV head `groups` times in place.
        for name, axis in [("k_proj", 1), ("v_proj", 1), ("k_bias", 0), ("v_bias", 0)]:
            a[name] = jnp.repeat(a[name], groups, axis=axis)
    nnx.update(mha, p)
    tokens = batch(2, 3, 9)
    np.testing.assert_allclose(np.asarray(forward(mha, tokens)), np.asarray(forward(gqa, tokens)), atol=1e-5)


def test_padding_invariance(models, forward):
    model = models["qwen3"]
    seq, junk = batch(3, 1, 9), batch(4, 1, 3)
    # Row 0: the sequence alone; row 1: its first 6 tokens right-padded with junk; row 2: the same
    # left-padded with junk (positions counted over valid tokens).
    tokens = jnp.concatenate([seq, jnp.concatenate([seq[:, :6], junk], 1), jnp.concatenate([junk, seq[:, :6]], 1)])
    valid = jnp.array([[True] * 9, [True] * 6 + [False] * 3, [False] * 3 + [True] * 6])
    out = np.asarray(forward(model, tokens, D.positions_from_valid(valid), valid))
    np.testing.assert_allclose(out[1, :6], out[0, :6], atol=1e-5)
    np.testing.assert_allclose(out[2, 3:], out[0, :6], atol=1e-5)
    assert np.isfinite(out).all()  # fully-masked query rows stay finite


def test_token_logprobs(models):
    model, cfg = models["qwen2"], VARIANTS["qwen2"]
    tokens = batch(5, 3, 9)
    valid = np.ones((3, 9), bool)
    valid[0, :2] = False  # left padding: the first real token (t = 2) has no scored prediction
    valid[2, 7:] = False  # right padding
    positions = np.asarray(D.positions_from_valid(jnp.asarray(valid)))
    got = np.asarray(jax.jit(lambda s, *a: D.token_logprobs(nnx.merge(nnx.graphdef(model), s), *a))(
        nnx.state(model), tokens, jnp.asarray(positions), jnp.asarray(valid)))
    logits = hf_forward(params_np(model), cfg, np.asarray(tokens), positions, valid)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    expected = np.zeros((3, 9))
    for b in range(3):
        for t in range(1, 9):
            if valid[b, t] and valid[b, t - 1]:
                expected[b, t] = logits[b, t - 1, tokens[b, t]] - logz[b, t - 1]
    np.testing.assert_allclose(got, expected, atol=2e-4)
    assert got[0, :3].tolist() == [0.0, 0.0, 0.0] and (got[1, 1:] < 0).all() and got[2, 7:].tolist() == [0, 0]


def test_chunked_token_logprobs_match(models):
    """chunk_size=3 over L - 1 = 8 scored positions (3 chunks, the last one padded). Gradients are not
    compared: checkpoint and lax.map differentiate exactly, and the extra compilation is costly here."""
    model = models["llama_untied"]
    graphdef, state = nnx.split(model)
    tokens = batch(7, 3, 9)
    valid = jnp.ones((3, 9), bool).at[1, :2].set(False)

    @jax.jit
    def both(state):
        m = nnx.merge(graphdef, state)
        positions = D.positions_from_valid(valid)
        return (D.token_logprobs(m, tokens, positions, valid),
                D.token_logprobs(m, tokens, positions, valid, chunk_size=3))

    plain, chunked = both(state)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(plain), atol=1e-5)
    assert (np.asarray(plain)[:, 3:] < 0).all()


def expected_param_count(cfg: D.DecoderConfig) -> int:
    """Closed form: embeddings + per layer (q, k, v, o, biases, SwiGLU, 2 norms, q/k norms) + final norm."""
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d
    attn += (h * hd + 2 * kv * hd) if cfg.qkv_bias else 0
    attn += 2 * hd if cfg.qk_norm else 0
    layer = attn + 3 * d * f + 2 * d
    head = 0 if cfg.tie_embeddings else d * cfg.vocab_size
    return cfg.vocab_size * d + cfg.n_layers * layer + d + head


def test_parameter_counts():
    cfg = D.maze_full()
    abstract = nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))
    assert D.count_params(abstract) == expected_param_count(cfg) == 3_944_704
    for variant in VARIANTS.values():
        abstract = nnx.eval_shape(lambda c=variant: D.Decoder(c, rngs=nnx.Rngs(0)))
        assert D.count_params(abstract) == expected_param_count(variant)


def test_parameters_carry_logical_axis_names():
    model = nnx.eval_shape(lambda: D.Decoder(VARIANTS["qwen3"], rngs=nnx.Rngs(0)))
    untied = nnx.eval_shape(lambda: D.Decoder(VARIANTS["llama_untied"], rngs=nnx.Rngs(0)))
    for m in (model, untied):
        for path, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
            names = var.get_metadata().get("out_sharding")
            assert names is not None and len(names) == var.shape.__len__(), path
            assert set(names) <= LOGICAL_AXES, (path, names)
    specs = nnx.get_partition_spec(nnx.state(untied, nnx.Param))
    assert tuple(specs["lm_head"].get_value()) == ("embed", "vocab")


def test_sharded_init_under_logical_rules():
    """The logical names map to a mesh: parameters built under rules come out with those shardings."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    rules = (("vocab", "model"), ("mlp", "model"), ("q_heads", "model"), ("embed", None), ("kv_heads", None),
             ("head_dim", None), ("norm", None))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        model = nnx.eval_shape(lambda: D.Decoder(VARIANTS["qwen2"], rngs=nnx.Rngs(0)))
    assert model.blocks[0].mlp.gate_proj.get_value().sharding.spec == jax.P(None, "model")
    assert model.blocks[0].attn.o_proj.get_value().sharding.spec == jax.P("model", None, None)
    assert model.embed.get_value().sharding.spec == jax.P("model", None)


def test_bfloat16_compute_is_close(models, forward):
    cfg = dataclasses.replace(VARIANTS["qwen2"], dtype="bfloat16")
    bf16 = make_model(cfg, seed=0)
    nnx.update(bf16, nnx.state(models["qwen2"], nnx.Param))
    tokens = batch(6, 3, 9)
    out = forward(bf16, tokens)
    assert out.dtype == jnp.float32
    f32 = np.asarray(forward(models["qwen2"], tokens))
    assert np.abs(np.asarray(out) - f32).max() < 0.03 * np.abs(f32).max()


def test_config_from_hf_and_validation():
    qwen2 = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
             "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
             "max_position_embeddings": 32768}
    cfg = D.DecoderConfig.from_hf(qwen2)
    assert (cfg.head_dim, cfg.qkv_bias, cfg.qk_norm, cfg.n_kv_heads) == (64, True, False, 2)
    qwen3 = dict(qwen2, model_type="qwen3", head_dim=128)
    cfg = D.DecoderConfig.from_hf(qwen3, dtype="bfloat16")
    assert (cfg.head_dim, cfg.qkv_bias, cfg.qk_norm, cfg.dtype) == (128, False, True, "bfloat16")
    llama = dict(qwen2, model_type="llama", num_key_value_heads=None)
    assert D.DecoderConfig.from_hf(llama).n_kv_heads == 14
    with pytest.raises(ValueError, match="rope_scaling"):
        D.DecoderConfig.from_hf(dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="model_type"):
        D.DecoderConfig.from_hf(dict(qwen2, model_type="gpt2"))
    with pytest.raises(ValueError, match="n_kv_heads"):
        D.tiny(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        D.tiny(dtype="float33")


@pytest.mark.parametrize("options", [dict(remat="block"), dict(scan_layers=True),
                                     dict(remat="block", scan_layers=True),
                                     dict(remat="block_save_dots", scan_layers=True)])
def test_remat_and_scanned_layers_give_the_same_loss_and_gradient(options):
    """Recomputing blocks in the backward pass and scanning over stacked block weights change memory and
    compile time, not the result (padding on both sides)."""
    import dataclasses

    cfg = D.tiny(vocab_size=32, n_layers=3)
    graphdef, params = nnx.split(D.random_decoder(cfg, 0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 32, (3, 9)))
    valid = jnp.asarray((np.arange(9)[None] >= np.array([[0], [3], [1]])) & (np.arange(9)[None] < np.array([[9], [8], [6]])))
    positions = D.positions_from_valid(valid)

    def loss_and_grad(c):
        g = nnx.graphdef(D.Decoder(c, rngs=nnx.Rngs(0)))
        f = lambda p: jnp.sum(D.token_logprobs(nnx.merge(g, p), tokens, positions, valid))
        return jax.jit(jax.value_and_grad(f))

    ref_loss, ref_grad = loss_and_grad(cfg)(params)
    new_cfg = dataclasses.replace(cfg, **options)
    loss, grad = loss_and_grad(new_cfg)(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), grad, ref_grad)
    if new_cfg.scan_layers:  # one loop over the layers, not three copies of the block
        hlo = loss_and_grad(new_cfg).lower(params).as_text()
        assert "while" in hlo


def test_remat_keeps_less_for_the_backward_pass():
    import dataclasses

    cfg = D.tiny(vocab_size=32, n_layers=4, d_model=64, ffn_dim=256, head_dim=16)
    params = nnx.split(D.random_decoder(cfg, 1))[1]
    tokens = jnp.zeros((8, 128), jnp.int32)

    def temp_bytes(c):
        g = nnx.graphdef(D.Decoder(c, rngs=nnx.Rngs(0)))
        f = jax.jit(jax.grad(lambda p: jnp.sum(D.token_logprobs(nnx.merge(g, p), tokens))))
        return f.lower(params).compile().memory_analysis().temp_size_in_bytes

    # Measured: 38 MB plain, 35 MB with remat of the unrolled blocks (XLA:CPU's scheduler keeps most of the
    # recomputed values live at once), 15 MB with remat inside the scan over layers.
    assert temp_bytes(dataclasses.replace(cfg, remat="block", scan_layers=True)) < 0.6 * temp_bytes(cfg)


def test_unknown_remat_policy_is_named():
    with pytest.raises(ValueError, match="DecoderConfig.remat='some'"):
        D.tiny(remat="some")


@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_swiglu_backward_equals_autodiff(dtype, rtol):
    """The hand-written SwiGLU backward (decoder.swiglu) gives autodiff's gradients for every input, over two
    leading axes, in float32 and bfloat16, eagerly and under jit (where CPU adds its transposition barrier)."""
    rng = np.random.default_rng(0)
    x, wg, wu, wd = (jnp.asarray(rng.standard_normal(shape) * scale, dtype)
                     for shape, scale in (((3, 5, 8), 1.0), ((8, 16), 0.5), ((8, 16), 0.5), ((16, 8), 0.5)))
    d_out = jnp.asarray(rng.standard_normal((3, 5, 8)), dtype)

    def autodiff(x, wg, wu, wd):
        return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

    for fn in (D.swiglu, jax.jit(D.swiglu)):
        out, vjp = jax.vjp(fn, x, wg, wu, wd)
        ref_out, ref_vjp = jax.vjp(autodiff, x, wg, wu, wd)
        np.testing.assert_allclose(np.float32(out), np.float32(ref_out), rtol=rtol, atol=rtol)
        for name, got, want in zip(("x", "w_gate", "w_up", "w_down"), vjp(d_out), ref_vjp(d_out)):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            scale = float(jnp.max(jnp.abs(want.astype(jnp.float32))))
            np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=rtol, atol=rtol * scale, err_msg=name)


def test_the_cpu_only_transpose_barrier_follows_the_platform_lowered_for():
    """``_rows_transposed``'s optimization barrier is an XLA:CPU workaround: absent when lowering for a TPU."""
    from sera_jax.models import attention as A

    def primitives(platform=None):
        x = jnp.ones((2, 3, 4))
        fresh = lambda a: D._rows_transposed(a)  # noqa: E731 -- a new function: traces are cached per function
        if platform is None:
            return {e.primitive.name for e in jax.make_jaxpr(fresh)(x).eqns}
        with A.lowering_for(platform):
            return {e.primitive.name for e in jax.make_jaxpr(fresh)(x).eqns}

    assert "optimization_barrier" in primitives()
    assert "optimization_barrier" not in primitives("tpu")
    with A.compile_only():  # the planner's memory plans hold the accelerator's program
        assert "optimization_barrier" not in primitives()
