"""Where the sampler's speed comes from: one ratio per gain, each on the same model and the same work (CPU).

    .venv/bin/python benchmarks/bench_sampler.py                     # both parts (~15 min on 2 shared cores)
    .venv/bin/python benchmarks/bench_sampler.py --part=hetero       # the heterogeneous workload only
    .venv/bin/python benchmarks/bench_sampler.py --part=cache --size=maze_full --batch=64 --prompt_len=308 --new_tokens=128

Part ``cache`` (fixed-length work: no stop token, every row runs all R steps):

* **KV cache** -- the sampler vs recomputing the whole prefix at every step (``sample_recompute``), with every
  row its own prompt (P = B copies), so that nothing is shared: the ratio is the cache alone. Check: both draw
  from the same Gumbel noise (the recompute baseline uses the sampler's per-rollout noise), so their tokens
  agree (>= 99%; only float round-off in a near-tie may differ).
* **prompt sharing** -- the sampler on P prompts x B / P rollouts each vs the same rows with each prompt copied
  into its own row (P = B): one prefill per prompt and one read of its cache per step for all its rollouts.
  Check: the shared call's tokens equal the recompute baseline's with the same noise (a rollout's noise is keyed
  by its prompt and its rank among that prompt's rollouts, so the copies draw other noise than the shared rows).

Part ``hetero`` (a math-like workload: ``--prompts`` prompts with 8..64 rollouts each, responses ended by a stop
token whose logit is forced to 0 by zeroing its (tied) embedding row, which gives geometric-like lengths from a
few tokens to the cap; the length distribution is printed):

* **layout** -- the sampler before shared-prompt decoding (``old_sample``, kept here verbatim as the baseline) vs the new
  one with every rollout in its own slot (``num_slots = B``): shared prompt cache, transposed keys, the ring
  response cache, the per-prompt batched attention;
* **refill** -- the new sampler with ``num_slots = B`` vs ``--slots`` slots refilled as rollouts end;
* **total** -- old vs new with refill: the target (>= 2x).

Checks (exit status 1 on failure): refill does not change the samples (same tokens, lengths, log-probs); the
new sampler's ``logp_policy`` equals teacher-forced log-probs from ``Decoder.__call__`` on its own samples; the
old and new samplers' mean lengths agree within 5 standard errors (they draw different noise).

Rates are generated tokens per second (a call's wall time, prefill included, compilation excluded: AOT), the
median of ``--repeats`` calls; each is also given as a fraction of this run's dense float32 matmul throughput
(useful FLOPs per second / matmul FLOPs per second; ``sampling_flops``). Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common import median_ms, report_failures, target_line
from sera_jax.models import decoder as D
from sera_jax.models import flops
from sera_jax.models import sampler as S
from sera_jax.models.decoder import Decoder, KVCache, init_cache

TARGET_HETERO = 2.0  # new sampler (with refill) vs the old one on the heterogeneous workload
MATMUL_N = 2048  # the matmul throughput reference (as bench_update_vs_torch.py)
LOGP_ATOL = 1e-3


def set_threads(threads: int) -> None:
    """One CPU for the whole process unless ``threads`` is 0: XLA:CPU's Eigen pool off (read when the backend
    starts, i.e. before the first computation) and the process pinned to one core, inherited by every thread
    started later (with the flags alone XLA:CPU's matmuls still used a second thread: process CPU time / wall
    time 1.3 on a 2048^2 matmul, JAX 0.10)."""
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def matmul_flops_per_s(repeats: int = 7) -> float:
    """Dense float32 ``MATMUL_N``^2 matmul FLOP/s of this process, now (the reference the fractions use)."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((MATMUL_N, MATMUL_N)), jnp.float32)
    matmul = jax.jit(jnp.matmul).lower(a, a).compile()
    return 2 * MATMUL_N**3 / (median_ms(matmul, a, a, repeats=repeats) / 1e3)


def read_bytes_per_s(mib: int = 256, repeats: int = 7) -> float:
    """Memory read bandwidth of this process: bytes per second of a jitted sum over ``mib`` MiB (a decoding
    step's cache and weights are read, not written)."""
    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum).lower(x).compile()
    return x.nbytes / (median_ms(total, x, repeats=repeats) / 1e3)


def sampling_flops(cfg: D.DecoderConfig, prompt_tokens: int, prompts: int, generated: int, mean_ctx: float,
                   prompt_len: int) -> float:
    """Useful FLOPs of a sampling call (``sera_jax.models.flops``): the prompts' prefill over their causal
    context, logits at each prompt's last token, and ``generated`` tokens decoded over ``mean_ctx`` keys each."""
    prefill = flops.forward_flops(cfg, prompt_tokens, (prompt_len + 1) / 2, prompts)
    return prefill + flops.forward_flops(cfg, generated, mean_ctx, generated)


def bench_config(size: str) -> D.DecoderConfig:
    if size == "maze_full":
        return D.maze_full()
    if size == "small":
        return D.DecoderConfig(vocab_size=32, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                               ffn_dim=512, qkv_bias=True, max_seq_len=1024)
    raise ValueError(f"size must be 'small' or 'maze_full', got size={size!r}")


def timed(fn, args, repeats: int):
    """(median seconds of ``repeats`` calls, compile seconds, last output) of an AOT-compiled ``fn(*args)``."""
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - start
    outs = []

    def call():
        outs.append(jax.block_until_ready(compiled(*args)))
        return outs[-1]

    return median_ms(call, repeats=repeats, warmup=0) / 1e3, compile_s, outs[-1]


# --- baselines ---------------------------------------------------------------------------------------

def sample_recompute(graphdef, state, prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, key, temperature,
                     noise_ids_B, noise_ranks_B, *, max_new_tokens: int):
    """Baseline without a cache: at step t, the full forward over the (B, T + R) buffer, sampling from the
    logits at column T - 1 + t with the sampler's noise (token t of the rollout of rank j of prompt i from
    fold_in(fold_in(fold_in(key, i), j), t), with (i, j) = (noise_ids_B[b], noise_ranks_B[b]) for row b);
    no stop tokens, so every row runs all R steps."""
    model = nnx.merge(graphdef, state)
    prompt_len = prompt_tokens_PxT.shape[1]
    total = prompt_len + max_new_tokens
    rows = jnp.take(prompt_tokens_PxT, prompt_ids_B, axis=0)
    lengths_B = jnp.take(prompt_lengths_P, prompt_ids_B)
    buffer = jnp.pad(rows, ((0, 0), (0, max_new_tokens)))
    col_L = jnp.arange(total)
    prompt_valid = (col_L[None, :] >= (prompt_len - lengths_B)[:, None]) & (col_L[None, :] < prompt_len)
    sample_rows = jax.vmap(S.sample_token, in_axes=(0, 0, None, None))
    row_keys_B = jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(key, i), j))(noise_ids_B, noise_ranks_B)

    def step(t, buffer):
        valid = prompt_valid | ((col_L >= prompt_len) & (col_L < prompt_len + t))[None, :]
        logits = model(buffer, D.positions_from_valid(valid), valid)
        logits_BxV = jax.lax.dynamic_index_in_dim(logits, prompt_len - 1 + t, axis=1, keepdims=False)
        gumbel_BxV = jax.vmap(lambda k: jax.random.gumbel(jax.random.fold_in(k, t), logits_BxV.shape[-1:],
                                                          jnp.float32))(row_keys_B)
        token, _, _ = sample_rows(gumbel_BxV, logits_BxV, temperature, 1.0)
        return jax.lax.dynamic_update_slice(buffer, token[:, None].astype(buffer.dtype), (0, prompt_len + t))

    buffer = jax.lax.fori_loop(0, max_new_tokens, step, buffer)
    return buffer[:, prompt_len:]


def _gather_rows(cache_P: KVCache, prompt_ids_B: jax.Array, extra: int) -> KVCache:
    """Cache rows of each rollout's prompt, with ``extra`` empty slots appended for the response."""
    def grow(x_PxAxSxD):
        rows = jnp.take(x_PxAxSxD, prompt_ids_B, axis=0)
        return jnp.pad(rows, ((0, 0), (0, 0), (0, extra), (0, 0)))

    return jax.tree.map(grow, cache_P)


def old_sample(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens_PxT: jax.Array,
    prompt_lengths_P: jax.Array,
    prompt_ids_B: jax.Array,
    key: jax.Array,
    temperature: jax.Array | float = 1.0,
    stop_tokens: jax.Array | tuple[int, ...] = (),
    *,
    max_new_tokens: int,
    top_p: float = 1.0,
    pad_id: int = 0,
) -> S.SampleOutput:
    """The sampler before shared-prompt decoding (verbatim but for names): every row holds a copy of its prompt's cache and
    attends over all T + R slots; all B rows decode until the longest finishes.

    ``prompt_tokens_PxT`` must be left-padded; ``prompt_lengths_P`` in [1, T]; ``stop_tokens`` a (possibly
    empty) list of ids that end a row (kept as the row's last token). ``temperature`` may be traced;
    ``max_new_tokens``, ``top_p`` and ``pad_id`` are static.
    """
    S.check_sample_arguments(max_new_tokens, top_p, prompt_tokens_PxT, prompt_lengths_P)
    model: Decoder = nnx.merge(graphdef, state)
    n_prompts, prompt_len = prompt_tokens_PxT.shape
    batch = prompt_ids_B.shape[0]
    stop_ids = jnp.asarray(stop_tokens, jnp.int32).reshape(-1)
    temperature = jnp.asarray(temperature, jnp.float32)

    # Prefill each prompt once.
    pad_P = (prompt_len - prompt_lengths_P).astype(jnp.int32)
    col_T = jnp.arange(prompt_len)
    positions_PxT = jnp.maximum(col_T[None, :] - pad_P[:, None], 0)
    cache_P = init_cache(model.cfg, n_prompts, prompt_len)
    # Left padding puts every prompt's last token in the last column: only its logits are needed. A
    # prompt's valid slots are [pad, T).
    logits_Px1xV, cache_P = model.decode(prompt_tokens_PxT, positions_PxT, cache_P, 0, pad_P, last_only=True)

    # Fan out to the rollout rows.
    cache = _gather_rows(cache_P, prompt_ids_B, max_new_tokens)
    logits_BxV = jnp.take(logits_Px1xV[:, 0], prompt_ids_B, axis=0)
    lengths_B = jnp.take(prompt_lengths_P, prompt_ids_B)
    # Row b's valid slots: its prompt [T - length, T), then the response slots written so far (causality
    # hides the unwritten ones), one span starting at T - length.
    kv_start_B = (prompt_len - lengths_B).astype(jnp.int32)
    sample_rows = jax.vmap(S.sample_token, in_axes=(0, 0, None, None))

    def draw(t, logits_BxV, done_B, out):
        """Sample step t for every row and record it (rows already done record PAD, mask 0)."""
        tokens_BxR, logp_pol_BxR, logp_smp_BxR = out
        # One threefry call per step for the whole batch (per-row keys would cost one each, mostly at
        # compile time); threefry is partitionable, so the noise does not depend on the sharding.
        gumbel_BxV = jax.random.gumbel(jax.random.fold_in(key, t), logits_BxV.shape, jnp.float32)
        token_B, logp_pol_B, logp_smp_B = sample_rows(gumbel_BxV, logits_BxV, temperature, top_p)
        token_B = jnp.where(done_B, pad_id, token_B).astype(jnp.int32)

        def write(buf, col):
            return jax.lax.dynamic_update_slice(buf, col[:, None], (0, t))

        out = (
            write(tokens_BxR, token_B),
            write(logp_pol_BxR, jnp.where(done_B, 0.0, logp_pol_B)),
            write(logp_smp_BxR, jnp.where(done_B, 0.0, logp_smp_B)),
        )
        active_B = ~done_B
        return token_B, active_B, done_B | jnp.isin(token_B, stop_ids), out

    def body(carry):
        t, token_B, cache, done_B, n_gen_B, out = carry
        # Feed the token drawn at step t - 1 (slot prompt_len + t - 1, position length + t - 1) ...
        slot = prompt_len + t - 1
        positions_Bx1 = (lengths_B + t - 1)[:, None]
        logits_Bx1xV, cache = model.decode(token_B[:, None], positions_Bx1, cache, slot, kv_start_B)
        # ... then draw step t.
        token_B, active_B, done_B, out = draw(t, logits_Bx1xV[:, 0], done_B, out)
        return t + 1, token_B, cache, done_B, n_gen_B + active_B, out

    def cond(carry):
        t, done_B = carry[0], carry[3]
        return (t < max_new_tokens) & ~jnp.all(done_B)

    out = (
        jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
        jnp.zeros((batch, max_new_tokens), jnp.float32),
        jnp.zeros((batch, max_new_tokens), jnp.float32),
    )
    done_B = jnp.zeros((batch,), bool)
    token_B, active_B, done_B, out = draw(0, logits_BxV, done_B, out)
    carry = (jnp.int32(1), token_B, cache, done_B, active_B.astype(jnp.int32), out)
    _, _, _, done_B, n_gen_B, (tokens_BxR, logp_pol_BxR, logp_smp_BxR) = jax.lax.while_loop(cond, body, carry)
    mask_BxR = jnp.arange(max_new_tokens)[None, :] < n_gen_B[:, None]
    return S.SampleOutput(tokens_BxR, mask_BxR, n_gen_B, done_B, logp_pol_BxR, logp_smp_BxR)


def make_old_sample_fn(
    graphdef: nnx.GraphDef,
    *,
    max_new_tokens: int,
    top_p: float = 1.0,
    pad_id: int = 0,
    in_shardings: Any = None,
    out_shardings: Any = None,
):
    """``jax.jit`` of ``old_sample`` with the static arguments bound (``sampler.make_sample_fn``'s signature).
    The result is called as
    ``fn(state, prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, key, temperature, stop_tokens)``;
    shardings (if given) are for those seven arguments / the ``SampleOutput``."""
    fn = functools.partial(old_sample, graphdef, max_new_tokens=max_new_tokens, top_p=top_p, pad_id=pad_id)
    kwargs = {}
    if in_shardings is not None:
        kwargs["in_shardings"] = in_shardings
    if out_shardings is not None:
        kwargs["out_shardings"] = out_shardings
    return jax.jit(fn, **kwargs)


# --- the parts ---------------------------------------------------------------------------------------

def random_prompts(cfg, rng, n: int, prompt_len: int):
    """``n`` left-padded prompts of lengths in [prompt_len / 2, prompt_len]."""
    lengths = rng.integers(prompt_len // 2, prompt_len + 1, n)
    tokens = rng.integers(3, cfg.vocab_size, (n, prompt_len))
    tokens = np.where(np.arange(prompt_len)[None, :] >= (prompt_len - lengths)[:, None], tokens, 0)
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32)


def rate_line(name: str, n_tokens: int, seconds: float, flops: float, matmul: float) -> str:
    return (f"{name:<34} {n_tokens / seconds:10.1f} tokens/s  ({seconds:.2f} s/call, "
            f"{flops / seconds / 1e9:6.1f} GFLOP/s = {100 * flops / seconds / matmul:5.1f}% of matmul)")


def part_cache(args, failures: list[str]) -> None:
    cfg = bench_config(args.size)
    model = D.random_decoder(cfg, seed=0, scale=0.1)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    if args.batch % args.prompts:
        raise ValueError(f"--prompts={args.prompts} must divide --batch={args.batch}")
    prompts, lengths = random_prompts(cfg, rng, args.prompts, args.prompt_len)
    per_prompt = args.batch // args.prompts
    ids = jnp.repeat(jnp.arange(args.prompts, dtype=jnp.int32), per_prompt)
    copies, copy_lengths = jnp.take(prompts, ids, axis=0), jnp.take(lengths, ids)  # every row its own prompt
    own = jnp.arange(args.batch, dtype=jnp.int32)
    key, temperature, no_stop = jax.random.key(0), jnp.float32(1.0), jnp.array([-1], jnp.int32)
    new_tokens = args.new_tokens

    sampler = S.make_sample_fn(graphdef, max_new_tokens=new_tokens)
    recompute = jax.jit(functools.partial(sample_recompute, graphdef, max_new_tokens=new_tokens))
    t_shared, _, out_shared = timed(sampler, (state, prompts, lengths, ids, key, temperature, no_stop), args.repeats)
    t_copies, _, out_copies = timed(sampler, (state, copies, copy_lengths, own, key, temperature, no_stop),
                                    args.repeats)
    zeros = jnp.zeros_like(own)  # copies: row b is rank 0 of its own prompt b
    t_full, _, tokens_full = timed(recompute, (state, copies, copy_lengths, own, key, temperature, own, zeros),
                                   args.repeats)
    # The shared call's rollouts are keyed by (prompt, rank): the recompute baseline with that noise, once.
    tokens_shared_ref = recompute(state, copies, copy_lengths, own, key, temperature, ids,
                                  S.rollout_ranks(ids, args.prompts))
    matmul = matmul_flops_per_s()

    n_tokens = args.batch * new_tokens
    mean_len = float(np.mean(np.asarray(lengths)))
    ctx = mean_len + (new_tokens + 1) / 2
    fl_copies = sampling_flops(cfg, args.batch * args.prompt_len, args.batch, n_tokens, ctx, args.prompt_len)
    fl_shared = sampling_flops(cfg, args.prompts * args.prompt_len, args.prompts, n_tokens, ctx, args.prompt_len)
    print(f"\n[cache] config={args.size} params={D.count_params(model):,} B={args.batch} P={args.prompts} "
          f"prompt_len<={args.prompt_len} new_tokens={new_tokens} backend={jax.default_backend()} "
          f"matmul {matmul / 1e9:.1f} GFLOP/s")
    print(rate_line("recompute prefix, P = B copies", n_tokens, t_full, fl_copies, matmul))
    print(rate_line("sampler, P = B copies", n_tokens, t_copies, fl_copies, matmul))
    print(rate_line(f"sampler, P = {args.prompts} shared", n_tokens, t_shared, fl_shared, matmul))
    print(f"ratio KV cache (copies / recompute):      {t_full / t_copies:6.2f}x  (the cache alone: nothing shared)")
    print(f"ratio prompt sharing (shared / copies):   {t_copies / t_shared:6.2f}x  (same rows, prompts cached once)")
    agree = float(np.mean(np.asarray(out_copies.tokens_BxR) == np.asarray(tokens_full)))
    agree_shared = float(np.mean(np.asarray(out_shared.tokens_BxR) == np.asarray(tokens_shared_ref)))
    same = agree_shared >= 0.99
    print(f"check: token agreement cache vs recompute {agree:.3f} (>= 0.99), shared vs recompute with the same "
          f"(prompt, rank) noise {agree_shared:.3f} (>= 0.99)")
    if agree < 0.99:
        failures.append(f"[cache] the cached and recomputing samplers agree on only {agree:.3f} of tokens")
    if not same:
        failures.append(f"[cache] the shared-prompt sampler agrees with its reference on only {agree_shared:.3f}")


def teacher_forced_error(model, prompts_PxT, ids_B, out, rows: int) -> float:
    """max |logp_policy - log-probs from Decoder.__call__ on the sampled rows| over the first ``rows`` rows."""
    rows_BxT = np.asarray(prompts_PxT)[np.asarray(ids_B)[:rows]]
    seq = np.concatenate([rows_BxT, np.asarray(out.tokens_BxR[:rows])], 1)
    valid = np.concatenate([rows_BxT != 0, np.asarray(out.mask_BxR[:rows])], 1)
    fn = jax.jit(lambda s, v: D.token_logprobs(model, s, D.positions_from_valid(v), v))
    ref = np.asarray(fn(jnp.asarray(seq), jnp.asarray(valid)))[:, rows_BxT.shape[1]:]
    return float(np.abs(np.asarray(out.logp_policy_BxR[:rows]) - ref).max())


def part_hetero(args, failures: list[str]) -> None:
    cfg = D.maze_full()
    model = D.random_decoder(cfg, seed=0, scale=0.1)
    stop = 1
    # The stop token's logit is h . e_stop (tied embeddings): a zero row pins it at 0, a hazard of about
    # 1 / sum_v exp(logit_v) per step whatever the context.
    model.embed[...] = model.embed[...].at[stop].set(0.0)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(1)
    counts = rng.integers(8, 65, args.prompts)
    batch = int(counts.sum())
    prompts, lengths = random_prompts(cfg, rng, args.prompts, args.prompt_len)
    ids = jnp.asarray(np.repeat(np.arange(args.prompts), counts), jnp.int32)
    call = (state, prompts, lengths, ids, jax.random.key(0), jnp.float32(1.0), jnp.array([stop], jnp.int32))
    cap = args.cap
    slots = min(args.slots, batch)

    t_old, c_old, out_old = timed(make_old_sample_fn(graphdef, max_new_tokens=cap), call, args.repeats)
    t_all, c_all, out_all = timed(S.make_sample_fn(graphdef, max_new_tokens=cap), call, args.repeats)
    t_new, c_new, out_new = timed(S.make_sample_fn(graphdef, max_new_tokens=cap, num_slots=slots), call,
                                  args.repeats)
    matmul = matmul_flops_per_s()

    def work(out):
        n = np.asarray(out.lengths_B)
        ctx = float(np.mean(np.asarray(lengths))) + float(np.sum(n * (n + 1) / 2) / max(n.sum(), 1))
        return int(n.sum()), sampling_flops(cfg, args.prompts * args.prompt_len, args.prompts, int(n.sum()), ctx,
                                            args.prompt_len)

    n_new = np.asarray(out_new.lengths_B)
    n_old = np.asarray(out_old.lengths_B)
    print(f"\n[hetero] maze_full, {args.prompts} prompts x 8..64 rollouts = B {batch} rollouts, prompt_len<="
          f"{args.prompt_len}, cap {cap}, {slots} slots with refill; matmul {matmul / 1e9:.1f} GFLOP/s")
    q = np.percentile(n_new, [0, 25, 50, 75, 100]).astype(int).tolist()
    print(f"lengths (new): min/q1/median/q3/max {q}, mean {n_new.mean():.1f}, at the cap {np.mean(n_new == cap):.1%}; "
          f"old mean {n_old.mean():.1f}; rollouts per prompt {counts.tolist()}")
    for name, t, c, out in (("old sampler (B rows)", t_old, c_old, out_old), ("new, B slots", t_all, c_all, out_all),
                            (f"new, {slots} slots + refill", t_new, c_new, out_new)):
        n_tok, fl = work(out)
        print(rate_line(name, n_tok, t, fl, matmul) + f" compile {c:.1f} s")
    print(f"ratio layout (old / new with B slots):    {t_old / t_all:6.2f}x  (shared prompts, new attention, ring)")
    print(f"ratio refill (B slots / {slots} slots):    {t_all / t_new:6.2f}x  (cost follows the sum of lengths)")
    print(f"ratio total (old / new with refill):      {t_old / t_new:6.2f}x")
    print(target_line(f"new >= {TARGET_HETERO:g}x old, heterogeneous lengths", f"{t_old / t_new:.2f}x",
                      t_old / t_new >= TARGET_HETERO))
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip((out_all.tokens_BxR, out_all.lengths_B, out_all.finished_B),
                   (out_new.tokens_BxR, out_new.lengths_B, out_new.finished_B)))
    err = teacher_forced_error(model, prompts, ids, out_new, rows=min(64, batch))
    se = np.sqrt(n_new.var() / batch + n_old.var() / batch)
    print(f"check: refill leaves the samples unchanged: {same}; max |logp_policy - teacher-forced| {err:.1e} "
          f"(tolerance {LOGP_ATOL:g}); mean length old - new {n_old.mean() - n_new.mean():+.1f} "
          f"(5 s.e. = {5 * se:.1f})")
    if not same:
        failures.append("[hetero] slot refill changed the samples")
    if err > LOGP_ATOL:
        failures.append(f"[hetero] logp_policy differs from teacher forcing by {err:.2e}")
    if abs(n_old.mean() - n_new.mean()) > 5 * se:
        failures.append("[hetero] old and new samplers' mean lengths differ by more than 5 standard errors")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="all", choices=["all", "cache", "hetero"])
    parser.add_argument("--size", default="small", choices=["small", "maze_full"], help="[cache] model")
    parser.add_argument("--batch", type=int, default=32, help="[cache] rollout rows B")
    parser.add_argument("--prompts", type=int, default=None,
                        help="distinct prompts P ([cache] default 4, rows spread evenly; [hetero] default 16)")
    parser.add_argument("--prompt_len", type=int, default=None, help="[cache] default 64, [hetero] default 128")
    parser.add_argument("--new_tokens", type=int, default=48, help="[cache] tokens per row")
    parser.add_argument("--cap", type=int, default=256, help="[hetero] max_new_tokens")
    parser.add_argument("--slots", type=int, default=128, help="[hetero] decoding slots of the refilling sampler")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="XLA:CPU threads: 1 (default) or 0 (XLA's default)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    failures: list[str] = []
    if args.part in ("all", "cache"):
        part_cache(argparse.Namespace(**{**vars(args), "prompts": args.prompts or 4,
                                         "prompt_len": args.prompt_len or 64}), failures)
    if args.part in ("all", "hetero"):
        part_hetero(argparse.Namespace(**{**vars(args), "prompts": args.prompts or 16,
                                          "prompt_len": args.prompt_len or 128}), failures)
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
