"""Our decoder <-> tunix's own Qwen2 (``sera_jax.integrations.tunix_models``), checked against tunix's code:
its Qwen2 forward (padded, masked the way tunix masks) gives our logits, tunix's ``compute_per_token_logps``
gives our RL log-probs, tunix's sampler decodes greedily the tokens ours does, ours -> tunix -> ours is exact,
a sharded tunix model computes what an unsharded one does, and what tunix's Qwen2 cannot express is refused
by name. Tiny float32 decoders (a few thousand parameters); needs the ``tunix`` extra (skipped without it).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("tunix", reason="needs the 'tunix' extra: pip install -e .[tunix]")

from tunix.generate import sampler as tunix_sampler  # noqa: E402
from tunix.rl import common as tunix_common  # noqa: E402

from experiments.maze import config as maze_config  # noqa: E402
from experiments.maze import experiment as maze_experiment  # noqa: E402
from sera_jax.integrations import tunix_models as TM  # noqa: E402
from sera_jax.models import decoder as D  # noqa: E402
from sera_jax.models import hf_loader as L  # noqa: E402
from sera_jax.models import sampler as S  # noqa: E402
from sera_jax.rl import step as rl_step  # noqa: E402

# Logits of these models are O(1-5); float32 differences observed up to 3e-6 (different attention, RoPE code).
ATOL = 2e-5
PAD = 0
VOCAB = 32
# Two architectures: the maze's own tiny policy (experiments/maze/config.py:tiny: tied embeddings, rope_theta
# 1e6, 2 query heads on 1 KV head) and an untied one with 2 query heads per KV head, a large rms_eps and the
# default theta (so that each config field tunix receives changes the logits).
CASES = {
    "maze_tiny": None,  # filled from the maze config below
    "untied": D.DecoderConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4,
                              ffn_dim=32, rope_theta=10_000.0, rms_eps=1e-2, tie_embeddings=False, qkv_bias=True,
                              max_seq_len=64),
}


def maze_decoder_config(variant: str) -> D.DecoderConfig:
    """The DecoderConfig the maze experiment builds for ``variant`` (abstractly: no parameters created)."""
    return nnx.eval_shape(lambda: maze_experiment.build_model(maze_config.get_config(variant), 0)).cfg


def case_config(name: str) -> D.DecoderConfig:
    return maze_decoder_config("tiny") if name == "maze_tiny" else CASES[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(cfg, our model, tunix's Qwen2 loaded from our checkpoint) for one architecture."""
    cfg = case_config(request.param)
    assert D.count_params(nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))) < 10_000
    model = D.random_decoder(cfg, seed=1, scale=0.3)  # nonzero biases, norm scales away from 1
    directory = tmp_path_factory.mktemp(f"to_tunix_{request.param}")
    return cfg, model, TM.to_tunix_qwen2(cfg, model, directory)


def padded_batch(rng: np.random.Generator):
    """Tokens (4, 12) from ids 1..V-1 and their validity: a full row, a left-padded prompt, a right-padded
    response, and both ([left-padded prompt | right-padded response]), PAD (0) at the invalid places."""
    valid = np.ones((4, 12), bool)
    valid[1, :3] = False
    valid[2, 9:] = False
    valid[3, :2] = False
    valid[3, 10:] = False
    tokens = np.where(valid, rng.integers(1, VOCAB, valid.shape), PAD).astype(np.int32)
    return tokens, valid


def ours_logits(model, tokens, valid):
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda st, t, v: nnx.merge(graphdef, st)(t, D.positions_from_valid(v), v))
    return np.asarray(fn(state, jnp.asarray(tokens), jnp.asarray(valid)))


def tunix_logits(qwen2, tokens, valid):
    """tunix's forward as tunix's trainers call it: positions counted over real tokens, a (B, L, L) causal
    mask that hides padding (``tunix.rl.common``'s own helpers), no cache."""
    graphdef, state = nnx.split(qwen2)

    @jax.jit
    def fn(st, t, v):
        positions = tunix_common.build_positions_from_mask(v)
        logits, _ = nnx.merge(graphdef, st)(t, positions, None, tunix_common.make_causal_attn_mask(v))
        return logits

    return np.asarray(fn(state, jnp.asarray(tokens), jnp.asarray(valid)))


# --- forward and log-prob parity with tunix's own code ---------------------------------------------

def test_logits_match_tunix_forward_on_padded_rows(case):
    cfg, model, qwen2 = case
    tokens, valid = padded_batch(np.random.default_rng(0))
    ours, theirs = ours_logits(model, tokens, valid), tunix_logits(qwen2, tokens, valid)
    chex.assert_shape(theirs, (4, 12, cfg.vocab_size))
    assert np.abs(ours).max() > 1.0  # far from uniform: the comparison can see a wrong weight
    np.testing.assert_allclose(ours[valid], theirs[valid], atol=ATOL, rtol=0)


def test_per_token_logps_match_tunix_compute_per_token_logps(case):
    """Completion log-probs given a left-padded prompt: tunix's ``compute_per_token_logps`` (its RL learners'
    function) against ours (``sera_jax.rl.step.response_logprobs``), on every real completion token."""
    _, model, qwen2 = case
    rng = np.random.default_rng(1)
    t, r = 6, 5
    prompt_len, completion_len = np.array([6, 3, 1, 4]), np.array([5, 2, 4, 1])
    prompt_valid = np.arange(t)[None, :] >= t - prompt_len[:, None]
    completion_valid = np.arange(r)[None, :] < completion_len[:, None]
    prompts = np.where(prompt_valid, rng.integers(1, VOCAB, prompt_valid.shape), PAD).astype(np.int32)
    completions = np.where(completion_valid, rng.integers(1, VOCAB, completion_valid.shape), PAD).astype(np.int32)

    graphdef, state = nnx.split(qwen2)
    theirs = np.asarray(tunix_common.compute_per_token_logps(
        graphdef, state, jnp.asarray(prompts), jnp.asarray(completions), pad_id=PAD, eos_id=2))
    g, params = nnx.split(model)
    batch = rl_step.SequenceBatch(jnp.asarray(np.concatenate([prompts, completions], 1)),
                                  jnp.asarray(np.concatenate([prompt_valid, completion_valid], 1)),
                                  jnp.asarray(completion_valid, jnp.float32))
    ours = np.asarray(jax.jit(rl_step.response_logprobs, static_argnums=0)(g, params, batch))
    chex.assert_shape([ours, theirs], (4, r))
    assert np.all(theirs[completion_valid] < -0.05)  # not degenerate
    np.testing.assert_allclose(ours[completion_valid], theirs[completion_valid], atol=ATOL, rtol=0)


def test_greedy_tokens_match_tunix_sampler(case):
    """tunix's vanilla sampler (its KV cache, prefill + decode loop) decodes greedily the tokens ours does.
    Prompts of equal length (no padding) and pad_id = vocab_size: tunix masks every generated token equal to
    its pad id, and a random policy emits PAD."""
    cfg, model, qwen2 = case
    t, r, n = 7, 10, 3
    prompts = np.random.default_rng(2).integers(1, cfg.vocab_size, (n, t)).astype(np.int32)
    tok = TM.TokenIdTokenizer(eos_id=2, pad_id=cfg.vocab_size)
    sampler = tunix_sampler.Sampler(qwen2, tok, tunix_sampler.CacheConfig(
        cache_size=t + r, num_layers=cfg.n_layers, num_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim))
    out = sampler([TM.ids_text(p) for p in prompts], max_generation_steps=r, max_prompt_length=t,
                  eos_tokens=[-1])  # greedy (no top_p), never stopped
    theirs = np.stack([np.asarray(x) for x in out.tokens])
    graphdef, state = nnx.split(model)
    ours = S.make_sample_fn(graphdef, max_new_tokens=r, greedy=True)(
        state, jnp.asarray(prompts), jnp.full((n,), t, jnp.int32), jnp.arange(n, dtype=jnp.int32),
        jax.random.key(0), jnp.float32(1.0), jnp.asarray([-1], jnp.int32))
    np.testing.assert_array_equal(np.asarray(ours.tokens_BxR), theirs)
    assert len(np.unique(theirs)) > 3  # not one repeated token


# --- conversions --------------------------------------------------------------------------------------

def test_round_trip_ours_tunix_ours_is_exact(case, tmp_path):
    cfg, model, qwen2 = case
    back = TM.from_tunix_qwen2(qwen2, cfg, tmp_path)
    assert back.cfg == cfg
    chex.assert_trees_all_equal(nnx.state(back, nnx.Param), nnx.state(model, nnx.Param))
    # The directory is a checkpoint our loader (and transformers) reads as a qwen2 model.
    assert L.read_hf_config(tmp_path)["model_type"] == "qwen2"
    # How our decoder runs is not in tunix's model: it comes back from cfg.
    runs = dataclasses.replace(cfg, attention="dense", remat="block", scan_layers=True, dtype="bfloat16")
    assert TM.from_tunix_qwen2(qwen2, runs, tmp_path / "runs").cfg == runs


def test_to_tunix_takes_parameter_state(case, tmp_path):
    cfg, model, qwen2 = case
    from_state = TM.to_tunix_qwen2(cfg, nnx.state(model, nnx.Param), tmp_path)
    chex.assert_trees_all_equal(nnx.state(from_state, nnx.Param), nnx.state(qwen2, nnx.Param))


def test_sharded_tunix_model_equals_unsharded(tmp_path):
    """Loaded onto an 8-device (fsdp 4, tp 2) mesh of automatic axes by tunix's own sharding rules: sharded
    parameters, the same logits, and the way back gathers them exactly."""
    cfg = CASES["untied"]
    model = D.random_decoder(cfg, seed=3, scale=0.3)
    mesh = jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)  # tunix's kind
    qwen2 = TM.to_tunix_qwen2(cfg, model, tmp_path / "hf", mesh=mesh)
    q_proj = qwen2.layers[0].attn.q_proj.w.get_value()
    assert len(q_proj.sharding.device_set) == 8 and not q_proj.sharding.is_fully_replicated
    tokens, valid = padded_batch(np.random.default_rng(4))
    np.testing.assert_allclose(tunix_logits(qwen2, tokens, valid)[valid], ours_logits(model, tokens, valid)[valid],
                               atol=ATOL, rtol=0)
    back = TM.from_tunix_qwen2(qwen2, cfg, tmp_path / "back")
    chex.assert_trees_all_equal(nnx.state(back, nnx.Param), nnx.state(model, nnx.Param))


# --- configs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["tiny", "cpu", "gpu"])
def test_maze_configs_map(variant):
    cfg = maze_decoder_config(variant)
    tc = TM.tunix_qwen2_config(cfg)
    assert (tc.num_layers, tc.vocab_size, tc.embed_dim, tc.hidden_dim, tc.num_heads, tc.num_kv_heads, tc.head_dim) \
        == (cfg.n_layers, cfg.vocab_size, cfg.d_model, cfg.ffn_dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    assert tc.rope_theta == 1_000_000 and tc.norm_eps == cfg.rms_eps and tc.use_tied_embedding
    assert jnp.dtype(tc.dtype) == jnp.dtype(cfg.dtype) and jnp.dtype(tc.param_dtype) == jnp.dtype(cfg.param_dtype)
    if variant == "gpu":
        assert cfg == dataclasses.replace(D.maze_full(), dtype=cfg.dtype, attention=cfg.attention, remat="block",
                                          scan_layers=True)


@pytest.mark.parametrize("overrides, field", [(dict(qk_norm=True, qkv_bias=False), "qk_norm"),
                                              (dict(qkv_bias=False), "qkv_bias")])
def test_unsupported_configs_are_refused_by_name(overrides, field, tmp_path):
    cfg = dataclasses.replace(CASES["untied"], **overrides)
    with pytest.raises(ValueError, match=field):
        TM.tunix_qwen2_config(cfg)
    model = nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=field):
        TM.to_tunix_qwen2(cfg, model, tmp_path)
    assert not any(tmp_path.iterdir())  # refused before writing anything


def test_mismatched_configs_are_refused_by_name(case, tmp_path):
    cfg, model, qwen2 = case
    other = dataclasses.replace(cfg, rope_theta=cfg.rope_theta * 2)
    with pytest.raises(ValueError, match="rope_theta"):
        TM.from_tunix_qwen2(qwen2, other, tmp_path)
    with pytest.raises(ValueError, match="rope_theta"):
        TM.to_tunix_qwen2(other, model, tmp_path)
    with pytest.raises(ValueError, match="params_or_model"):
        TM.to_tunix_qwen2(dataclasses.replace(cfg, ffn_dim=2 * cfg.ffn_dim), nnx.state(model, nnx.Param), tmp_path)
