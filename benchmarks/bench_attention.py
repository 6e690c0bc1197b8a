"""Memory and time of the decoder's attention: "dense" (materialised (Q, S) mask and float32 scores, the
reference) against "blockwise" (flash attention in pure JAX with its own backward), measured in the same run.

    .venv/bin/python benchmarks/bench_attention.py            # every size below
    .venv/bin/python benchmarks/bench_attention.py --quick    # fewer repeats, without the 2,560-token row

Rows (float32, GQA as the models have it; spans as the RL batches have them: a left-padded prompt of a
random length in [L/4, L/2] and a right-padded response):

* attention forward + backward (``jax.grad`` of a scalar of the output w.r.t. q, k, v) at the maze cpu
  config (B = 128, L = 86: a 60-token 7x7 prompt + 26 response tokens, 4 heads / 2 KV heads of 8), the
  paper's maze policy (L = 490: MaxRL's 310-token 17x17 prompt + 180 response tokens, 4/2 heads of 64,
  B = 32 of its 4,096 rollouts), L = 1,024 (the memory test's size) and SmolLM2-360M's heads (15/5 of 64)
  at the math experiment's 2,560 tokens (B = 1);
* one decoding step over the KV cache (Q = 1, forward only), 10 steps per call as the sampler runs them;
* the whole decoder's policy-gradient loss (forward + backward of ``token_logprobs``) for the maze cpu model
  and the paper's maze policy (``maze_full``), which is what the RL update runs.

The maze lengths are the configs' own (``experiments.maze.experiment.sequence_length``: prompt + response
cap), so they follow the task. Temp bytes are XLA's ``memory_analysis().temp_size_in_bytes`` of the compiled
program; times are medians of round-robin calls after compilation (a busy machine slows both sides alike).
Checks (a failure exits with status 1): blockwise equals dense on every row and gradient.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from common import median_ms, report_failures  # noqa: E402
from experiments.maze import config as maze_config  # noqa: E402
from experiments.maze import experiment as maze_experiment  # noqa: E402
from sera_jax.models import attention as A  # noqa: E402
from sera_jax.models import decoder as D  # noqa: E402

IMPLEMENTATIONS = ("dense", "blockwise")
# Longest maze sequence (prompt + response cap) of the cpu config (7x7: 60 + 26) and of the paper's (17x17: 310 + 180).
MAZE_CPU_L = maze_experiment.sequence_length(maze_config.get_config("cpu"))
MAZE_FULL_L = maze_experiment.sequence_length(maze_config.get_config("gpu"))


def interleaved_medians_ms(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall time (ms) of each function, timed round-robin after one warm-up call each."""
    for fn in fns.values():
        median_ms(fn, repeats=1, warmup=1)
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(median_ms(fn, repeats=1, warmup=0))
    return {name: float(np.median(values)) for name, values in samples.items()}


def spans(rng, b, length):
    """[left-padded prompt | right-padded response] spans: start in [L/4, L/2], end in [3L/4, L]."""
    start = rng.integers(length // 4, length // 2 + 1, b)
    end = rng.integers(3 * length // 4, length + 1, b)
    return jnp.asarray(start, jnp.int32), jnp.asarray(end, jnp.int32)


def attention_inputs(rng, b, q_len, s_len, heads, kv_heads, d):
    q = jnp.asarray(rng.standard_normal((b, q_len, heads, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, kv_heads, s_len, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, kv_heads, s_len, d)), jnp.float32)
    return q, k, v


def train_fn(implementation, start, end, cotangent):
    def fn(q, k, v):
        seen = ~A.empty_rows(start, end, 0, q.shape[1])  # rows that see no key: implementation-defined
        loss = lambda q, k, v: jnp.sum(cotangent * seen[:, :, None, None] * A.attention(
            q, k, v, start, end, 0, implementation=implementation))
        return jax.grad(loss, (0, 1, 2))(q, k, v)
    return fn


def decode_fn(implementation, start, end, first_slot, steps=10):
    def fn(q, k, v):
        def body(i, acc):
            return acc + A.attention(q + acc, k, v, start, end, first_slot + i, implementation=implementation)
        return jax.lax.fori_loop(0, steps, body, jnp.zeros_like(q))
    return fn


def decoder_loss_fn(cfg, tokens, valid):
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0))))
    positions = D.positions_from_valid(valid)

    def fn(state):
        loss = lambda st: -jnp.sum(D.token_logprobs(nnx.merge(graphdef, st), tokens, positions, valid))
        return jax.grad(loss)(state)
    return fn


def max_rel_diff(a, b) -> float:
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(a)])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(b)])
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def compare(label, fns, args, repeats, failures, tol=1e-4):
    """One row: temp bytes and time of each implementation, the ratios, and the agreement check."""
    temp = {name: A.temp_bytes(fn, *args) for name, fn in fns.items()}
    jitted = {name: jax.jit(fn) for name, fn in fns.items()}
    outs = {name: fn(*args) for name, fn in jitted.items()}
    times = interleaved_medians_ms({name: (lambda f=fn: f(*args)) for name, fn in jitted.items()}, repeats)
    err = max_rel_diff(outs["blockwise"], outs["dense"])
    ok = err < tol
    if not ok:
        failures.append(f"{label}: blockwise differs from dense by {err:.2e} (relative)")
    d, bw = "dense", "blockwise"
    print(f"{label:44} {temp[d] / 2**20:>9.1f} {temp[bw] / 2**20:>9.1f} {temp[bw] / max(temp[d], 1):>7.3f}x "
          f"{times[d]:>9.1f} {times[bw]:>9.1f} {times[bw] / times[d]:>7.2f}x  {err:.0e} {'ok' if ok else 'FAILED'}",
          flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, no 2,560-token row")
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per implementation (median)")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    rng = np.random.default_rng(0)
    device = jax.devices()[0]
    print(f"attention: dense vs blockwise (blocks {A.DEFAULT_BLOCK_Q} x {A.DEFAULT_BLOCK_K}), float32")
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (wall clock: a busy machine inflates every row)\n")
    print(f"{'':44} {'temp MiB':>19} {'blockwise':>8} {'time ms':>19} {'blockwise':>8}  check")
    print(f"{'':44} {'dense':>9} {'blockwise':>9} {'/ dense':>8} {'dense':>9} {'blockwise':>9} {'/ dense':>8}")
    failures: list[str] = []

    sizes = [(f"maze cpu  B=128 L={MAZE_CPU_L:<4} A=4/2 D=8", 128, MAZE_CPU_L, 4, 2, 8),
             (f"maze full B=32  L={MAZE_FULL_L:<4} A=4/2 D=64", 32, MAZE_FULL_L, 4, 2, 64),
             ("          B=2   L=1024 A=4/2 D=64", 2, 1024, 4, 2, 64)]
    if not args.quick:
        sizes.append(("math 360M B=1 L=2560 A=15/5 D=64", 1, 2560, 15, 5, 64))
    print("attention forward + backward")
    for label, b, length, heads, kv_heads, d in sizes:
        q, k, v = attention_inputs(rng, b, length, length, heads, kv_heads, d)
        start, end = spans(rng, b, length)
        ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
        compare("  " + label, {impl: train_fn(impl, start, end, ct) for impl in IMPLEMENTATIONS}, (q, k, v),
                repeats, failures)

    print("decoding steps (Q = 1, forward, 10 steps per call)")
    decode_sizes = [(f"maze full B=64 S={MAZE_FULL_L:<4} A=4/2 D=64", 64, MAZE_FULL_L, 4, 2, 64),
                    ("math 360M B=8 S=2560 A=15/5 D=64", 8, 2560, 15, 5, 64)]
    for label, b, slots, heads, kv_heads, d in decode_sizes:
        q, k, v = attention_inputs(rng, b, 1, slots, heads, kv_heads, d)
        start = jnp.asarray(rng.integers(0, slots // 4, b), jnp.int32)
        end = jnp.full((b,), slots, jnp.int32)
        first = jnp.int32(slots * 3 // 5)  # a write index part-way through the response
        compare("  " + label, {impl: decode_fn(impl, start, end, first) for impl in IMPLEMENTATIONS}, (q, k, v),
                repeats, failures)

    print("decoder policy loss forward + backward (token_logprobs, the RL update)")
    maze_cpu_model = D.tiny(vocab_size=32, ffn_dim=128, max_seq_len=MAZE_CPU_L)
    for label, cfg, b, length in [(f"maze cpu model  B=128 L={MAZE_CPU_L}", maze_cpu_model, 128, MAZE_CPU_L),
                                  (f"maze_full 3.9M  B=16  L={MAZE_FULL_L}", D.maze_full(), 16, MAZE_FULL_L)]:
        tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, length)), jnp.int32)
        start, end = spans(rng, b, length)
        col = jnp.arange(length)
        valid = (col[None] >= start[:, None]) & (col[None] < end[:, None])
        state = nnx.state(D.random_decoder(cfg, seed=0, scale=0.05))
        fns = {impl: decoder_loss_fn(D.DecoderConfig(**{**cfg.__dict__, "attention": impl}), tokens, valid)
               for impl in IMPLEMENTATIONS}
        compare("  " + label, fns, (state,), repeats, failures, tol=1e-3)
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
