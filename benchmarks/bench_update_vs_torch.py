"""Tokens/s of the RL update (forward, backward, AdamW) against PyTorch doing the same, and against this machine's
dense float32 matmul throughput, measured in the same run.

    .venv/bin/python benchmarks/bench_update_vs_torch.py             # maze policy, B=32, prompt 308, response 128
    .venv/bin/python benchmarks/bench_update_vs_torch.py --batch=8 --prompt=64 --response=32 --steps=3  # quick
    .venv/bin/python benchmarks/bench_update_vs_torch.py --threads=1  # both sides single-threaded

Needs the ``parity`` extra (torch CPU, transformers). Model: the maze policy ``decoder.maze_full()`` (Qwen2-style,
4 layers, d=256, FFN 1024, 4 heads / 2 KV heads, vocab 32, tied embeddings, 3.9M parameters, float32) with
random weights (``random_decoder``), exported with ``save_hf_checkpoint`` and loaded by
``Qwen2ForCausalLM.from_pretrained`` (SDPA attention), so both sides start from the same parameters.

The batch is an RL update batch of the maze 17x17 layout: B rollouts of ``[prompt (left-padded to T) | response
(R tokens, right-padded)]``, random tokens, prompt lengths in [T/2, T] and response lengths in [R/4, R] (the first
row full), RoPE positions counted over valid tokens, advantages ``A_b ~ N(0, 1)`` and token weights
``w_bt = 1 / (valid response tokens)`` on valid response tokens. Both sides minimise
``L = -sum_bt w_bt A_b log pi(y_bt | prefix)`` over response tokens, clip the gradient to global norm 1 and take
one AdamW step (lr 1e-4, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01 on every tensor):

* ours: ``step.make_policy_gradient_update(graphdef, step.make_optimizer(...))``, compiled ahead of time, the
  state donated (what the trainer runs);
* PyTorch: ``Qwen2ForCausalLM(input_ids, attention_mask, position_ids, logits_to_keep=R + 1)`` (the output
  projection on the positions that predict response tokens only, as ours), ``log_softmax`` + gather, the same
  loss, ``backward``, ``clip_grad_norm_`` and ``torch.optim.AdamW`` (fused CPU kernel where available).

Threads: ``--threads N`` (default 2, this machine's core count) sets ``torch.set_num_threads(N)`` and XLA's CPU
intra-op pool (``PJRT_NPROC``, read when JAX's CPU backend starts); the run prints the pool sizes it finds
(torch's ``get_num_threads``, the number of XLA ``XLAEigen`` pool threads). ``--threads 0`` leaves each library
its default.

Checks, before any timing (exit status 1 on failure): on the first step the two losses and pre-clip gradient
norms agree to float tolerance, and the first parameter updates point the same way (cosine > 0.999 for a few
tensors and for all parameters together). Timing: ``--steps`` rounds, each ``[jnp matmul, ours, jnp matmul,
PyTorch, jnp matmul, torch matmul]`` (2048^2 float32 matmuls; every other round reversed), so that the calls of
a round share the load of a shared machine. The ratio and the matmul fraction are medians of the per-round
values (a round's own matmul reference: the median of its three jnp matmuls); tokens/s are per-side medians.
Nothing is asserted about time.

Wall time is the measure; each call's process CPU seconds (user + system, all threads) are printed too, with the ratio
and matmul fraction they give, because a loaded machine stretches wall time by descheduling threads.

Tokens per step are all B x (T + R) positions (padding included: both sides compute them). FLOPs per token,
counted as useful work: ``6 N`` for the matmul parameters N (all but the embedding table) in forward + backward,
``6 * 2 D V * R / (T + R)`` for the tied output projection on the R scored positions, and attention's
``12 * layers * ctx * (heads x head_dim)`` with ctx = (T + R + 1) / 2, the mean causal context (dense attention
computes the full (T + R)^2 square, twice that; the line below the result gives that count too).
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common import report_failures, target_line, torch_and_transformers
from sera_jax.models import decoder as D
from sera_jax.models import hf_loader
from sera_jax.rl import step as step_lib

TARGET_RATIO = 1.25  # the targets: >= 1.25x PyTorch's update tokens/s ...
TARGET_MATMUL_FRACTION = 0.60  # ... and >= 60% of this machine's dense float32 matmul FLOP/s
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-4, (0.9, 0.999), 1e-8, 0.01, 1.0
LOSS_RTOL = 1e-4  # float32, 4 layers, ~436 tokens: observed ~1e-6
NORM_RTOL = 1e-3
COSINE_MIN = 0.999
CHECKED_TENSORS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                   "model.layers.0.self_attn.k_proj.bias", "model.layers.{last}.mlp.down_proj.weight",
                   "model.norm.weight")
MATMUL_N = 2048
PAD_ID = 0


def xla_pool_threads() -> int:
    """Threads of XLA:CPU's intra-op (Eigen) pool in this process, counted by name (after the backend started)."""
    names = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:
            pass
    return sum(n for name, n in names.items() if "XLAEigen" in name)


def make_batch(cfg: D.DecoderConfig, batch: int, prompt: int, response: int, rng: np.random.Generator):
    """Host arrays of one update batch (see the module docstring): tokens, valid, positions (B, L), weights (B, R),
    advantages (B,)."""
    prompt_len_B = rng.integers(prompt // 2, prompt + 1, batch)
    response_len_B = rng.integers(max(1, response // 4), response + 1, batch)
    prompt_len_B[0], response_len_B[0] = prompt, response
    prompt_valid_BxT = np.arange(prompt)[None, :] >= (prompt - prompt_len_B)[:, None]
    response_valid_BxR = np.arange(response)[None, :] < response_len_B[:, None]
    valid_BxL = np.concatenate([prompt_valid_BxT, response_valid_BxR], axis=1)
    tokens_BxL = np.where(valid_BxL, rng.integers(3, cfg.vocab_size, valid_BxL.shape), PAD_ID).astype(np.int32)
    positions_BxL = np.asarray(D.positions_from_valid(jnp.asarray(valid_BxL)))
    weights_BxR = response_valid_BxR.astype(np.float32) / response_valid_BxR.sum()
    advantages_B = rng.standard_normal(batch).astype(np.float32)
    return tokens_BxL, valid_BxL, positions_BxL, weights_BxR, advantages_B


def hf_named_arrays(cfg: D.DecoderConfig, params) -> dict[str, np.ndarray]:
    """Our parameter state as HF tensors (name -> float64 array in HF's layout)."""
    flat = {tuple(p): v.get_value() for p, v in nnx.to_flat_state(params)}
    return {name: spec.to_hf(np.asarray(flat[spec.path], np.float64)) for name, spec in hf_loader.hf_layout(cfg).items()}


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def attention_name(cfg: D.DecoderConfig, length: int) -> str:
    """The attention implementation the decoder runs for a full sequence (``cfg.attention``, resolved)."""
    name = getattr(cfg, "attention", None)
    if name is None:
        return "dense (inline)"
    try:
        from sera_jax.models import attention as attention_lib

        resolved = attention_lib.resolve_implementation(name, length, length, cfg.dtype, cfg.head_dim)
    except (ImportError, AttributeError, TypeError):
        return name
    blocks = f", blocks {cfg.attention_block_q}x{cfg.attention_block_k}" if resolved == "blockwise" else ""
    return f"{name} -> {resolved}{blocks}"


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel(), b.ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


def flops_per_token(cfg: D.DecoderConfig, prompt: int, response: int, ctx: float) -> float:
    """Forward + backward FLOPs per sequence position (see the module docstring for what is counted)."""
    total = prompt + response
    matmul_params = D.count_params(nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))) \
        - cfg.vocab_size * cfg.d_model
    head = 6 * 2 * cfg.d_model * cfg.vocab_size * response / total / 2  # 2 D V FLOPs forward; x3 fwd + bwd
    return 6 * matmul_params + head + 12 * cfg.n_layers * ctx * cfg.n_heads * cfg.head_dim


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="rollouts B")
    parser.add_argument("--prompt", type=int, default=308, help="prompt length T (the maze 17x17 layout: 308)")
    parser.add_argument("--response", type=int, default=128, help="response length R")
    parser.add_argument("--steps", type=int, default=5, help="timed rounds (one update per side each; medians)")
    parser.add_argument("--threads", type=int, default=2,
                        help="CPU threads for each side (torch.set_num_threads, XLA's PJRT_NPROC); 0: defaults")
    args = parser.parse_args(argv)
    if args.threads > 0:  # read when JAX's CPU backend starts, i.e. at the first computation below
        os.environ["PJRT_NPROC"] = str(args.threads)
    libraries = torch_and_transformers(args.threads)
    if libraries is None:
        return 0
    torch, transformers = libraries

    cfg = D.maze_full()
    if args.prompt + args.response > cfg.max_seq_len:
        raise ValueError(f"--prompt + --response = {args.prompt + args.response} exceeds maze_full's max_seq_len "
                         f"{cfg.max_seq_len}")
    model = D.random_decoder(cfg, seed=0, scale=0.1)
    xla_threads = xla_pool_threads()  # the backend has started (random_decoder placed the parameters)
    with tempfile.TemporaryDirectory() as tmp:
        hf_loader.save_hf_checkpoint(model, tmp, "qwen2")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                                     attn_implementation="sdpa")
    hf_model.train()  # no dropout in Qwen2 (attention_dropout 0): train mode only keeps autograd's usual path
    rng = np.random.default_rng(0)
    tokens_BxL, valid_BxL, positions_BxL, weights_BxR, adv_B = make_batch(
        cfg, args.batch, args.prompt, args.response, rng)
    t, r = args.prompt, args.response
    n_tokens = tokens_BxL.size

    # Ours: the trainer's jitted update, compiled ahead of time, state donated.
    tx = step_lib.make_optimizer(LR, b1=BETAS[0], b2=BETAS[1], weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP)
    graphdef, state = step_lib.create_train_state(model, tx)
    update = step_lib.make_policy_gradient_update(graphdef, tx)
    batch = step_lib.SequenceBatch(jnp.asarray(tokens_BxL), jnp.asarray(valid_BxL), jnp.asarray(weights_BxR))
    advantages_B = jnp.asarray(adv_B)
    start = time.perf_counter()
    compiled = update.lower(state, batch, advantages_B).compile()
    compile_s = time.perf_counter() - start
    before = hf_named_arrays(cfg, state.params)
    state, metrics = compiled(state, batch, advantages_B)
    ours_update = {k: v - before[k] for k, v in hf_named_arrays(cfg, state.params).items()}
    ours_loss, ours_norm = float(metrics["loss"]), float(metrics["grad_norm"])

    # PyTorch: the same batch, loss, clipping and AdamW.
    params = list(hf_model.parameters())
    try:
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True)
        fused = True
    except (RuntimeError, TypeError):
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, foreach=True)
        fused = False
    input_ids = torch.tensor(tokens_BxL, dtype=torch.long)
    attention_mask = torch.tensor(valid_BxL.astype(np.int64))
    position_ids = torch.tensor(positions_BxL, dtype=torch.long)
    targets_BxR = input_ids[:, t:]
    scored_BxR = torch.tensor(valid_BxL[:, t:] & valid_BxL[:, t - 1:-1])
    coef_BxR = torch.tensor(weights_BxR * adv_B[:, None])

    def torch_step():
        optimizer.zero_grad(set_to_none=True)
        logits = hf_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          logits_to_keep=r + 1, use_cache=False).logits[:, :-1].float()  # (B, R, V)
        logp = torch.log_softmax(logits, -1).gather(-1, targets_BxR[..., None])[..., 0]
        loss = -(coef_BxR * torch.where(scored_BxR, logp, torch.zeros_like(logp))).sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP, foreach=True)
        optimizer.step()
        return float(loss.detach()), float(norm)

    hf_before = {name: p.detach().double().numpy().copy() for name, p in hf_model.named_parameters()}
    torch_loss, torch_norm = torch_step()
    torch_update = {name: p.detach().double().numpy() - hf_before[name] for name, p in hf_model.named_parameters()}

    # Checks, before any timing.
    failures = []
    loss_err = abs(ours_loss - torch_loss) / max(abs(torch_loss), 1e-12)
    norm_err = abs(ours_norm - torch_norm) / max(abs(torch_norm), 1e-12)
    if not loss_err < LOSS_RTOL:
        failures.append(f"first-step losses differ: ours {ours_loss:.8g}, PyTorch {torch_loss:.8g} "
                        f"(relative {loss_err:.2e} >= {LOSS_RTOL:g})")
    if not norm_err < NORM_RTOL:
        failures.append(f"first-step gradient norms differ: ours {ours_norm:.8g}, PyTorch {torch_norm:.8g} "
                        f"(relative {norm_err:.2e} >= {NORM_RTOL:g})")
    if set(ours_update) != set(torch_update):
        failures.append(f"parameter names differ: {sorted(set(ours_update) ^ set(torch_update))}")
    checked = [name.format(last=cfg.n_layers - 1) for name in CHECKED_TENSORS]
    cosines = {name: cosine(ours_update[name], torch_update[name]) for name in checked if name in torch_update}
    names = sorted(set(ours_update) & set(torch_update))
    cosines["all parameters"] = cosine(np.concatenate([ours_update[n].ravel() for n in names]),
                                       np.concatenate([torch_update[n].ravel() for n in names]))
    all_cos = {n: cosine(ours_update[n], torch_update[n]) for n in names}
    worst = min(all_cos, key=all_cos.get)
    for name, c in cosines.items():
        if not c > COSINE_MIN:
            failures.append(f"first update of {name}: cosine(ours, PyTorch) = {c:.6f} <= {COSINE_MIN}")
    if failures:  # a fast wrong answer is no result: no timing
        return report_failures(failures)

    # Timing: rounds of [jnp matmul, ours, jnp matmul, PyTorch, jnp matmul, torch matmul], every other round in
    # reverse order, so that each round's ratios compare calls made under the same load.
    a_jnp = jnp.asarray(rng.standard_normal((MATMUL_N, MATMUL_N)), jnp.float32)
    b_jnp = jnp.asarray(rng.standard_normal((MATMUL_N, MATMUL_N)), jnp.float32)
    matmul = jax.jit(jnp.matmul).lower(a_jnp, b_jnp).compile()
    a_t, b_t = torch.from_numpy(np.array(a_jnp)), torch.from_numpy(np.array(b_jnp))
    jax.block_until_ready(matmul(a_jnp, b_jnp))
    _ = a_t @ b_t
    xla_threads = max(xla_threads, xla_pool_threads())

    def run_ours():
        nonlocal state
        state, _ = compiled(state, batch, advantages_B)
        jax.block_until_ready(state)

    calls = {"ours": run_ours, "torch": torch_step, "jnp matmul": lambda: jax.block_until_ready(matmul(a_jnp, b_jnp)),
             "torch matmul": lambda: a_t @ b_t}
    order = ("jnp matmul", "ours", "jnp matmul", "torch", "jnp matmul", "torch matmul")
    rounds = []  # per round: name -> list of (wall s, CPU s)
    for i in range(args.steps):
        timed = collections.defaultdict(list)
        for name in (order if i % 2 == 0 else order[::-1]):
            cpu_start, start = cpu_seconds(), time.perf_counter()
            calls[name]()
            timed[name].append((time.perf_counter() - start, cpu_seconds() - cpu_start))
        rounds.append({name: np.median(np.array(v), axis=0) for name, v in timed.items()})

    def per_round(fn):
        return np.array([fn(rd) for rd in rounds])

    matmul_flops = 2 * MATMUL_N**3
    total = t + r
    fpt = flops_per_token(cfg, t, r, ctx=(total + 1) / 2)
    fpt_square = flops_per_token(cfg, t, r, ctx=total)
    sec = {name: float(np.median(per_round(lambda rd, n=name: rd[n][0]))) for name in calls}
    cpu = {name: float(np.median(per_round(lambda rd, n=name: rd[n][1]))) for name in calls}
    rate_ours, rate_torch = n_tokens / sec["ours"], n_tokens / sec["torch"]
    mm_jnp, mm_torch = matmul_flops / sec["jnp matmul"], matmul_flops / sec["torch matmul"]
    # Headline figures: medians of the per-round ratios (each round's calls share that round's load).
    ratios = per_round(lambda rd: rd["torch"][0] / rd["ours"][0])
    fracs = per_round(lambda rd: (n_tokens * fpt / rd["ours"][0]) / (matmul_flops / rd["jnp matmul"][0]))
    fracs_torch = per_round(lambda rd: (n_tokens * fpt / rd["torch"][0]) / (matmul_flops / rd["jnp matmul"][0]))
    ratio, frac_ours, frac_torch = float(np.median(ratios)), float(np.median(fracs)), float(np.median(fracs_torch))
    # The same two figures from CPU seconds (process user + system time during each call, all threads): a
    # loaded machine stretches wall time when it deschedules threads, much less the CPU time a call uses.
    cpu_ratio = float(np.median(per_round(lambda rd: rd["torch"][1] / rd["ours"][1])))
    cpu_frac = float(np.median(per_round(
        lambda rd: (n_tokens * fpt / rd["ours"][1]) / (matmul_flops / rd["jnp matmul"][1]))))

    print(f"RL update (forward + backward + AdamW), maze_full params={D.count_params(model):,} float32, "
          f"B={args.batch} T={t} R={r} ({n_tokens:,} tokens/step, {int(valid_BxL.sum()):,} valid), "
          f"steps={args.steps}")
    print(f"jax {jax.__version__} ({jax.default_backend()}), XLA intra-op pool threads={xla_threads} "
          f"(PJRT_NPROC={os.environ.get('PJRT_NPROC', 'unset')}); torch {torch.__version__} "
          f"threads={torch.get_num_threads()}, transformers {transformers.__version__} "
          f"(attn={hf_model.config._attn_implementation}, AdamW {'fused' if fused else 'foreach'}); ours: attention "
          f"{attention_name(cfg, t + r)}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"check: first-step loss ours {ours_loss:.7f} PyTorch {torch_loss:.7f} (relative {loss_err:.1e}); "
          f"grad norm ours {ours_norm:.5f} PyTorch {torch_norm:.5f} (relative {norm_err:.1e}): ok")
    print("check: cosine(first update ours, PyTorch): " + ", ".join(f"{n} {c:.6f}" for n, c in cosines.items())
          + f"; lowest of any tensor {worst} {all_cos[worst]:.6f}: ok")
    print(f"ours (jitted policy_gradient_update): {rate_ours:9.1f} tokens/s  ({sec['ours']:.3f} s/step, "
          f"{cpu['ours']:.2f} CPU s/step, compile {compile_s:.1f} s)")
    print(f"PyTorch (HF Qwen2 SDPA + AdamW)     : {rate_torch:9.1f} tokens/s  ({sec['torch']:.3f} s/step, "
          f"{cpu['torch']:.2f} CPU s/step)")
    print(f"dense float32 matmul {MATMUL_N}^2: jnp {mm_jnp / 1e9:.1f} GFLOP/s ({cpu['jnp matmul']:.3f} CPU s), "
          f"torch {mm_torch / 1e9:.1f} GFLOP/s ({cpu['torch matmul']:.3f} CPU s)")
    print(f"FLOPs/token {fpt / 1e6:.2f}M (6 x matmul params, tied head on R positions, attention at mean causal "
          f"context {(total + 1) / 2:.1f}); ours {100 * frac_ours:.1f}% and PyTorch {100 * frac_torch:.1f}% of jnp "
          f"matmul FLOP/s (counting the full {total}^2 attention square, {fpt_square / 1e6:.2f}M/token: ours "
          f"{100 * frac_ours * fpt_square / fpt:.1f}%)")
    print(f"by CPU seconds instead of wall time: ours/PyTorch = {cpu_ratio:.2f}x, ours = {100 * cpu_frac:.1f}% of the jnp "
          f"matmul's FLOPs per CPU second (informative: the targets below are wall clock)")
    print("per round (ours s / PyTorch s / jnp matmul GFLOP/s): " + ", ".join(
        f"{rd['ours'][0]:.2f}/{rd['torch'][0]:.2f}/{matmul_flops / rd['jnp matmul'][0] / 1e9:.0f}" for rd in rounds)
          + f"; ours/PyTorch per round {ratios.min():.2f}..{ratios.max():.2f}x, matmul fraction "
          f"{100 * fracs.min():.0f}..{100 * fracs.max():.0f}%")
    print("targets:")
    print(target_line(f"ours >= {TARGET_RATIO:g}x PyTorch update tokens/s (wall)", f"{ratio:.2f}x", ratio >= TARGET_RATIO))
    print(target_line(f"ours >= {100 * TARGET_MATMUL_FRACTION:.0f}% of dense matmul FLOP/s (wall)",
                      f"{100 * frac_ours:.1f}%", frac_ours >= TARGET_MATMUL_FRACTION))
    print(f"result (medians of per-round values): ours/PyTorch = {ratio:.2f}x ({'met' if ratio >= TARGET_RATIO else 'NOT met'}, target >= "
          f"{TARGET_RATIO:g}x); ours = {100 * frac_ours:.1f}% of matmul throughput "
          f"({'met' if frac_ours >= TARGET_MATMUL_FRACTION else 'NOT met'}, target >= "
          f"{100 * TARGET_MATMUL_FRACTION:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
