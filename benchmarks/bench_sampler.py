"""Tokens/s of the KV-cache sampler against recomputing the whole prefix at every step (same model, batch,
prompt lengths and number of new tokens; both jitted, both sampling with the same Gumbel noise).

    .venv/bin/python benchmarks/bench_sampler.py                  # small CPU config, well under 2 minutes
    .venv/bin/python benchmarks/bench_sampler.py --size=maze_full --batch=64 --prompt_len=308 --new_tokens=128

Prints both rates and their ratio (compilation excluded; median of --repeats timed runs). Correctness check
(exit status 1 on failure): both sample from the same Gumbel noise, so their tokens must agree (>= 99%;
only float round-off in a near-tie may differ). Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common import median_ms
from sera_jax.models import decoder as D
from sera_jax.rl import sampler as S


def bench_config(size: str) -> D.DecoderConfig:
    if size == "maze_full":
        return D.maze_full()
    if size == "small":
        return D.DecoderConfig(vocab_size=32, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                               ffn_dim=512, qkv_bias=True, max_seq_len=1024)
    raise ValueError(f"size must be 'small' or 'maze_full', got size={size!r}")


def sample_recompute(graphdef, state, prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, key, temperature, *,
                     max_new_tokens: int):
    """Baseline without a cache: at step t, run the full forward over the (B, L) buffer, L = T + R prompt and
    response columns, and sample from the logits at column T - 1 + t (no stop tokens, so every row runs all R
    steps)."""
    model = nnx.merge(graphdef, state)
    prompt_len = prompt_tokens_PxT.shape[1]
    total = prompt_len + max_new_tokens
    rows = jnp.take(prompt_tokens_PxT, prompt_ids_B, axis=0)
    lengths_B = jnp.take(prompt_lengths_P, prompt_ids_B)
    buffer = jnp.pad(rows, ((0, 0), (0, max_new_tokens)))
    col_L = jnp.arange(total)
    prompt_valid = (col_L[None, :] >= (prompt_len - lengths_B)[:, None]) & (col_L[None, :] < prompt_len)
    sample_rows = jax.vmap(S.sample_token, in_axes=(0, 0, None, None))

    def step(t, buffer):
        valid = prompt_valid | ((col_L >= prompt_len) & (col_L < prompt_len + t))[None, :]
        logits = model(buffer, D.positions_from_valid(valid), valid)
        logits_BxV = jax.lax.dynamic_index_in_dim(logits, prompt_len - 1 + t, axis=1, keepdims=False)
        gumbel_BxV = jax.random.gumbel(jax.random.fold_in(key, t), logits_BxV.shape, jnp.float32)
        token, _, _ = sample_rows(gumbel_BxV, logits_BxV, temperature, 1.0)
        return jax.lax.dynamic_update_slice(buffer, token[:, None].astype(buffer.dtype), (0, prompt_len + t))

    buffer = jax.lax.fori_loop(0, max_new_tokens, step, buffer)
    return buffer[:, prompt_len:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=["small", "maze_full"])
    parser.add_argument("--batch", type=int, default=32, help="rollout rows B")
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts P (rows are spread over them)")
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    cfg = bench_config(args.size)
    model = D.Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (args.prompts, args.prompt_len)), jnp.int32)
    lengths = jnp.asarray(rng.integers(args.prompt_len // 2, args.prompt_len + 1, args.prompts), jnp.int32)
    prompts = jnp.where(jnp.arange(args.prompt_len)[None, :] >= (args.prompt_len - lengths)[:, None], prompts, 0)
    ids = jnp.asarray(np.sort(rng.integers(0, args.prompts, args.batch)), jnp.int32)
    key, temperature = jax.random.key(0), jnp.float32(1.0)

    cached = S.make_sample_fn(graphdef, max_new_tokens=args.new_tokens)
    recompute = jax.jit(functools.partial(sample_recompute, graphdef, max_new_tokens=args.new_tokens))
    no_stop = jnp.array([-1], jnp.int32)
    cached_args = (state, prompts, lengths, ids, key, temperature, no_stop)
    recompute_args = (state, prompts, lengths, ids, key, temperature)
    t_cache = median_ms(cached, *cached_args, repeats=args.repeats) / 1e3
    t_full = median_ms(recompute, *recompute_args, repeats=args.repeats) / 1e3
    out, tokens_full = cached(*cached_args), recompute(*recompute_args)

    n_tokens = args.batch * args.new_tokens
    agree = float(np.mean(np.asarray(out.tokens_BxR) == np.asarray(tokens_full)))
    print(f"config={args.size} params={D.count_params(model):,} B={args.batch} P={args.prompts} "
          f"prompt_len={args.prompt_len} new_tokens={args.new_tokens} backend={jax.default_backend()}")
    print(f"kv-cache sampler : {n_tokens / t_cache:12.1f} tokens/s  ({t_cache * 1e3:.1f} ms)")
    print(f"recompute prefix : {n_tokens / t_full:12.1f} tokens/s  ({t_full * 1e3:.1f} ms)")
    print(f"ratio (cache / recompute): {t_full / t_cache:.2f}x   token agreement: {agree:.3f}")
    if agree < 0.99:
        print("CHECK FAILED: the two samplers disagree on more than 1% of tokens")
        sys.exit(1)


if __name__ == "__main__":
    main()
