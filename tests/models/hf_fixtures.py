"""Tiny random Hugging Face checkpoints for the loader / parity tests, built in temporary directories.

``make_hf_checkpoint`` uses ``transformers`` itself (import it only where torch and transformers are
installed); ``random_decoder`` builds one of our decoders without torch. Nothing downloads anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


from sera_jax.models import decoder as D

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Per family: GQA (4 query heads over 2 KV heads) everywhere; llama is SmolLM2-like with tied embeddings,
# qwen2 has q/k/v biases and an untied head, qwen3 has q/k norms and an explicit head_dim != d / heads.
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                  rope_theta=100_000.0, rms_norm_eps=1e-5, max_position_embeddings=256),
    "qwen2": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                  rope_theta=10_000.0, rms_norm_eps=1e-6, max_position_embeddings=256),
    "qwen3": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=256),
}
FAMILIES = tuple(FAMILY_CONFIGS)
PAD_ID, EOS_ID = 0, 1


def hf_config(family: str, **overrides: Any):
    """A ``transformers`` config object of the tiny ``family`` model (eager attention, no default eos)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config}[family]
    kwargs = dict(FAMILY_CONFIGS[family], pad_token_id=PAD_ID, bos_token_id=None, eos_token_id=None)
    kwargs.update(overrides)
    config = cls(**kwargs)
    config._attn_implementation = "eager"
    return config


def randomize_(torch_model, seed: int, scale: float = 0.3) -> None:
    """Overwrites every parameter in place: ``scale * N(0, 1)``, and ``1 + scale * N(0, 1)`` for norm weights,
    so that biases and norm scales are not their trivial init (HF zero biases / unit norms would hide a
    mis-mapped tensor)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in torch_model.named_parameters():
            noise = scale * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(noise + (1.0 if name.endswith("norm.weight") else 0.0))


def make_hf_checkpoint(directory: str | os.PathLike, family: str, seed: int = 0,
                       max_shard_size: str | int | None = None, **overrides: Any):
    """Builds a tiny random ``family`` model with ``transformers`` (torch seed ``seed``), saves it with
    ``save_pretrained(directory, safe_serialization=True)`` and returns the float32 torch model (eval mode)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = hf_config(family, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    randomize_(model, seed)
    model.eval()
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(Path(directory), safe_serialization=True, **kwargs)
    return model


random_decoder = D.random_decoder  # the parity tests' name for it
