"""The decoder's model FLOPs and least HBM traffic per call, counted from its configuration.

Model FLOPs are the matmuls a call cannot avoid (2 per parameter per token, attention's two products), the
quantity MFU is defined on (recomputation under remat is not counted). XLA's cost analysis counts a loop's body
once, so for scanned layers and the sampler's decoding loop its count is a lower bound; these closed forms count
every iteration, and the planner's roofline takes the larger of the two (``sera_jax.train.plan``).

    per token, forward:   2 * block_params + 4 * L * H * hd * (visible keys)   [+ 2 * D * V where logits are needed]
    training:             3 x forward (the backward pass costs two forwards)
    decoding, per step:   every weight read once + each slot's KV cache read once
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from sera_jax.models.decoder import DecoderConfig


def block_params(cfg: DecoderConfig) -> int:
    """Parameters of the blocks' matmuls (everything but the embedding table and the norms)."""
    attn = cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * cfg.head_dim * cfg.d_model
    return cfg.n_layers * (attn + 3 * cfg.d_model * cfg.ffn_dim)


def head_flops(cfg: DecoderConfig) -> int:
    """FLOPs of one token's logits (the output projection, D x V)."""
    return 2 * cfg.d_model * cfg.vocab_size


def attention_flops_per_key(cfg: DecoderConfig) -> int:
    """FLOPs of one query token against one visible key, all layers: scores and weighted values, 2 x 2 per
    head x head_dim."""
    return 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim


def forward_flops(cfg: DecoderConfig, tokens: float, mean_keys: float, logit_tokens: float) -> float:
    """A forward pass over ``tokens`` tokens that see ``mean_keys`` keys on average, with logits at
    ``logit_tokens`` of them."""
    return tokens * (2 * block_params(cfg) + attention_flops_per_key(cfg) * mean_keys) + logit_tokens * head_flops(cfg)


def sampling_flops(cfg: DecoderConfig, prompts: int, prompt_len: int, rows: int, new_tokens: int) -> float:
    """A sampling call: each prompt prefilled once (causal: (T + 1) / 2 keys a token, logits at its last token),
    then ``new_tokens`` decoded for each of ``rows`` rows over the prompt and the response so far."""
    prefill = forward_flops(cfg, prompts * prompt_len, (prompt_len + 1) / 2, prompts)
    decode = forward_flops(cfg, rows * new_tokens, prompt_len + (new_tokens + 1) / 2, rows * new_tokens)
    return prefill + decode


def shared_prompt_training_flops(cfg: DecoderConfig, prompts: int, prompt_len: int, rows: int,
                                 response_len: int) -> float:
    """A gradient step where each prompt's tokens are computed once and ``rows`` responses attend to them,
    logits at the response tokens: 3 x forward."""
    prompt = forward_flops(cfg, prompts * prompt_len, (prompt_len + 1) / 2, 0)
    responses = forward_flops(cfg, rows * response_len, prompt_len + (response_len + 1) / 2, rows * response_len)
    return 3 * (prompt + responses)


def sequence_training_flops(cfg: DecoderConfig, rows: int, seq_len: int, logit_tokens_per_row: int) -> float:
    """A gradient step over ``rows`` full sequences of ``seq_len`` tokens, logits at ``logit_tokens_per_row`` of
    each: 3 x forward."""
    return 3 * forward_flops(cfg, rows * seq_len, (seq_len + 1) / 2, rows * logit_tokens_per_row)


def kv_bytes_per_token(cfg: DecoderConfig) -> int:
    """Bytes of one token's keys and values in the cache, all layers, at the activation dtype."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize


def decoding_bytes(cfg: DecoderConfig, weight_bytes: float, rows: int, slots: int, prompt_len: int,
                   new_tokens: int) -> float:
    """The least HBM traffic of a sampling call's decoding: ``rows`` rows decoded ``slots`` at a time, every
    weight (``weight_bytes``) read once per step and each row's cache (prompt + response so far) once per
    token."""
    steps = math.ceil(rows / max(1, min(slots, rows))) * new_tokens
    cache = rows * new_tokens * (prompt_len + (new_tokens + 1) / 2) * kv_bytes_per_token(cfg)
    return steps * weight_bytes + cache


def _eqn_flops(eqn) -> float:
    """FLOPs of one matmul or convolution equation (2 per multiply-add), 0 for anything else."""
    name = eqn.primitive.name  # read the output only here: some equations have none (checkify's checks)
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs, out = eqn.invars[0].aval, eqn.outvars[0].aval
        return 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in lhs_contract)
    if name == "conv_general_dilated":
        rhs, out = eqn.invars[1].aval, eqn.outvars[0].aval
        out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
        return 2.0 * math.prod(out.shape) * math.prod(rhs.shape) / rhs.shape[out_feature_dim]
    return 0.0


def jaxpr_flops(jaxpr) -> float:
    """The matmul and convolution FLOPs of a (closed) jaxpr, its sub-jaxprs included and a ``scan`` body counted
    ``length`` times; a ``while`` body (trip count unknown when traced) once, so a program with one is undercounted."""
    import jax.extend

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        total += _eqn_flops(eqn)
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += times * jaxpr_flops(sub)
    return total
