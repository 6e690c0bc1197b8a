"""Hugging Face checkpoints <-> Decoder: logits and greedy decoding against ``transformers`` itself (PyTorch,
CPU, float32) for tiny random llama (SmolLM2-like, tied), qwen2 (qkv biases) and qwen3 (q/k norms, explicit
head_dim) checkpoints with GQA; sharded index files; placement with shardings; missing-tensor, unsupported
config and missing-file errors; the save_hf_checkpoint -> load round trip.

The parity tests need the ``parity`` extra (torch, transformers) and are skipped without it; the loader's
own tests (errors, round trip, sharded placement) run everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from sera_jax.models import decoder as D
from sera_jax.models import hf_loader as L
from sera_jax.models import sampler as S
from sera_jax.train import sharding as SH
from tests.models import hf_fixtures as F

# float32 logits of the tiny models are O(5); observed max |ours - transformers| is ~1.5e-5 (llama),
# ~6e-6 (qwen2, qwen3) on the padded batches below.
LOGITS_ATOL = 1e-4
SKIP_REASON = "needs the 'parity' extra: pip install -e .[parity] (torch CPU + transformers)"


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch", reason=SKIP_REASON)
    pytest.importorskip("transformers", reason=SKIP_REASON)
    torch.set_num_threads(1)
    return torch


def forward_fn(model: D.Decoder):
    """Jitted ``(tokens, positions, valid) -> logits`` of a model (split outside, merged inside)."""
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda st, tokens, positions, valid: nnx.merge(graphdef, st)(tokens, positions, valid))
    return lambda tokens, positions, valid: np.asarray(
        fn(state, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid)))


@pytest.fixture(scope="module", params=F.FAMILIES)
def case(request, torch, tmp_path_factory):
    """(family, checkpoint dir, transformers model, our loaded model) for one family."""
    family = request.param
    directory = tmp_path_factory.mktemp(f"hf_{family}")
    hf_model = F.make_hf_checkpoint(directory, family, seed=1)
    return family, directory, hf_model, L.load_hf_checkpoint(directory)


def hf_logits(torch, hf_model, tokens, valid, positions=None):
    with torch.no_grad():
        kwargs = {} if positions is None else {"position_ids": torch.tensor(np.asarray(positions), dtype=torch.long)}
        out = hf_model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(valid.astype(np.int64)), **kwargs)
    return out.logits.float().numpy()


# --- parity with transformers ----------------------------------------------------------------------

def test_config_matches_transformers(case):
    family, _, hf_model, model = case
    c = hf_model.config
    assert model.cfg == D.DecoderConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        ffn_dim=c.intermediate_size, rope_theta=F.FAMILY_CONFIGS[family]["rope_theta"], rms_eps=c.rms_norm_eps,
        tie_embeddings=c.tie_word_embeddings, qkv_bias=family == "qwen2", qk_norm=family == "qwen3",
        max_seq_len=c.max_position_embeddings, init_std=c.initializer_range)
    assert D.count_params(model) == sum(p.numel() for p in hf_model.parameters())


def test_logits_match_transformers_with_padding(case, torch):
    family, _, hf_model, model = case
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, model.cfg.vocab_size, (4, 16))
    lengths = np.array([16, 11, 6, 1])
    col = np.arange(16)[None, :]
    forward = forward_fn(model)

    right = col < lengths[:, None]  # default positions 0..L-1 on both sides
    ours = forward(tokens, np.broadcast_to(col, tokens.shape), right)
    ref = hf_logits(torch, hf_model, tokens, right)
    err_right = np.abs(ours - ref)[right].max()

    left = col >= 16 - lengths[:, None]  # positions counted over real tokens, passed to both
    positions = np.asarray(D.positions_from_valid(jnp.asarray(left)))
    ours = forward(tokens, positions, left)
    ref = hf_logits(torch, hf_model, tokens, left, positions)
    err_left = np.abs(ours - ref)[left].max()
    print(f"{family}: max |logits - transformers| right padding {err_right:.2e}, left padding {err_left:.2e} "
          f"(max |logit| {np.abs(ref).max():.1f})")
    assert err_right < LOGITS_ATOL and err_left < LOGITS_ATOL


def test_greedy_sampler_matches_generate(case, torch):
    """Our jitted KV-cache sampler with greedy=True == ``generate(do_sample=False)`` on left-padded prompts,
    without a stop token (full length) and with one (finished rows padded with PAD afterwards)."""
    family, _, hf_model, model = case
    rng = np.random.default_rng(1)
    n_new, lengths = 12, np.array([9, 5, 2])
    col = np.arange(9)[None, :]
    valid = col >= 9 - lengths[:, None]
    prompts = np.where(valid, rng.integers(2, model.cfg.vocab_size, (3, 9)), F.PAD_ID)

    def generate(eos):
        with torch.no_grad():
            out = hf_model.generate(
                input_ids=torch.tensor(prompts), attention_mask=torch.tensor(valid.astype(np.int64)),
                do_sample=False, max_new_tokens=n_new, eos_token_id=eos, pad_token_id=F.PAD_ID,
                output_scores=True, return_dict_in_generate=True)
        return out.sequences[:, 9:].numpy(), torch.stack(out.scores, 1).float().numpy()

    graphdef, state = nnx.split(model)
    sample = S.make_sample_fn(graphdef, max_new_tokens=n_new, pad_id=F.PAD_ID, greedy=True)

    def ours(stop):
        out = sample(state, jnp.asarray(prompts, jnp.int32), jnp.asarray(lengths, jnp.int32),
                     jnp.arange(3, dtype=jnp.int32), jax.random.key(0), jnp.float32(0.0),
                     jnp.asarray([stop], jnp.int32))
        return np.asarray(out.tokens_BxR), np.asarray(out.finished_B)

    ref, scores = generate(None)
    top2 = np.sort(scores, axis=-1)[..., -2:]
    margin = (top2[..., 1] - top2[..., 0]).min()  # no near-ties: argmax is not decided by round-off
    tokens, finished = ours(-1)
    np.testing.assert_array_equal(tokens, ref, err_msg=f"{family}: smallest top-2 logit margin {margin:.2e}")
    assert not finished.any()

    stop = int(ref[0, 4])  # a token row 0 emits mid-way: rows stop at its first occurrence
    ref_stop, _ = generate(stop)
    ref_stop = np.pad(ref_stop, ((0, 0), (0, n_new - ref_stop.shape[1])), constant_values=F.PAD_ID)
    tokens, finished = ours(stop)
    np.testing.assert_array_equal(tokens, ref_stop)
    assert finished[0] and (finished == (ref == stop).any(1)).all()
    print(f"{family}: greedy tokens identical ({n_new} new, 3 prompts), smallest top-2 margin {margin:.2e}")


def test_export_loads_in_transformers(case, torch, tmp_path):
    """save_hf_checkpoint of the loaded model -> transformers ``from_pretrained`` gives back exactly the
    original torch weights and logits (the exported layout and config.json are Hugging Face's)."""
    import transformers

    family, _, hf_model, model = case
    L.save_hf_checkpoint(model, tmp_path, family)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(again) is type(hf_model)
    ref = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    got = {k: v.numpy() for k, v in again.state_dict().items()}
    assert set(got) == set(ref)
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    tokens = np.random.default_rng(2).integers(2, model.cfg.vocab_size, (2, 7))
    valid = np.ones_like(tokens, bool)
    np.testing.assert_array_equal(hf_logits(torch, again, tokens, valid), hf_logits(torch, hf_model, tokens, valid))


def test_sharded_index_from_transformers(torch, tmp_path):
    hf_model = F.make_hf_checkpoint(tmp_path, "qwen2", seed=3, max_shard_size="20KB")
    index = json.loads((tmp_path / L.INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (tmp_path / L.WEIGHTS_FILE).exists()
    model = L.load_hf_checkpoint(tmp_path)
    params = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    layout = L.hf_layout(model.cfg)
    sd = hf_model.state_dict()
    assert set(sd) == set(layout)
    for name, spec in layout.items():  # independent of the loader: torch tensor, transposed / reshaped here
        w = sd[name].numpy()
        expected = w.T.reshape(spec.ours_shape) if w.ndim == 2 and name != "model.embed_tokens.weight" else \
            w.reshape(spec.ours_shape)
        np.testing.assert_array_equal(np.asarray(params[spec.path]), expected, err_msg=name)


# --- loader behaviour (no torch needed) --------------------------------------------------------------

def tiny_cfg(family: str, **overrides) -> D.DecoderConfig:
    kwargs = dict(qkv_bias=family == "qwen2", qk_norm=family == "qwen3", tie_embeddings=family == "llama",
                  vocab_size=19, head_dim=8 if family != "qwen3" else 12)
    kwargs.update(overrides)
    return D.tiny(**kwargs)


def flat_params(model: D.Decoder) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("family", F.FAMILIES)
def test_round_trip(family, tmp_path):
    model = F.random_decoder(tiny_cfg(family), seed=4)
    L.save_hf_checkpoint(model, tmp_path, family)
    assert L.read_hf_config(tmp_path)["model_type"] == family
    again = L.load_hf_checkpoint(tmp_path)
    assert again.cfg == model.cfg
    want, got = flat_params(model), flat_params(again)
    assert set(got) == set(want)
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))


def test_round_trip_sharded_and_bfloat16(tmp_path):
    import ml_dtypes

    model = F.random_decoder(tiny_cfg("qwen3", tie_embeddings=False), seed=5)
    L.save_hf_checkpoint(model, tmp_path, dtype="bfloat16", max_shard_bytes=2_000)
    index = json.loads((tmp_path / L.INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(
        int(np.prod(s.hf_shape)) * 2 for s in L.hf_layout(model.cfg).values())
    with safe_open(tmp_path / shards[0], framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_slice(next(iter(f.keys()))).get_dtype() == "BF16"
    want = {p: x.astype(ml_dtypes.bfloat16) for p, x in flat_params(model).items()}
    as_bf16 = L.load_hf_checkpoint(tmp_path, param_dtype="bfloat16")
    as_f32 = L.load_hf_checkpoint(tmp_path)
    for path, x in want.items():
        assert flat_params(as_bf16)[path].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(flat_params(as_bf16)[path], x)
        np.testing.assert_array_equal(flat_params(as_f32)[path], x.astype(np.float32))
    assert as_bf16.cfg.param_dtype == "bfloat16" and as_bf16.cfg.dtype == "float32"


def test_load_with_shardings(tmp_path):
    """Parameters land directly in the shardings the project's rules give (FSDP x tensor parallel on the 8
    test devices), with the same values as an unsharded load."""
    model = F.random_decoder(tiny_cfg("qwen2", tie_embeddings=False, vocab_size=24), seed=6)
    L.save_hf_checkpoint(model, tmp_path)
    mesh = SH.make_mesh({"axes": ("data", "fsdp", "model"), "shape": (1, 2, 4)})

    def shardings_fn(cfg):
        return SH.abstract_sharded(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)), mesh, SH.DECODER_RULES)[2]

    sharded = L.load_hf_checkpoint(tmp_path, shardings=shardings_fn)
    expected = {p: v.get_value() for p, v in nnx.to_flat_state(shardings_fn(model.cfg))}
    got = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(sharded, nnx.Param))}
    want = flat_params(model)
    for path, x in got.items():
        assert x.sharding == expected[path], path
        np.testing.assert_array_equal(np.asarray(x), want[path], err_msg=str(path))
    q_proj = got[("blocks", 0, "attn", "q_proj")]
    assert q_proj.sharding.spec == jax.sharding.PartitionSpec("fsdp", "model", None)
    assert {s.data.shape for s in q_proj.addressable_shards} == {(16, 1, 8)}
    assert got[("embed",)].sharding.spec == jax.sharding.PartitionSpec("model", "fsdp")


def rewrite(path: Path, drop=(), add=None, replace=None) -> None:
    """Rewrites a safetensors file without ``drop``, with ``add`` / ``replace`` tensors."""
    with safe_open(path, framework="np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k not in drop}
    tensors.update(add or {})
    tensors.update(replace or {})
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_unexpected_and_misshaped_tensors_are_listed(tmp_path):
    model = F.random_decoder(tiny_cfg("qwen2", tie_embeddings=False), seed=7)
    L.save_hf_checkpoint(model, tmp_path)
    weights = tmp_path / L.WEIGHTS_FILE
    rewrite(weights, drop=("model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.bias"),
            add={"model.layers.0.self_attn.extra.weight": np.zeros((2, 2), np.float32)},
            replace={"model.norm.weight": np.ones((31,), np.float32),
                     "model.layers.0.mlp.gate_proj.weight": np.ones((64, 32), np.int8)})
    with pytest.raises(ValueError) as err:
        L.load_hf_checkpoint(tmp_path)
    msg = str(err.value)
    for part in ("missing tensors (2)", "model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.bias",
                 "unexpected tensors (1)", "model.layers.0.self_attn.extra.weight",
                 "wrong shapes (1)", "model.norm.weight: (31,) (expected (32,))",
                 "non-float tensors (1", "model.layers.0.mlp.gate_proj.weight: I8"):
        assert part in msg, (part, msg)


def test_tied_checkpoint_may_store_the_embedding_as_lm_head(tmp_path):
    model = F.random_decoder(tiny_cfg("llama"), seed=8)
    L.save_hf_checkpoint(model, tmp_path)
    weights = tmp_path / L.WEIGHTS_FILE
    with safe_open(weights, framework="np") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
    rewrite(weights, add={"lm_head.weight": embed,
                          "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)})
    np.testing.assert_array_equal(flat_params(L.load_hf_checkpoint(tmp_path))[("embed",)], embed)
    rewrite(weights, replace={"lm_head.weight": embed + 1})
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        L.load_hf_checkpoint(tmp_path)


def test_untied_config_on_tied_checkpoint_names_lm_head(tmp_path):
    L.save_hf_checkpoint(F.random_decoder(tiny_cfg("llama"), seed=9), tmp_path)
    config = json.loads((tmp_path / L.CONFIG_FILE).read_text())
    (tmp_path / L.CONFIG_FILE).write_text(json.dumps(dict(config, tie_word_embeddings=False)))
    with pytest.raises(ValueError, match=r"missing tensors \(1\): lm_head.weight"):
        L.load_hf_checkpoint(tmp_path)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config.json.*nowhere"):
        L.load_hf_checkpoint(tmp_path / "nowhere")
    L.save_hf_checkpoint(F.random_decoder(tiny_cfg("llama"), seed=10), tmp_path)
    (tmp_path / L.WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError) as err:
        L.load_hf_checkpoint(tmp_path)
    assert str(tmp_path) in str(err.value) and L.WEIGHTS_FILE in str(err.value) and L.INDEX_FILE in str(err.value)
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / L.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        L.load_hf_checkpoint(tmp_path)


BASE_QWEN2 = dict(model_type="qwen2", vocab_size=19, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rope_theta=10_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, use_sliding_window=False, sliding_window=4096,
                  layer_types=["full_attention", "full_attention"], rope_scaling=None)


@pytest.mark.parametrize("field, value", [
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
    ("use_sliding_window", True),
    ("layer_types", ["full_attention", "sliding_attention"]),
    ("num_experts", 8),
    ("num_local_experts", 8),
    ("quantization_config", {"quant_method": "gptq"}),
    ("hidden_act", "gelu"),
    ("mlp_bias", True),
    ("model_type", "qwen2_moe"),
    ("model_type", "mistral"),
])
def test_unsupported_config_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        L.config_from_hf(dict(BASE_QWEN2, **{field: value}))


def test_supported_config_variants():
    cfg = L.config_from_hf(BASE_QWEN2)
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.head_dim, cfg.tie_embeddings) == (True, False, 8, True)
    legacy = L.config_from_hf(dict(BASE_QWEN2, rope_theta=5e5, rope_scaling={"type": "default"}))
    assert legacy.rope_theta == 5e5
    v5 = {k: v for k, v in BASE_QWEN2.items() if k not in ("rope_theta", "rope_scaling")}
    assert L.config_from_hf(dict(v5, rope_parameters={"rope_type": "default", "rope_theta": 1e6})).rope_theta == 1e6
    with pytest.raises(ValueError, match="hidden_size"):
        L.config_from_hf({k: v for k, v in BASE_QWEN2.items() if k != "hidden_size"})


def test_save_refuses_a_family_the_model_is_not(tmp_path):
    model = F.random_decoder(tiny_cfg("qwen2"), seed=11)
    with pytest.raises(ValueError, match="family='qwen3'"):
        L.save_hf_checkpoint(model, tmp_path, "qwen3")
    with pytest.raises(ValueError, match="family='gpt2'"):
        L.save_hf_checkpoint(model, tmp_path, "gpt2")
