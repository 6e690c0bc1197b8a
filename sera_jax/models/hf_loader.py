"""Hugging Face checkpoints (Llama / SmolLM2, Qwen2, Qwen3) <-> the shared ``Decoder``, from local files only.

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or a sharded
``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file). Nothing is downloaded.

Loading (``load_hf_checkpoint``):

1. ``config.json`` -> ``DecoderConfig`` (``config_from_hf``), refusing, with the field named, what the decoder
   does not implement (rope scaling, sliding-window layers, mixture of experts, quantisation, ...).
2. The safetensors headers are read first: every tensor the config implies must be present with its HF
   shape and nothing else may be left over (rotary ``inv_freq`` buffers and a tied ``lm_head.weight`` equal
   to the embedding excepted); one ValueError lists all missing, unexpected and mis-shaped tensors.
3. Tensors are then read shard by shard, one tensor at a time (``safe_open(..., framework="np")``),
   converted to our layout (torch ``Linear.weight`` ``(out, in)`` -> ``(in, out)``, heads split), cast to
   ``param_dtype`` and placed: on the default device, or straight into given shardings with
   ``jax.make_array_from_callback`` so that a large model never exists unsharded on one device (host memory
   holds one tensor at a time).

Name mapping (HF -> ours; ``layer`` = ``model.layers.{i}``; V vocab, D d_model, F ffn_dim, A heads: query
heads for q and o, KV heads for k and v; hd = head_dim)::

    model.embed_tokens.weight              (V, D)       -> embed                          (V, D)
    layer.self_attn.{q,k,v}_proj.weight    (A*hd, D)    -> blocks[i].attn.{q,k,v}_proj    (D, A, hd)   transpose
    layer.self_attn.{q,k,v}_proj.bias      (A*hd,)      -> blocks[i].attn.{q,k,v}_bias    (A, hd)      Qwen2
    layer.self_attn.o_proj.weight          (D, A*hd)    -> blocks[i].attn.o_proj          (A, hd, D)   transpose
    layer.self_attn.{q,k}_norm.weight      (hd,)        -> blocks[i].attn.{q,k}_norm.scale             Qwen3
    layer.mlp.{gate,up}_proj.weight        (F, D)       -> blocks[i].mlp.{gate,up}_proj   (D, F)       transpose
    layer.mlp.down_proj.weight             (D, F)       -> blocks[i].mlp.down_proj        (F, D)       transpose
    layer.input_layernorm.weight           (D,)         -> blocks[i].attn_norm.scale
    layer.post_attention_layernorm.weight  (D,)         -> blocks[i].mlp_norm.scale
    model.norm.weight                      (D,)         -> final_norm.scale
    lm_head.weight                         (V, D)       -> lm_head                        (D, V)       untied only

``save_hf_checkpoint`` writes the same layout back (``config.json`` + ``model.safetensors``, or shards with
an index), loadable by ``transformers``' ``AutoModelForCausalLM.from_pretrained``.

Sharded loading, with the project's rules (``sera_jax.train.sharding``; models do not import train)::

    shardings_fn = lambda cfg: abstract_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh, rules)[2]
    model = load_hf_checkpoint(path, param_dtype="bfloat16", shardings=shardings_fn)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from sera_jax.models.decoder import Decoder, DecoderConfig

Family = Literal["llama", "qwen2", "qwen3"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

ParamPath = tuple[str | int, ...]
Shardings = Any  # a pytree of jax.sharding.Sharding shaped like nnx.state(model, nnx.Param)


# --- config ----------------------------------------------------------------------------------------

# Fields that switch on something the decoder does not implement when truthy (MoE, quantisation, soft caps).
_REFUSED_IF_SET = (
    "num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
    "quantization_config", "attn_logit_softcapping", "final_logit_softcapping", "use_qk_norm",
)


def _rope_is_default(rope: Any) -> bool:
    return isinstance(rope, Mapping) and rope.get("rope_type", rope.get("type", "default")) == "default"


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> DecoderConfig:
    """``DecoderConfig`` from a ``config.json`` dict of a llama / qwen2 / qwen3 checkpoint; ``overrides``
    (e.g. ``dtype``, ``param_dtype``, ``max_seq_len``) win.

    Raises ValueError naming the field for what the decoder does not implement: other model types, rope
    scaling (any ``rope_type`` but default) or partial rotary, sliding-window layers (``use_sliding_window``,
    ``layer_types``), mixture of experts, quantisation, logit soft-capping, non-SiLU activations, MLP/o biases.
    """
    hf = dict(hf)
    for name in _REFUSED_IF_SET:
        if hf.get(name):
            raise ValueError(f"hf config field {name!r}={hf[name]!r} is not supported by the decoder "
                             "(no mixture of experts, quantisation or soft-capping)")
    layer_types = hf.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"hf config field 'layer_types'={layer_types!r} is not supported (only full_attention "
                         "layers; sliding-window attention is not implemented)")
    for where in ("rope_scaling", "rope_parameters"):
        rope = hf.get(where)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise ValueError(f"hf config field {where!r}={rope!r} must be a dict or null")
        if not _rope_is_default(rope):
            raise ValueError(f"hf config field {where!r}={dict(rope)!r} is not supported (only default RoPE)")
        factor = rope.get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            raise ValueError(f"hf config field '{where}.partial_rotary_factor'={factor!r} is not supported")
        if where == "rope_scaling":  # a default-type rope_scaling dict carries nothing; from_hf would refuse it
            hf.pop(where)
            if "rope_theta" in rope and "rope_theta" not in hf:
                hf["rope_theta"] = rope["rope_theta"]
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"hf config field 'partial_rotary_factor'={hf['partial_rotary_factor']!r} is not supported")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if name not in hf:
            raise ValueError(f"hf config lacks the required field {name!r}")
    return DecoderConfig.from_hf(hf, **overrides)


def config_to_hf(cfg: DecoderConfig, family: Family, torch_dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` dict of ``cfg`` as a ``family`` checkpoint (inverse of ``config_from_hf``)."""
    check_family(cfg, family)
    hf: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.rms_eps,
        # Both spellings: transformers < 5 reads rope_theta, >= 5 rope_parameters.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
        "use_cache": True,
    }
    if family == "llama":
        hf["mlp_bias"] = False
    else:
        hf["use_sliding_window"] = False
    return hf


def check_family(cfg: DecoderConfig, family: str) -> None:
    """ValueError unless ``cfg`` is expressible as a ``family`` checkpoint (qkv biases iff qwen2, q/k norms
    iff qwen3)."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not one of {FAMILIES}")
    want = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}[family]
    if (cfg.qkv_bias, cfg.qk_norm) != want:
        raise ValueError(f"family={family!r} needs qkv_bias={want[0]}, qk_norm={want[1]}; the model has "
                         f"qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}")


def infer_family(cfg: DecoderConfig) -> Family:
    """The HF family a config corresponds to: qwen3 (q/k norms), qwen2 (qkv biases) or llama."""
    if cfg.qk_norm and cfg.qkv_bias:
        raise ValueError("DecoderConfig with both qkv_bias and qk_norm has no Hugging Face family here")
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"


# --- layout ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One HF tensor: where it goes in our parameter tree and how its layout differs.

    ``linear``: a torch ``Linear.weight`` of shape ``(out, in)``; ours is its transpose ``(in, out)``
    reshaped to ``ours_shape`` (heads split). Otherwise a plain reshape (embeddings, norms, biases)."""

    path: ParamPath
    hf_shape: tuple[int, ...]
    ours_shape: tuple[int, ...]
    linear: bool

    def to_ours(self, x: np.ndarray) -> np.ndarray:
        return (x.T if self.linear else x).reshape(self.ours_shape)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.hf_shape[::-1]).T if self.linear else x.reshape(self.hf_shape)


def hf_layout(cfg: DecoderConfig) -> dict[str, TensorSpec]:
    """HF tensor name -> ``TensorSpec`` for every parameter of ``Decoder(cfg)`` (see the module docstring)."""
    d, h, kv, hd, f, v = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size
    out: dict[str, TensorSpec] = {"model.embed_tokens.weight": TensorSpec(("embed",), (v, d), (v, d), False)}
    for i in range(cfg.n_layers):
        hf, blk = f"model.layers.{i}", ("blocks", i)
        heads = {"q": h, "k": kv, "v": kv}
        for name, n in heads.items():
            out[f"{hf}.self_attn.{name}_proj.weight"] = TensorSpec(
                (*blk, "attn", f"{name}_proj"), (n * hd, d), (d, n, hd), True)
            if cfg.qkv_bias:
                out[f"{hf}.self_attn.{name}_proj.bias"] = TensorSpec(
                    (*blk, "attn", f"{name}_bias"), (n * hd,), (n, hd), False)
        out[f"{hf}.self_attn.o_proj.weight"] = TensorSpec((*blk, "attn", "o_proj"), (d, h * hd), (h, hd, d), True)
        if cfg.qk_norm:
            for name in ("q", "k"):
                out[f"{hf}.self_attn.{name}_norm.weight"] = TensorSpec(
                    (*blk, "attn", f"{name}_norm", "scale"), (hd,), (hd,), False)
        out[f"{hf}.mlp.gate_proj.weight"] = TensorSpec((*blk, "mlp", "gate_proj"), (f, d), (d, f), True)
        out[f"{hf}.mlp.up_proj.weight"] = TensorSpec((*blk, "mlp", "up_proj"), (f, d), (d, f), True)
        out[f"{hf}.mlp.down_proj.weight"] = TensorSpec((*blk, "mlp", "down_proj"), (d, f), (f, d), True)
        out[f"{hf}.input_layernorm.weight"] = TensorSpec((*blk, "attn_norm", "scale"), (d,), (d,), False)
        out[f"{hf}.post_attention_layernorm.weight"] = TensorSpec((*blk, "mlp_norm", "scale"), (d,), (d,), False)
    out["model.norm.weight"] = TensorSpec(("final_norm", "scale"), (d,), (d,), False)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = TensorSpec(("lm_head",), (v, d), (d, v), True)
    return out


def _ignorable(name: str, cfg: DecoderConfig) -> bool:
    """Tensors a checkpoint may carry that we do not need: rotary caches, and lm_head when tied (checked
    against the embedding while loading)."""
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


# --- reading ---------------------------------------------------------------------------------------

def read_hf_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` dict of a checkpoint directory (FileNotFoundError naming it if absent)."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in checkpoint directory {str(directory)!r} "
                                f"(expected {CONFIG_FILE} and {WEIGHTS_FILE} or {INDEX_FILE})")
    with open(path) as f:
        return json.load(f)


def weight_files(directory: str | os.PathLike) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it, from ``model.safetensors.index.json`` if present,
    else from ``model.safetensors``'s header. FileNotFoundError names the directory and expected files."""
    directory = Path(directory)
    index_path, single_path = directory / INDEX_FILE, directory / WEIGHTS_FILE
    if index_path.is_file():
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path}: field 'weight_map' (tensor name -> shard file) is missing")
        files = {name: directory / fname for name, fname in weight_map.items()}
        absent = sorted({str(p.name) for p in files.values() if not p.is_file()})
        if absent:
            raise FileNotFoundError(f"{index_path} names shard files missing from {str(directory)!r}: {absent}")
        return files
    if single_path.is_file():
        with safe_open(single_path, framework="np") as f:
            return {name: single_path for name in f.keys()}
    raise FileNotFoundError(f"checkpoint directory {str(directory)!r} has neither {WEIGHTS_FILE} nor {INDEX_FILE}"
                            + ("" if directory.is_dir() else " (the directory does not exist)"))


def _headers(files: Mapping[str, Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, safetensors dtype) read from the file headers only (no tensor data)."""
    out = {}
    for path in sorted(set(files.values())):
        with safe_open(path, framework="np") as f:
            for name in f.keys():
                if files.get(name) == path:
                    sl = f.get_slice(name)
                    out[name] = (tuple(sl.get_shape()), sl.get_dtype())
    absent = sorted(set(files) - set(out))
    if absent:
        raise ValueError(f"the index maps tensors that are not in their shard files: {_listing(absent)}")
    return out


_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")


def _listing(names: list[str], limit: int = 20) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_tensors(cfg: DecoderConfig, headers: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
    """ValueError listing every missing, unexpected and mis-shaped tensor of a checkpoint for ``cfg``."""
    layout = hf_layout(cfg)
    missing = sorted(set(layout) - set(headers))
    unexpected = sorted(n for n in headers if n not in layout and not _ignorable(n, cfg))
    shapes = {n: spec.hf_shape for n, spec in layout.items()}
    if cfg.tie_embeddings and "lm_head.weight" in headers:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.d_model)
    wrong = [f"{n}: {headers[n][0]} (expected {shape})" for n, shape in shapes.items()
             if n in headers and headers[n][0] != shape]
    bad_dtype = [f"{n}: {headers[n][1]}" for n in shapes if n in headers and headers[n][1] not in _FLOAT_DTYPES]
    problems = []
    if missing:
        problems.append(f"missing tensors ({len(missing)}): {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors ({len(unexpected)}): {_listing(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes ({len(wrong)}): {_listing(wrong)}")
    if bad_dtype:
        problems.append(f"non-float tensors ({len(bad_dtype)}, expected one of {_FLOAT_DTYPES}): "
                        f"{_listing(bad_dtype)}")
    if problems:
        raise ValueError("checkpoint does not match its config.json "
                         f"(tie_word_embeddings={cfg.tie_embeddings}, qkv_bias={cfg.qkv_bias}, "
                         f"qk_norm={cfg.qk_norm}): " + "; ".join(problems))


def _resolve_shardings(shardings: Shardings | Callable[[DecoderConfig], Shardings] | None,
                       cfg: DecoderConfig) -> dict[ParamPath, jax.sharding.Sharding] | None:
    """Path -> sharding from an ``nnx.State`` of shardings (``state_shardings`` / ``abstract_sharded(...)[2]``)
    or of ``ShapeDtypeStruct``s with shardings (``abstract_sharded(...)[1]``), or a callable of the config
    returning one."""
    if shardings is None:
        return None
    if callable(shardings) and not isinstance(shardings, nnx.State):
        shardings = shardings(cfg)
    out = {}
    for path, leaf in nnx.to_flat_state(shardings):
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        value = value if isinstance(value, jax.sharding.Sharding) else getattr(value, "sharding", None)
        if not isinstance(value, jax.sharding.Sharding):
            raise ValueError(f"shardings: leaf {'/'.join(map(str, path))} is {type(value).__name__}, not a Sharding")
        out[tuple(path)] = value
    return out


def _place(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
    if sharding is None:
        return jnp.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def load_hf_state(
    directory: str | os.PathLike,
    cfg: DecoderConfig,
    shardings: Shardings | Callable[[DecoderConfig], Shardings] | None = None,
) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, parameter state) of ``Decoder(cfg)`` filled from the checkpoint's safetensors.

    Every tensor ``cfg`` implies must be present with its HF shape and nothing else (``check_tensors``).
    Parameters are cast to ``cfg.param_dtype`` and placed with ``shardings`` (a pytree of shardings shaped like
    the parameter state, e.g. ``abstract_sharded(...)[2]``, or a callable ``cfg -> shardings``) or on the
    default device. Host memory holds one tensor at a time.
    """
    files = weight_files(directory)
    headers = _headers(files)
    check_tensors(cfg, headers)
    with nnx.use_eager_sharding(False):
        abstract_model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract_model)
    abstract = {tuple(p): v for p, v in nnx.to_flat_state(abstract_state)}
    layout = hf_layout(cfg)
    layout_paths = {s.path for s in layout.values()}
    if layout_paths != set(abstract):  # the layout table must cover the module exactly
        raise AssertionError(f"hf_layout and Decoder disagree on {sorted(set(abstract) ^ layout_paths)}")
    placement = _resolve_shardings(shardings, cfg)
    if placement is not None and set(placement) != set(abstract):
        raise ValueError(f"shardings do not match the parameter tree: {sorted(set(placement) ^ set(abstract))}")
    param_dtype = jnp.dtype(cfg.param_dtype)

    loaded: dict[ParamPath, jax.Array] = {}
    by_file: dict[Path, list[str]] = {}
    for name in layout:
        by_file.setdefault(files[name], []).append(name)
    tied_head = cfg.tie_embeddings and "lm_head.weight" in files
    for path in sorted(by_file):
        with safe_open(path, framework="np") as f:
            for name in by_file[path]:
                spec = layout[name]
                host = np.ascontiguousarray(spec.to_ours(f.get_tensor(name)).astype(param_dtype))
                if host.shape != abstract[spec.path].get_value().shape:
                    raise AssertionError(f"{name}: converted shape {host.shape} != parameter shape")
                loaded[spec.path] = _place(host, None if placement is None else placement[spec.path])
                if tied_head and name == "model.embed_tokens.weight":
                    embed_host = host
                del host
    if tied_head:  # a tied checkpoint that still stores lm_head must store the embedding there
        with safe_open(files["lm_head.weight"], framework="np") as f:
            head = f.get_tensor("lm_head.weight").astype(param_dtype)
        if not np.array_equal(head, embed_host):
            raise ValueError("tie_word_embeddings=True but the checkpoint's lm_head.weight differs from "
                             "model.embed_tokens.weight; set tie_word_embeddings=false in config.json")
    state = nnx.from_flat_state([(p, v.replace(loaded[p])) for p, v in abstract.items()])
    return graphdef, state


def load_hf_checkpoint(
    directory: str | os.PathLike,
    *,
    dtype: str = "float32",
    param_dtype: str | None = None,
    shardings: Shardings | Callable[[DecoderConfig], Shardings] | None = None,
    **config_overrides: Any,
) -> Decoder:
    """A ``Decoder`` with the weights of a local HF checkpoint directory (llama / qwen2 / qwen3).

    ``dtype`` is the compute dtype, ``param_dtype`` (default: ``dtype``) the dtype parameters are cast to;
    ``shardings`` places parameters directly (see ``load_hf_state``); ``config_overrides`` go to
    ``DecoderConfig`` (e.g. ``max_seq_len``). Raises FileNotFoundError for missing files and ValueError for
    unsupported config fields or tensors that do not match the config.
    """
    hf = read_hf_config(directory)
    cfg = config_from_hf(hf, dtype=dtype, param_dtype=param_dtype or dtype, **config_overrides)
    graphdef, state = load_hf_state(directory, cfg, shardings)
    return nnx.merge(graphdef, state)


# --- writing ---------------------------------------------------------------------------------------

def save_hf_checkpoint(
    model: Decoder,
    directory: str | os.PathLike,
    family: Family | None = None,
    *,
    dtype: str | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Writes ``model`` as a Hugging Face ``family`` checkpoint: ``config.json`` plus ``model.safetensors``,
    or, when the tensors exceed ``max_shard_bytes``, ``model-0000i-of-0000n.safetensors`` shards and
    ``model.safetensors.index.json``. ``family`` defaults to the one the config implies (``infer_family``);
    ``dtype`` (default: the parameters' dtype) is the stored dtype, e.g. ``"bfloat16"``. Returns the directory.
    """
    cfg = model.cfg
    family = family or infer_family(cfg)
    check_family(cfg, family)
    params = {tuple(p): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    store_dtype = jnp.dtype(dtype) if dtype is not None else jnp.dtype(cfg.param_dtype)
    if store_dtype.name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype={dtype!r}: checkpoints are stored as float32, bfloat16 or float16")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config = config_to_hf(cfg, family, torch_dtype=store_dtype.name)

    tensors = {name: np.ascontiguousarray(spec.to_hf(np.asarray(jax.device_get(params[spec.path])))
                                          .astype(store_dtype))
               for name, spec in hf_layout(cfg).items()}
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    for stale in (directory / WEIGHTS_FILE, directory / INDEX_FILE):
        stale.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], directory / WEIGHTS_FILE, metadata=metadata)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, directory / fname, metadata=metadata)
            weight_map.update({name: fname for name in shard})
        index = {"metadata": {"total_size": int(sum(x.nbytes for x in tensors.values()))},
                 "weight_map": weight_map}
        with open(directory / INDEX_FILE, "w") as f:
            json.dump(index, f, indent=2)
    with open(directory / CONFIG_FILE, "w") as f:
        json.dump(hf_config, f, indent=2)
    return directory

