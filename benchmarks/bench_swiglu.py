"""The decoder's SwiGLU MLP forward + backward: the hand-written backward (``decoder.swiglu``, a ``custom_vjp``)
against ``jax.grad`` of the plain expression (autodiff), measured in the same run.

    .venv/bin/python benchmarks/bench_swiglu.py                       # the maze policy's update batch
    .venv/bin/python benchmarks/bench_swiglu.py --batch=8 --length=128 --repeats=5   # quick

Both sides compute ``grad`` w.r.t. x and the three weights of ``sum(c * swiglu(x, w_gate, w_up, w_down))``
for a fixed random cotangent c, jitted, on activations ``(B, L, d_model)`` of the given dtype. Defaults: the
paper's maze policy (``decoder.maze_full``: d_model 256, FFN 1,024) on the RL update batch of
``bench_update_vs_torch.py`` (B = 32 rollouts of L = 310 + 180 tokens), float32. Times are medians of
round-robin calls after compilation (a busy machine slows both sides alike). Check (a failure exits with
status 1): both sides' gradients agree to float rounding.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from common import median_ms, report_failures  # noqa: E402
from sera_jax.models import decoder as D  # noqa: E402


def plain_swiglu(x, w_gate, w_up, w_down):
    """The baseline: the same expression as ``decoder.swiglu``, differentiated by JAX."""
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def make_grad(mlp):
    """Jitted gradient of ``sum(c * mlp(...))`` w.r.t. x and the three weights."""
    def loss(x, w_gate, w_up, w_down, c):
        return jnp.sum((c * mlp(x, w_gate, w_up, w_down)).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=490)
    parser.add_argument("--d_model", type=int, default=D.maze_full().d_model)
    parser.add_argument("--ffn", type=int, default=D.maze_full().ffn_dim)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    dtype = jnp.dtype(args.dtype)
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (args.batch, args.length, args.d_model)).astype(dtype)
    w_gate = (jax.random.normal(keys[1], (args.d_model, args.ffn)) * args.d_model**-0.5).astype(dtype)
    w_up = (jax.random.normal(keys[2], (args.d_model, args.ffn)) * args.d_model**-0.5).astype(dtype)
    w_down = (jax.random.normal(keys[3], (args.ffn, args.d_model)) * args.ffn**-0.5).astype(dtype)
    c = jax.random.normal(keys[4], x.shape).astype(dtype)
    inputs = (x, w_gate, w_up, w_down, c)
    fns = {"hand-written": make_grad(D.swiglu), "autodiff": make_grad(plain_swiglu)}
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {os.cpu_count()} CPUs; SwiGLU forward + backward, "
          f"x ({args.batch}, {args.length}, {args.d_model}) {dtype.name}, FFN {args.ffn}")

    failures = []
    grads = {name: jax.device_get(fn(*inputs)) for name, fn in fns.items()}  # also compiles both
    rtol = 1e-4 if dtype == jnp.float32 else 3e-2
    for i, name in enumerate(("x", "w_gate", "w_up", "w_down")):
        got, want = (np.asarray(grads[k][i], np.float32) for k in ("hand-written", "autodiff"))
        err = float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))
        if not err <= rtol:
            failures.append(f"d{name}: hand-written vs autodiff relative error {err:.2e} > {rtol:.0e}")

    samples = {name: [] for name in fns}
    for _ in range(args.repeats):  # round-robin, so that load on the machine hits both sides alike
        for name, fn in fns.items():
            samples[name].append(median_ms(fn, *inputs, repeats=1, warmup=0))
    ms = {name: float(np.median(t)) for name, t in samples.items()}
    for name, t in ms.items():
        print(f"  {name:<14} {t:9.2f} ms")
    print(f"  autodiff / hand-written: {ms['autodiff'] / ms['hand-written']:.2f}x")
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
