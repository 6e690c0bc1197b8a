"""Tokens/s of our jitted sampler against Hugging Face ``transformers`` ``generate`` (PyTorch, CPU), same
architecture, weights and thread count, measured in the same run, with the checks of what is timed.

    .venv/bin/python benchmarks/bench_sampler_vs_hf.py --batch=64                # B=64 prompts, 1 rollout each
    .venv/bin/python benchmarks/bench_sampler_vs_hf.py --batch=256 --prompts=16  # 16 rollouts per prompt
    .venv/bin/python benchmarks/bench_sampler_vs_hf.py --quick                   # B=16, prompt 64, 32 new

Needs the ``parity`` extra (torch CPU, transformers). Model: the maze policy ``decoder.maze_full()`` (Qwen2-style,
4 layers, d=256, FFN 1024, 4 heads / 2 KV heads, vocab 32, tied embeddings) with random weights, exported with
``save_hf_checkpoint`` and loaded by ``Qwen2ForCausalLM.from_pretrained``, so both sides hold the same float32
parameters.

* ours: ``make_sample_fn`` (prompts prefilled once, shared prompt cache, B decoding slots), temperature 1, no
  stop token;
* HF: ``generate(do_sample=True, temperature=1, top_k=0, top_p=1, min_new_tokens=max_new_tokens)`` with its
  default (SDPA) attention and KV cache, no eos; ``--prompts P < B`` uses ``num_return_sequences = B / P``
  (HF prefills every copy, ours each prompt once).

Both sides run on one core by default (``--threads 1``: torch threads 1, XLA's Eigen pool off and the
process pinned to one CPU, ``bench_sampler.set_threads``; the flags alone left XLA:CPU's matmuls a second
thread): a fair per-core comparison that a shared, loaded machine distorts less. ``--threads 0`` leaves each
library its default thread pool. Rate = B x new_tokens
/ wall time of one call (prefill included), after the warm-up (ahead-of-time compilation for ours, a 2-token
generate for HF). Timing: ``--repeats`` rounds of [ours, HF] (every other round reversed) so that both sides of
a round share a shared machine's load; the ratio is the median of the rounds' ratios.

Also printed, to say where the time goes: our prefill alone (a call's unavoidable part: the same FLOPs as HF's
when P = B), one compiled decoding step at mid-response beside its floors (the bytes of weights and cache it
must read over this run's measured read bandwidth; its FLOPs over this run's matmul throughput), and the
call's useful FLOP/s as a fraction of this run's dense float32 matmul throughput (``bench_sampler.sampling_flops``),
and the bound on the ratio that any sampler doing this work could reach against this run's HF time: every
decoding step at its floor, after our measured prefill or after a prefill at matmul speed (with one rollout a
prompt the prefill is the same work on both sides, so it caps what a faster decoder can show).

Checks (exit status 1 on failure): (1) the timed sampler's ``logp_policy`` equals teacher-forced log-probs from
``Decoder.__call__`` on its own samples (first 16 rows); (2) greedy decoding (greedy=True) of 4 prompts gives
HF ``generate(do_sample=False)``'s tokens (>= 98% agreement: a float near-tie may flip a token and what follows);
(3) on a few HF-generated sequences our teacher-forced log-probs equal HF's within ``LOGP_ATOL``. Timings are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench_sampler import (read_bytes_per_s, matmul_flops_per_s, sampling_flops, set_threads,
                           teacher_forced_error)
from common import median_ms, report_failures, target_line, torch_and_transformers
from sera_jax.models import decode_attention as DA
from sera_jax.models import decoder as D
from sera_jax.models import flops as flops_lib
from sera_jax.models import hf_loader
from sera_jax.models import sampler as S

TARGET_RATIO = 3.0  # at least 3x HF generate with one rollout per prompt ...
TARGET_RATIO_SHARED = 4.0  # ... and 4x with 16 rollouts per prompt
LOGP_ATOL = 1e-3  # float32, 4 layers, sequences of ~436 tokens
GREEDY_AGREEMENT = 0.98


def parse_args(argv) -> argparse.Namespace:
    """The command line (``--quick`` sets B, the prompt and response lengths and the repeats)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="B=16, prompt 64, 32 new tokens, 3 repeats")
    parser.add_argument("--batch", type=int, default=64, help="rollout rows B")
    parser.add_argument("--prompts", type=int, default=None, help="distinct prompts P (default: B)")
    parser.add_argument("--prompt_len", type=int, default=308)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of [ours, HF] (median)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for each side (torch threads; XLA's Eigen pool off when 1); 0: library "
                             "defaults (all cores; on a shared, loaded machine torch's thread pool degrades badly)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.prompt_len, args.new_tokens, args.repeats = 16, 64, 32, 3
    return args


@dataclasses.dataclass
class Problem:
    """One sampling call: ``prompts`` (P) random prompts of ``T`` tokens, ``B`` rows (``per_prompt`` a prompt),
    ``R`` new tokens each."""

    T: int
    R: int
    B: int
    prompts: int
    per_prompt: int
    n_tokens: int
    prompts_PxT: np.ndarray
    ids_B: jax.Array
    lengths_P: jax.Array


def make_problem(args: argparse.Namespace, prompts: int, cfg: D.DecoderConfig, rng: np.random.Generator) -> Problem:
    """The call of ``args`` with ``prompts`` random prompts (the first draws of ``rng``)."""
    T, R, B = args.prompt_len, args.new_tokens, args.batch
    prompts_PxT = rng.integers(3, cfg.vocab_size, (prompts, T)).astype(np.int32)
    per_prompt = B // prompts
    return Problem(T=T, R=R, B=B, prompts=prompts, per_prompt=per_prompt, n_tokens=B * R, prompts_PxT=prompts_PxT,
                   ids_B=jnp.repeat(jnp.arange(prompts, dtype=jnp.int32), per_prompt),
                   lengths_P=jnp.full((prompts,), T, jnp.int32))


def load_models(torch, transformers):
    """``(cfg, model, hf_model)``: the maze policy with random weights and the same weights in HF's Qwen2."""
    cfg = D.maze_full()
    model = D.random_decoder(cfg, seed=0, scale=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        hf_loader.save_hf_checkpoint(model, tmp, "qwen2")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    return cfg, model, hf_model


def compile_ours(graphdef, state, pb: Problem):
    """``(compiled, call, compile seconds)``: P prompts prefilled once, B slots, no stop token (every rollout runs
    to the end), compiled ahead of time (the warm-up needs no untimed full run)."""
    sample = S.make_sample_fn(graphdef, max_new_tokens=pb.R)
    call = (state, jnp.asarray(pb.prompts_PxT), pb.lengths_P, pb.ids_B, jax.random.key(0), jnp.float32(1.0),
            jnp.asarray([-1], jnp.int32))
    start = time.perf_counter()
    compiled = sample.lower(*call).compile()
    return compiled, call, time.perf_counter() - start


def time_prefill(graphdef, cfg: D.DecoderConfig, state, pb: Problem, repeats: int) -> float:
    """Seconds of our prefill alone (a call's unavoidable part)."""
    prompts, T = pb.prompts, pb.T

    @jax.jit
    def prefill(state, tokens_PxT):
        m = nnx.merge(graphdef, state)
        cache = D.init_cache(cfg, prompts, T)
        positions = jnp.broadcast_to(jnp.arange(T), (prompts, T))
        return m.decode(tokens_PxT, positions, cache, 0, jnp.zeros((prompts,), jnp.int32), last_only=True)

    return median_ms(prefill, state, jnp.asarray(pb.prompts_PxT), repeats=repeats) / 1e3


def time_decoding_step(graphdef, cfg: D.DecoderConfig, state, pb: Problem, rng: np.random.Generator) -> float:
    """Median seconds of one compiled decoding step at mid-response (random caches, donated)."""
    prompts, T, R, B, ids_B = pb.prompts, pb.T, pb.R, pb.B, pb.ids_B
    n_kv, hd, layers = cfg.n_kv_heads, cfg.head_dim, cfg.n_layers
    caches = tuple(DA.SharedKV(jnp.asarray(rng.standard_normal((prompts, n_kv, T, hd)), jnp.float32),
                               jnp.asarray(rng.standard_normal((prompts, n_kv, T, hd)), jnp.float32),
                               jnp.zeros((B, n_kv, hd, R), jnp.float32), jnp.zeros((B, n_kv, R, hd), jnp.float32))
                   for _ in range(layers))
    tile = S.default_prompt_tile(B, prompts)

    def one_step(state, caches, tokens_S):
        m = nnx.merge(graphdef, state)
        schedule = DA.prompt_schedule(ids_B, jnp.ones((B,), bool), prompts, tile)
        n_valid = jnp.full((B,), R // 2, jnp.int32)
        return m.decode_shared(tokens_S, T + n_valid - 1, caches, jnp.zeros((prompts,), jnp.int32), ids_B, n_valid,
                               jnp.int32(R // 2 - 1), schedule)

    step = jax.jit(one_step, donate_argnums=1)
    tokens_S = jnp.zeros((B,), jnp.int32)
    step_times = []
    _, caches = step(state, caches, tokens_S)
    for _ in range(7):
        t0 = time.perf_counter()
        logits, caches = step(state, caches, tokens_S)
        jax.block_until_ready(logits)
        step_times.append(time.perf_counter() - t0)
    return float(np.median(step_times))


def make_hf_generate(torch, hf_model, pb: Problem):
    """HF's ``generate`` on token ids: sampling at temperature 1 with no top-k / top-p, forced to the full length
    (keyword overrides for the warm-up and greedy decoding)."""
    gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=pb.R, min_new_tokens=pb.R,
                      num_return_sequences=pb.per_prompt, eos_token_id=None, pad_token_id=0)

    def hf_generate(ids, **overrides):
        with torch.no_grad():
            return hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **(gen_kwargs | overrides))

    return hf_generate


def time_rounds(compiled, call, hf_generate, input_ids, repeats: int):
    """``(rounds, ours' last output, HF's last sequences)``: rounds of [ours, HF] (every other round reversed),
    so that both sides of a round share the machine's load."""
    rounds = []
    for i in range(repeats):
        sides = {}
        for side in (("ours", "hf") if i % 2 == 0 else ("hf", "ours")):
            start = time.perf_counter()
            if side == "ours":
                out = jax.block_until_ready(compiled(*call))
            else:
                sequences = hf_generate(input_ids)
            sides[side] = time.perf_counter() - start
        rounds.append(sides)
    return rounds, out, sequences


def run_checks(torch, model, graphdef, state, hf_model, hf_generate, input_ids, pb: Problem, out, sequences,
               failures: list[str]) -> dict:
    """Checks 1-3 (module docstring); their figures: ``tf_err``, ``g`` and ``agreement``, ``hf_err``."""
    T, R, g = pb.T, pb.R, min(4, pb.prompts)
    # Check 1: the timed sampler's policy log-probs against teacher forcing on its own samples.
    tf_err = teacher_forced_error(model, pb.prompts_PxT, pb.ids_B, out, rows=min(16, pb.B))
    if tf_err > LOGP_ATOL:
        failures.append(f"logp_policy of the timed sampler differs from teacher forcing by {tf_err:.2e}")
    # Check 2: greedy tokens against HF's greedy generate on 4 prompts.
    greedy = S.make_sample_fn(graphdef, max_new_tokens=R, greedy=True)(
        state, jnp.asarray(pb.prompts_PxT[:g]), pb.lengths_P[:g], jnp.arange(g, dtype=jnp.int32), jax.random.key(1),
        jnp.float32(0.0), jnp.asarray([-1], jnp.int32))
    hf_greedy = hf_generate(input_ids[:g], do_sample=False, num_return_sequences=1, top_k=None, top_p=None,
                            temperature=None)[:, T:].numpy()
    agreement = float(np.mean(np.asarray(greedy.tokens_BxR) == hf_greedy))
    if agreement < GREEDY_AGREEMENT:
        failures.append(f"greedy tokens agree with HF generate on only {agreement:.3f}")
    # Check 3: teacher-forced log-probs of a few HF samples, ours vs HF.
    rows = sequences[:4]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(input_ids=rows).logits.float(), -1).numpy()
    ours = np.asarray(jax.nn.log_softmax(model(jnp.asarray(rows.numpy(), jnp.int32)), -1))
    hf_err = float(np.abs(ours - ref).max())
    if hf_err > LOGP_ATOL:
        failures.append(f"teacher-forced log-probs ours vs HF differ by {hf_err:.2e}")
    return dict(tf_err=tf_err, g=g, agreement=agreement, hf_err=hf_err)


def print_rates(torch, transformers, model, pb: Problem, args, t: dict, rounds: list[dict], matmul_before: float,
                matmul_after: float, matmul: float, bandwidth: float, flops: float) -> None:
    """The run's shapes and libraries, this run's references, each side's tokens/s and the ratio."""
    print(f"maze_full params={D.count_params(model):,} B={pb.B} P={pb.prompts} prompt_len={pb.T} new_tokens={pb.R} "
          f"repeats={args.repeats} jax={jax.__version__} ({jax.default_backend()}) torch={torch.__version__} "
          f"threads={torch.get_num_threads()} transformers={transformers.__version__}")
    print(f"this run: dense float32 matmul {matmul_before / 1e9:.1f} / {matmul_after / 1e9:.1f} GFLOP/s (before / "
          f"after), read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"ours (jitted sampler)     : {pb.n_tokens / t['ours']:10.1f} tokens/s  ({t['ours']:.2f} s/call, compile "
          f"{t['compile']:.1f} s; {flops / t['ours'] / 1e9:.1f} GFLOP/s = {100 * flops / t['ours'] / matmul:.0f}% of "
          f"matmul)")
    print(f"HF generate (PyTorch CPU) : {pb.n_tokens / t['hf']:10.1f} tokens/s  ({t['hf']:.2f} s/call)")
    print(f"ratio (ours / HF): {t['ratio']:.2f}x (median of rounds: "
          + ", ".join(f"{r['hf'] / r['ours']:.2f}x" for r in rounds) + ")")


def print_where_time_goes(cfg: D.DecoderConfig, model, pb: Problem, t: dict, matmul: float,
                          bandwidth: float) -> float:
    """Our prefill and decoding beside the floors of a decoding step (memory: weights + the prompt caches + the
    valid response columns, read once; compute: its FLOPs at matmul speed); returns the step's floor."""
    prompts, T, R, B = pb.prompts, pb.T, pb.R, pb.B
    word = 4
    kv_per_column = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * word
    step_bytes = D.count_params(model) * word + kv_per_column * (prompts * T + B * R // 2)
    step_flops = flops_lib.forward_flops(cfg, B, T + R // 2, B)
    t_ours, t_hf, t_prefill, t_step = t["ours"], t["hf"], t["prefill"], t["step"]
    print(f"where ours goes: prefill {t_prefill:.2f} s ({100 * t_prefill / t_ours:.0f}% of a call; "
          f"{prompts * T} prompt tokens), decoding {t_ours - t_prefill:.2f} s = {R} steps of "
          f"{1e3 * (t_ours - t_prefill) / R:.1f} ms; the prefill alone bounds the ratio at {t_hf / t_prefill:.2f}x")
    # What any sampler doing this call's work could reach against this HF time: decoding steps at their floor
    # after our measured prefill, and after a prefill at this run's matmul speed (its FLOPs alone).
    step_floor = max(step_bytes / bandwidth, step_flops / matmul)
    prefill_floor = sampling_flops(cfg, prompts * T, prompts, 0, 0.0, T) / matmul
    print(f"bound on the ratio with every decoding step at its floor ({1e3 * step_floor:.1f} ms x {R}): "
          f"{t_hf / (t_prefill + R * step_floor):.2f}x after our prefill, "
          f"{t_hf / (prefill_floor + R * step_floor):.2f}x after a prefill at matmul speed ({prefill_floor:.2f} s)")
    print(f"one decoding step at mid-response ({B} slots, {T} + {R // 2} columns): {1e3 * t_step:.1f} ms; floors: "
          f"memory {1e3 * step_bytes / bandwidth:.1f} ms ({step_bytes / 2**20:.0f} MiB at {bandwidth / 1e9:.1f} GB/s), "
          f"compute {1e3 * step_flops / matmul:.1f} ms ({step_flops / 1e9:.2f} GFLOP at matmul speed); "
          f"step / max(floors) = {t_step / max(step_bytes / bandwidth, step_flops / matmul):.2f}")
    return step_floor


def print_checks_and_targets(checks: dict, pb: Problem, t: dict, step_floor: float) -> None:
    """The checks' figures and the targets (the ratio: 4x with 16 or more rollouts a prompt, else 3x)."""
    print(f"check 1: max |logp_policy - teacher-forced| on 16 of our samples = {checks['tf_err']:.1e} "
          f"(tolerance {LOGP_ATOL:g})")
    print(f"check 2: greedy tokens vs HF generate(do_sample=False), {checks['g']} prompts x {pb.R}: agreement "
          f"{checks['agreement']:.3f} (>= {GREEDY_AGREEMENT})")
    print(f"check 3: max |log-prob ours - HF| on 4 HF samples = {checks['hf_err']:.1e} (tolerance {LOGP_ATOL:g})")
    target = TARGET_RATIO_SHARED if pb.per_prompt >= 16 else TARGET_RATIO
    print("targets:")
    print(target_line(f"ours >= {target:g}x HF generate tokens/s", f"{t['ratio']:.2f}x", t["ratio"] >= target))
    print(target_line("decoding step <= 2x its floor", f"{t['step'] / step_floor:.2f}x", t["step"] <= 2 * step_floor))


def main(argv=None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)  # before JAX's CPU backend starts (the first computation below)
    prompts = args.prompts or args.batch
    if args.batch % prompts:
        raise ValueError(f"--prompts={prompts} must divide --batch={args.batch}")
    libraries = torch_and_transformers(args.threads)
    if libraries is None:
        return 0
    torch, transformers = libraries

    matmul_before = matmul_flops_per_s()
    cfg, model, hf_model = load_models(torch, transformers)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    pb = make_problem(args, prompts, cfg, rng)
    failures: list[str] = []
    compiled, call, compile_s = compile_ours(graphdef, state, pb)
    # Where our time goes: the prefill alone, and one decoding step at mid-response (caches donated).
    t = dict(compile=compile_s, prefill=time_prefill(graphdef, cfg, state, pb, args.repeats),
             step=time_decoding_step(graphdef, cfg, state, pb, rng))

    input_ids = torch.tensor(pb.prompts_PxT, dtype=torch.long)
    hf_generate = make_hf_generate(torch, hf_model, pb)
    torch.manual_seed(0)
    hf_generate(input_ids, max_new_tokens=2, min_new_tokens=2)  # warm-up on the same shapes
    # The ratio is the median of the rounds' ratios, each side's time its median.
    rounds, out, sequences = time_rounds(compiled, call, hf_generate, input_ids, args.repeats)
    t.update(ours=float(np.median([r["ours"] for r in rounds])), hf=float(np.median([r["hf"] for r in rounds])),
             ratio=float(np.median([r["hf"] / r["ours"] for r in rounds])))
    assert int(out.lengths_B.min()) == pb.R
    assert tuple(sequences.shape) == (pb.B, pb.T + pb.R), sequences.shape
    matmul_after = matmul_flops_per_s()
    matmul = max(matmul_before, matmul_after)  # the faster reference: fractions are not flattered by load
    bandwidth = read_bytes_per_s()
    checks = run_checks(torch, model, graphdef, state, hf_model, hf_generate, input_ids, pb, out, sequences, failures)

    flops = sampling_flops(cfg, prompts * pb.T, prompts, pb.n_tokens, pb.T + (pb.R + 1) / 2, pb.T)
    print_rates(torch, transformers, model, pb, args, t, rounds, matmul_before, matmul_after, matmul, bandwidth, flops)
    step_floor = print_where_time_goes(cfg, model, pb, t, matmul, bandwidth)
    print_checks_and_targets(checks, pb, t, step_floor)
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
