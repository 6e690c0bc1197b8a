"""The shared ``Decoder`` <-> tunix's own Qwen2 (``tunix.models.qwen2.model.Qwen2``), through Hugging Face files.

    tunix_cfg = tunix_qwen2_config(cfg)                       # refuses what tunix's Qwen2 cannot express
    qwen2 = to_tunix_qwen2(cfg, model, "/tmp/policy_hf")      # ours -> tunix (a tunix Qwen2 module)
    model = from_tunix_qwen2(qwen2, cfg, "/tmp/policy_back")  # tunix -> ours (a Decoder)

Both directions go through a Hugging Face checkpoint directory (``config.json`` + ``model.safetensors``), so
each side reads and writes only its own public format:

- ours -> tunix: ``sera_jax.models.hf_loader.save_hf_checkpoint`` writes the qwen2 checkpoint, tunix's
  ``tunix.models.qwen2.params.create_model_from_safe_tensors`` loads it (tunix's key mapping, its sharding
  rules when ``mesh`` is given: the mesh needs tunix's axis names, ``fsdp`` and ``tp``).
- tunix -> ours: tunix 0.1.7 has no public saver of a whole Qwen2 (``tunix.models.safetensors_saver`` only
  merges LoRA deltas into a copy of an existing base checkpoint), so its parameters are written under the HF
  names with ``_TUNIX_NAMES`` below and our layout (``hf_loader.hf_layout``), then read back with
  ``load_hf_checkpoint`` (which checks every tensor's presence and shape). The directory is a complete HF
  checkpoint (``transformers`` loads it too).

What tunix's Qwen2 computes is what our decoder computes for a Qwen2 config: pre-norm blocks, RMSNorm in
float32, rotate-half RoPE, GQA, q/k/v biases (always present in tunix), SwiGLU, optional tied embeddings. It
cannot express q/k norms (Qwen3) or the absence of q/k/v biases, and ``tunix_qwen2_config`` refuses those
with a ValueError naming the field. How our decoder runs (``attention``, its block sizes, ``remat``,
``scan_layers``) is not carried over: the tunix model runs tunix's defaults (dense attention, no remat); set
``remat_config`` / ``use_flash_attention`` on the returned config with ``dataclasses.replace`` if wanted.

Layouts (tunix's and ours agree up to the flattened biases; HF transposes every linear weight)::

    ours                             tunix Qwen2                                HF
    embed          (V, D)            embedder.input_embedding      (V, D)       model.embed_tokens.weight
    attn.q_proj    (D, A, hd)        layers.i.attn.q_proj.w        (D, A, hd)   self_attn.q_proj.weight (A*hd, D)
    attn.q_bias    (A, hd)           layers.i.attn.q_bias          (A*hd,)      self_attn.q_proj.bias
    attn.o_proj    (A, hd, D)        layers.i.attn.o_proj.w        (A, hd, D)   self_attn.o_proj.weight (D, A*hd)
    mlp.gate_proj  (D, F)            layers.i.mlp.gate_proj.kernel (D, F)       mlp.gate_proj.weight    (F, D)
    attn_norm      (D,)              layers.i.input_layernorm.w                 input_layernorm.weight
    mlp_norm       (D,)              layers.i.post_attention_layernorm.w        post_attention_layernorm.weight
    final_norm     (D,)              final_norm.w                               model.norm.weight
    lm_head        (D, V)            lm_head.w                     (D, V)       lm_head.weight (untied only)

(k/v like q; up/down like gate.) Importing this module imports tunix, whose Qwen2 module sets flax's
``flax_always_shard_variable`` to False for the whole process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file
from tunix.models.qwen2 import model as tunix_qwen2
from tunix.models.qwen2 import params as tunix_qwen2_params

from sera_jax.models import hf_loader
from sera_jax.models.decoder import Decoder, DecoderConfig

# Our parameter leaf name -> tunix's, for the modules whose names differ (the rest keep theirs). Linear
# weights are tunix ``Einsum.w`` (attention, lm_head) or ``nnx.Linear.kernel`` (MLP); norms are ``RMSNorm.w``.
_TUNIX_NAMES = {
    "embed": ("embedder", "input_embedding"),
    "blocks": ("layers",),
    "q_proj": ("q_proj", "w"), "k_proj": ("k_proj", "w"), "v_proj": ("v_proj", "w"), "o_proj": ("o_proj", "w"),
    "gate_proj": ("gate_proj", "kernel"), "up_proj": ("up_proj", "kernel"), "down_proj": ("down_proj", "kernel"),
    "attn_norm": ("input_layernorm",), "mlp_norm": ("post_attention_layernorm",), "scale": ("w",),
    "lm_head": ("lm_head", "w"),
}
# ModelConfig fields that fix the architecture (the rest say how tunix runs it).
_ARCHITECTURE_FIELDS = ("num_layers", "vocab_size", "embed_dim", "hidden_dim", "num_heads", "head_dim",
                        "num_kv_heads", "rope_theta", "norm_eps", "use_tied_embedding")
# DecoderConfig fields a HF config.json does not carry (how our decoder runs): passed back on loading.
_EXECUTION_FIELDS = ("dtype", "param_dtype", "attention", "attention_block_q", "attention_block_k", "remat",
                     "scan_layers")


def tunix_qwen2_config(cfg: DecoderConfig) -> tunix_qwen2.ModelConfig:
    """tunix's Qwen2 ``ModelConfig`` of ``cfg`` (same dtypes; tunix's default sharding, remat and attention).

    Raises ValueError naming the ``DecoderConfig`` field for what tunix's Qwen2 cannot express: q/k norms
    (``qk_norm=True``, Qwen3) and a model without q/k/v biases (``qkv_bias=False``: tunix's Qwen2 always has
    them, and its safetensors loader needs them in the checkpoint).
    """
    if not isinstance(cfg, DecoderConfig):
        raise ValueError(f"cfg must be a DecoderConfig, got {type(cfg).__name__}")
    if cfg.qk_norm:
        raise ValueError("DecoderConfig.qk_norm=True is not expressible by tunix's Qwen2 (no q/k norms; that is "
                         "Qwen3, tunix.models.qwen3)")
    if not cfg.qkv_bias:
        raise ValueError("DecoderConfig.qkv_bias=False is not expressible by tunix's Qwen2 (it always has q/k/v "
                         "biases and loads them from the checkpoint; a bias-free decoder is a Llama)")
    theta = cfg.rope_theta
    return tunix_qwen2.ModelConfig(
        num_layers=cfg.n_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.d_model, hidden_dim=cfg.ffn_dim,
        num_heads=cfg.n_heads, head_dim=cfg.head_dim, num_kv_heads=cfg.n_kv_heads,
        rope_theta=int(theta) if float(theta).is_integer() else theta,  # tunix types it int
        norm_eps=cfg.rms_eps, use_tied_embedding=cfg.tie_embeddings,
        dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))


def _as_decoder(cfg: DecoderConfig, params_or_model: Decoder | nnx.State) -> Decoder:
    """``params_or_model`` as a ``Decoder`` of ``cfg``: the model itself, or its ``nnx.State`` of parameters
    put into an abstract ``Decoder(cfg)``. ValueError if the model's config is not ``cfg``."""
    if isinstance(params_or_model, Decoder):
        if params_or_model.cfg != cfg:
            diff = [f.name for f in dataclasses.fields(cfg)
                    if getattr(cfg, f.name) != getattr(params_or_model.cfg, f.name)]
            raise ValueError(f"params_or_model.cfg differs from cfg in fields {diff}")
        return params_or_model
    if not isinstance(params_or_model, nnx.State):
        raise ValueError(f"params_or_model must be a Decoder or its nnx.State of parameters, got "
                         f"{type(params_or_model).__name__}")
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    want = {tuple(p): v.shape for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    got = {tuple(p): jnp.shape(v.get_value() if isinstance(v, nnx.Variable) else v)
           for p, v in nnx.to_flat_state(params_or_model)}
    if want != got:
        bad = sorted(str(p) for p in set(want) ^ set(got)) + \
            sorted(f"{p}: {got[p]} (expected {want[p]})" for p in set(want) & set(got) if want[p] != got[p])
        raise ValueError(f"params_or_model is not the parameter state of Decoder(cfg): {bad[:8]}")
    nnx.update(model, params_or_model)
    return model


def to_tunix_qwen2(cfg: DecoderConfig, params_or_model: Decoder | nnx.State, directory: str | os.PathLike,
                   mesh: jax.sharding.Mesh | None = None) -> tunix_qwen2.Qwen2:
    """tunix's ``Qwen2`` with the parameters of our decoder: written to ``directory`` as a HF qwen2 checkpoint
    by ``save_hf_checkpoint`` (stored in ``cfg.param_dtype``) and loaded by tunix's
    ``create_model_from_safe_tensors`` with ``tunix_qwen2_config(cfg)`` (placed by tunix's sharding rules on
    ``mesh``, whose axes must include tunix's ``fsdp`` and ``tp`` and be ``AxisType.Auto``: tunix's Qwen2 does
    not run on explicit axes, ``jax.make_mesh``'s default; on the default device without one).

    ``params_or_model``: a ``Decoder`` whose config is ``cfg``, or its ``nnx.State`` of parameters. Raises
    ValueError for configs tunix's Qwen2 cannot express (``tunix_qwen2_config``) and mismatched parameters.
    """
    tunix_cfg = tunix_qwen2_config(cfg)
    model = _as_decoder(cfg, params_or_model)
    directory = hf_loader.save_hf_checkpoint(model, directory, "qwen2")
    return tunix_qwen2_params.create_model_from_safe_tensors(
        str(directory), tunix_cfg, mesh=mesh, dtype=jnp.dtype(cfg.param_dtype))


def _tunix_path(path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """The tunix Qwen2 parameter path of one of our parameter paths (``_TUNIX_NAMES``)."""
    return tuple(part for name in path for part in (_TUNIX_NAMES.get(name, (name,)) if isinstance(name, str)
                                                    else (name,)))


def from_tunix_qwen2(model: tunix_qwen2.Qwen2, cfg: DecoderConfig, directory: str | os.PathLike) -> Decoder:
    """Our ``Decoder(cfg)`` with the parameters of tunix's ``Qwen2`` ``model``: written to ``directory`` as a HF
    qwen2 checkpoint (``config.json`` from ``config_to_hf``, ``model.safetensors`` in ``cfg.param_dtype``)
    and loaded by ``load_hf_checkpoint`` (on the default device), with ``cfg``'s dtypes and execution options.

    ``cfg`` gives what tunix's config lacks (``max_seq_len``, ``init_std``, how our decoder runs). Raises
    ValueError if ``cfg`` is not expressible by tunix's Qwen2 or if ``model.config`` differs from
    ``tunix_qwen2_config(cfg)`` in an architecture field (named), or if the model's parameters do not match.
    """
    want = tunix_qwen2_config(cfg)
    got = getattr(model, "config", None)
    if not isinstance(got, tunix_qwen2.ModelConfig):
        raise ValueError(f"model must be tunix's Qwen2 (with a qwen2 ModelConfig), got {type(model).__name__}")
    for name in _ARCHITECTURE_FIELDS:
        if getattr(got, name) != getattr(want, name):
            raise ValueError(f"model.config.{name}={getattr(got, name)!r} but cfg implies {getattr(want, name)!r}")
    params = {tuple(p): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    store_dtype = jnp.dtype(cfg.param_dtype)
    tensors, used = {}, set()
    for name, spec in hf_loader.hf_layout(cfg).items():
        path = _tunix_path(spec.path)
        if path not in params:
            raise ValueError(f"tunix model has no parameter {'.'.join(map(str, path))} (for {name})")
        x = np.asarray(jax.device_get(params[path]))
        if x.size != int(np.prod(spec.hf_shape)):
            raise ValueError(f"tunix parameter {'.'.join(map(str, path))} has shape {x.shape}, expected "
                             f"{int(np.prod(spec.hf_shape))} entries for {name} {spec.hf_shape}")
        tensors[name] = np.ascontiguousarray(spec.to_hf(x).astype(store_dtype))
        used.add(path)
    unused = sorted(".".join(map(str, p)) for p in set(params) - used)
    if unused:
        raise ValueError(f"tunix model has parameters with no place in Decoder(cfg): {unused[:8]}")

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Unlink rather than overwrite: a tunix model loaded from this directory may still map the old file.
    for stale in (directory / hf_loader.WEIGHTS_FILE, directory / hf_loader.INDEX_FILE):
        stale.unlink(missing_ok=True)
    save_file(tensors, directory / hf_loader.WEIGHTS_FILE, metadata={"format": "pt"})
    with open(directory / hf_loader.CONFIG_FILE, "w") as f:
        json.dump(hf_loader.config_to_hf(cfg, "qwen2", torch_dtype=store_dtype.name), f, indent=2)
    overrides: dict[str, Any] = {name: getattr(cfg, name) for name in _EXECUTION_FIELDS}
    return hf_loader.load_hf_checkpoint(directory, **overrides)


class TokenIdTokenizer:
    """A tokenizer for tunix's ``Sampler`` (``tunix.generate.tokenizer_adapter``: ``encode``, ``decode``,
    ``bos_id``, ``eos_id``, ``pad_id``) whose text is token ids written in decimal and separated by spaces
    (``ids_text``), so that prompts reach tunix's model exactly as the token ids we hold, whatever the task's
    own tokenizer (the maze's word-level one has a line-break token its pre-tokenizer never produces).

    ``bos_id=None`` (default): tunix prepends nothing (our prompts carry their BOS already). ``pad_id``: tunix's
    sampler treats every token equal to it as padding, in prompts and in what it generates (a generated
    ``pad_id`` is masked from later attention), so give an id the model never emits when its own PAD can be
    sampled, e.g. ``vocab_size`` for prompts of equal length (no padding needed).
    """

    def __init__(self, *, eos_id: int, pad_id: int, bos_id: int | None = None):
        self._eos, self._pad, self._bos = int(eos_id), int(pad_id), bos_id

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        del kwargs
        return [int(t) for t in text.split()]

    def decode(self, ids: Any, **kwargs: Any) -> str:
        del kwargs
        return ids_text(ids)

    def bos_id(self) -> int | None:
        return self._bos

    def eos_id(self) -> int:
        return self._eos

    def pad_id(self) -> int:
        return self._pad


def ids_text(ids: Any) -> str:
    """Token ids as ``TokenIdTokenizer`` text: ``[3, 4, 5]`` -> ``"3 4 5"``."""
    return " ".join(str(int(t)) for t in np.asarray(ids).reshape(-1))
