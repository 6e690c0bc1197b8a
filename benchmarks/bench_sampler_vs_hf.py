"""Tokens/s of our jitted KV-cache sampler against Hugging Face ``transformers`` ``generate`` (PyTorch, CPU),
same architecture and weights, measured in the same run.

    .venv/bin/python benchmarks/bench_sampler_vs_hf.py              # maze policy, B=64, prompt 308, 128 new (~3 min)
    .venv/bin/python benchmarks/bench_sampler_vs_hf.py --quick      # B=16, prompt 64, 32 new (~1 min)
    .venv/bin/python benchmarks/bench_sampler_vs_hf.py --prompts=8  # RL layout: 8 rollouts per prompt

Needs the ``parity`` extra (torch CPU, transformers). Model: the maze policy ``decoder.maze_full()`` (Qwen2-style,
4 layers, d=256, FFN 1024, 4 heads / 2 KV heads, vocab 32, tied embeddings) with random weights, exported with
``save_hf_checkpoint`` and loaded by ``Qwen2ForCausalLM.from_pretrained``, so both sides hold the same float32
parameters.

* ours: ``make_sample_fn`` (prefill, then a ``lax.while_loop`` over a KV cache), temperature 1, no stop token;
* HF: ``generate(do_sample=True, temperature=1, top_k=0, top_p=1, min_new_tokens=max_new_tokens)``
  with its default (SDPA) attention and KV cache, no eos.

Both sides run single-threaded by default (``--threads 1``: a fair per-core comparison that a shared, loaded
machine does not distort; ``--threads 0`` leaves each library its default thread pool).

Both generate exactly B x new_tokens tokens from the same full-length prompts; ``--prompts P < B`` gives each
prompt B / P rollouts (ours prefills each prompt once, HF's ``num_return_sequences`` prefills every copy).
Rate = B * new_tokens / wall time of one call (prefill included), median of ``--repeats`` calls after the
warm-up (ahead-of-time compilation for ours, a 2-token generate for HF). Check (exit status 1 on failure): on
a few HF-generated sequences, our teacher-forced log-probs equal HF's within ``LOGP_ATOL``. Timings are
reported, never asserted.

On a CPU both sides are compute-bound (prefill ~1/3 of a call, decoding the rest), so the ratio measures
kernels more than the sampler's design; Python dispatch overhead, which the jitted loop removes, matters on
an accelerator.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common import target_line, torch_and_transformers
from sera_jax.models import decoder as D
from sera_jax.models import hf_loader
from sera_jax.rl import sampler as S

TARGET_RATIO = 2.0  # the project's target: at least 2x HF generate's throughput
LOGP_ATOL = 1e-3  # float32, 4 layers, sequences of ~436 tokens


def median_s(fn, repeats: int) -> float:
    """Median wall time (s) of ``fn()`` over ``repeats`` calls; ``fn`` must block until its result is ready."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="B=16, prompt 64, 32 new tokens, 3 repeats")
    parser.add_argument("--batch", type=int, default=64, help="rollout rows B")
    parser.add_argument("--prompts", type=int, default=None, help="distinct prompts P (default: B)")
    parser.add_argument("--prompt_len", type=int, default=308)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per side (median)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for each side (torch threads; XLA's Eigen pool off when 1); 0: library "
                             "defaults (all cores; on a shared, loaded machine torch's thread pool degrades badly)")
    args = parser.parse_args(argv)
    if args.threads == 1:  # read when JAX's CPU backend starts, i.e. at the first computation below
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    if args.quick:
        args.batch, args.prompt_len, args.new_tokens, args.repeats = 16, 64, 32, 3
    prompts = args.prompts or args.batch
    if args.batch % prompts:
        raise ValueError(f"--prompts={prompts} must divide --batch={args.batch}")
    libraries = torch_and_transformers(args.threads)
    if libraries is None:
        return 0
    torch, transformers = libraries

    cfg = D.maze_full()
    model = D.random_decoder(cfg, seed=0, scale=0.1)
    graphdef, state = nnx.split(model)
    with tempfile.TemporaryDirectory() as tmp:
        hf_loader.save_hf_checkpoint(model, tmp, "qwen2")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    prompts_PxT = rng.integers(3, cfg.vocab_size, (prompts, args.prompt_len)).astype(np.int32)
    per_prompt = args.batch // prompts
    n_tokens = args.batch * args.new_tokens

    # Ours: P prompts prefilled once, B rows by prompt_ids_B, no stop token (every row runs to the end).
    sample = S.make_sample_fn(graphdef, max_new_tokens=args.new_tokens)
    call = (state, jnp.asarray(prompts_PxT), jnp.full((prompts,), args.prompt_len, jnp.int32),
            jnp.repeat(jnp.arange(prompts, dtype=jnp.int32), per_prompt), jax.random.key(0), jnp.float32(1.0),
            jnp.asarray([-1], jnp.int32))
    start = time.perf_counter()
    compiled = sample.lower(*call).compile()  # ahead of time: the warm-up needs no untimed full run
    compile_s = time.perf_counter() - start
    outs = []
    t_ours = median_s(lambda: outs.append(jax.block_until_ready(compiled(*call))), args.repeats)
    assert int(outs[-1].lengths_B.min()) == args.new_tokens

    # HF: same prompts, sampling at temperature 1 with no top-k / top-p, forced to the full length.
    input_ids = torch.tensor(prompts_PxT, dtype=torch.long)
    gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
                      min_new_tokens=args.new_tokens, num_return_sequences=per_prompt, eos_token_id=None,
                      pad_token_id=0)

    def hf_generate():
        with torch.no_grad():
            return hf_model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **gen_kwargs)

    torch.manual_seed(0)
    with torch.no_grad():  # warm-up: a short generate on the same shapes
        hf_model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **(gen_kwargs | dict(
            max_new_tokens=2, min_new_tokens=2)))
    hf_outs = []
    t_hf = median_s(lambda: hf_outs.append(hf_generate()), args.repeats)
    sequences = hf_outs[-1]
    assert tuple(sequences.shape) == (args.batch, args.prompt_len + args.new_tokens), sequences.shape

    # Check: teacher-forced log-probs of a few HF samples, ours vs HF.
    rows = sequences[:4]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(input_ids=rows).logits.float(), -1).numpy()
    ours = np.asarray(jax.nn.log_softmax(model(jnp.asarray(rows.numpy(), jnp.int32)), -1))
    err = float(np.abs(ours - ref).max())
    ok = err < LOGP_ATOL

    rate_ours, rate_hf = n_tokens / t_ours, n_tokens / t_hf
    print(f"maze_full params={D.count_params(model):,} B={args.batch} P={prompts} prompt_len={args.prompt_len} "
          f"new_tokens={args.new_tokens} repeats={args.repeats} jax={jax.__version__} ({jax.default_backend()}) "
          f"torch={torch.__version__} threads={torch.get_num_threads()} transformers={transformers.__version__}")
    print(f"ours (jitted KV-cache sampler) : {rate_ours:10.1f} tokens/s  ({t_ours:.2f} s/call, "
          f"compile {compile_s:.1f} s)")
    print(f"HF generate (PyTorch CPU)      : {rate_hf:10.1f} tokens/s  ({t_hf:.2f} s/call)")
    print(f"ratio (ours / HF): {rate_ours / rate_hf:.2f}x")
    print(f"check: max |log-prob ours - HF| on 4 sampled sequences = {err:.2e} (tolerance {LOGP_ATOL:g}): "
          f"{'ok' if ok else 'FAILED'}")
    print("targets:")
    print(target_line(f"ours >= {TARGET_RATIO:g}x HF generate tokens/s", f"{rate_ours / rate_hf:.2f}x",
                      rate_ours / rate_hf >= TARGET_RATIO))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
