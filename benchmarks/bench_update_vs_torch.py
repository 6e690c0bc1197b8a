"""Tokens/s of the RL update (forward, backward, AdamW) against PyTorch doing the same, and against this machine's
dense float32 matmul throughput, measured in the same run.

    .venv/bin/python benchmarks/bench_update_vs_torch.py   # maze policy, B=32 (4 prompts x 8), prompt 310, response 180
    .venv/bin/python benchmarks/bench_update_vs_torch.py --rollouts_per_prompt=1  # 32 distinct prompts
    .venv/bin/python benchmarks/bench_update_vs_torch.py --batch=8 --prompt=64 --response=32 --steps=3  # quick
    .venv/bin/python benchmarks/bench_update_vs_torch.py --threads=1  # every side single-threaded

Needs the ``parity`` extra (torch CPU, transformers). Model: the maze policy ``decoder.maze_full()`` (Qwen2-style,
4 layers, d=256, FFN 1024, 4 heads / 2 KV heads, vocab 32, tied embeddings, 3.9M parameters, float32) with
random weights (``random_decoder``), exported with ``save_hf_checkpoint`` and loaded by
``Qwen2ForCausalLM.from_pretrained`` (SDPA attention), so both sides start from the same parameters.

The batch is an RL update batch of the maze 17x17 layout (MaxRL's: 310-token prompts, responses of up to 180):
B rollouts, ``--rollouts_per_prompt`` K of each of B / K prompts (an RL batch samples several rollouts of a prompt;
K = 1 gives B distinct prompts), as ``[prompt (left-padded to T) | response (R tokens, right-padded)]``, random
tokens, prompt lengths in [T/2, T] and response lengths in [R/4, R] (the first prompt and row full), RoPE
positions counted over valid tokens, advantages ``A_b ~ N(0, 1)`` and token weights
``w_bt = 1 / (valid response tokens)`` on valid response tokens. Both sides minimise
``L = -sum_bt w_bt A_b log pi(y_bt | prefix)`` over response tokens, clip the gradient to global norm 1 and take
one AdamW step (lr 1e-4, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01 on every tensor):

* ours, joined: ``step.make_policy_gradient_update(graphdef, step.make_optimizer(...))`` on the
  ``SequenceBatch`` of the B joined sequences (the same computation as PyTorch's), compiled ahead of time, the
  state donated;
* ours, shared prompts (with K > 1): the same update on the ``SharedPromptBatch`` of the same rollouts, the
  trainer's layout (``rl.share_prompts``): each prompt runs through the model once, B x R + (B / K) x T
  positions instead of B x (T + R);
* PyTorch: ``Qwen2ForCausalLM(input_ids, attention_mask, position_ids, logits_to_keep=R + 1)`` (the output
  projection on the positions that predict response tokens only, as ours), ``log_softmax`` + gather, the same
  loss, ``backward``, ``clip_grad_norm_`` and ``torch.optim.AdamW`` (fused CPU kernel where available).

Threads: ``--threads N`` (default 2, this machine's core count) sets ``torch.set_num_threads(N)`` and XLA's CPU
intra-op pool (``PJRT_NPROC``, read when JAX's CPU backend starts); the run prints the pool sizes it finds
(torch's ``get_num_threads``, the number of XLA ``XLAEigen`` pool threads). ``--threads 0`` leaves each library
its default.

Checks, before any timing (exit status 1 on failure): on the first step each of our losses and pre-clip gradient
norms agrees with PyTorch's to float tolerance, and the first parameter updates point the same way (cosine >
0.999 for a few tensors and for all parameters together). Timing: ``--steps`` rounds, each ``[jnp matmul, ours
joined, jnp matmul, ours shared, jnp matmul, PyTorch, jnp matmul, torch matmul]`` (2048^2 float32 matmuls; every
other round reversed), so that the calls of a round share the load of a shared machine. Ratios and matmul
fractions are medians of the per-round values (a round's own matmul reference: the median of its jnp matmuls);
tokens/s are per-side medians. Nothing is asserted about time.

Wall time is the measure; each call's process CPU seconds (user + system, all threads) are printed too, with the ratio
and matmul fraction they give, because a loaded machine stretches wall time by descheduling threads.

Tokens per step are the batch's B x (T + R) positions (padding included) for every side: tokens/s say how fast
each trains on the same batch. FLOPs, counted as the work each side does (for the matmul fraction): ``6 N`` per
position through the model for the matmul parameters N (all but the embedding table) in forward + backward
(B x (T + R) positions joined, B x R + (B / K) x T shared), ``6 D V`` per scored position for the tied output
projection (B x R), and attention's ``12 * layers * (heads x head_dim)`` per visible (query, key) pair under
causality (joined: (T + R)(T + R + 1) / 2 per row; shared: T(T + 1) / 2 per prompt, and T + j + 1 keys for
response query j; dense attention computes the full square, about twice that).
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
LOSS_RTOL = 1e-4  # float32, 4 layers, 490 tokens: observed ~2e-7
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


def make_batch(cfg: D.DecoderConfig, batch: int, prompt: int, response: int, rollouts_per_prompt: int,
               rng: np.random.Generator):
    """Host arrays of one update batch (see the module docstring): tokens, valid, positions (B, L), weights (B, R),
    advantages (B,), and the shared layout's prompts: tokens (P, T), lengths (P,), prompt of each row (B,)."""
    num_prompts = batch // rollouts_per_prompt
    prompt_len_P = rng.integers(prompt // 2, prompt + 1, num_prompts)
    response_len_B = rng.integers(max(1, response // 4), response + 1, batch)
    prompt_len_P[0], response_len_B[0] = prompt, response
    prompt_valid_PxT = np.arange(prompt)[None, :] >= (prompt - prompt_len_P)[:, None]
    prompts_PxT = np.where(prompt_valid_PxT, rng.integers(3, cfg.vocab_size, prompt_valid_PxT.shape),
                           PAD_ID).astype(np.int32)
    prompt_ids_B = np.repeat(np.arange(num_prompts, dtype=np.int32), rollouts_per_prompt)
    response_valid_BxR = np.arange(response)[None, :] < response_len_B[:, None]
    responses_BxR = np.where(response_valid_BxR, rng.integers(3, cfg.vocab_size, response_valid_BxR.shape),
                             PAD_ID).astype(np.int32)
    valid_BxL = np.concatenate([prompt_valid_PxT[prompt_ids_B], response_valid_BxR], axis=1)
    tokens_BxL = np.concatenate([prompts_PxT[prompt_ids_B], responses_BxR], axis=1)
    positions_BxL = np.asarray(D.positions_from_valid(jnp.asarray(valid_BxL)))
    weights_BxR = response_valid_BxR.astype(np.float32) / response_valid_BxR.sum()
    advantages_B = rng.standard_normal(batch).astype(np.float32)
    return (tokens_BxL, valid_BxL, positions_BxL, weights_BxR, advantages_B), (prompts_PxT, prompt_len_P, prompt_ids_B)


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


def update_flops(cfg: D.DecoderConfig, batch: int, prompt: int, response: int, num_prompts: int | None) -> float:
    """Forward + backward FLOPs of one update (see the module docstring): joined sequences with
    ``num_prompts=None``, else the shared layout with that many prompts."""
    matmul_params = D.count_params(nnx.eval_shape(lambda: D.Decoder(cfg, rngs=nnx.Rngs(0)))) \
        - cfg.vocab_size * cfg.d_model
    total = prompt + response
    if num_prompts is None:
        positions, pairs = batch * total, batch * total * (total + 1) / 2
    else:
        queries = response - 1  # response positions through the model: the last token predicts nothing
        positions = num_prompts * prompt + batch * queries
        pairs = num_prompts * prompt * (prompt + 1) / 2 + batch * (queries * prompt + queries * (queries + 1) / 2)
    head = 6 * cfg.d_model * cfg.vocab_size * batch * response  # 2 D V forward per scored position, x3
    return 6 * matmul_params * positions + head + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs


def parse_args(argv) -> argparse.Namespace:
    """The command line, checked (``--rollouts_per_prompt`` must divide ``--batch``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="rollouts B")
    parser.add_argument("--rollouts_per_prompt", type=int, default=8,
                        help="K rollouts of each of B / K prompts (1: B distinct prompts, no shared side)")
    parser.add_argument("--prompt", type=int, default=310, help="prompt length T (MaxRL's maze 17x17 layout: 310)")
    parser.add_argument("--response", type=int, default=180, help="response length R (MaxRL's maze: 180)")
    parser.add_argument("--steps", type=int, default=5, help="timed rounds (one update per side each; medians)")
    parser.add_argument("--threads", type=int, default=2,
                        help="CPU threads for each side (torch.set_num_threads, XLA's PJRT_NPROC); 0: defaults")
    args = parser.parse_args(argv)
    if args.rollouts_per_prompt < 1 or args.batch % args.rollouts_per_prompt:
        parser.error(f"--rollouts_per_prompt={args.rollouts_per_prompt} must be >= 1 and divide --batch={args.batch}")
    return args


def load_models(args: argparse.Namespace, torch, transformers):
    """``(cfg, model, hf_model, xla_threads)``: the maze policy with random weights, the same weights in HF's
    Qwen2 (SDPA), and the XLA pool threads once the backend has started."""
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
    return cfg, model, hf_model, xla_threads


class OurUpdates:
    """Ours: the trainer's jitted update, compiled ahead of time, state donated; one state per layout (``sides``:
    "ours", the joined sequences, and "ours shared", the shared prompts), each after its first step."""

    def __init__(self, cfg: D.DecoderConfig, model, sides: list[str], rows, prompts, prompt_len: int):
        (tokens_BxL, valid_BxL, _, weights_BxR, adv_B), (prompts_PxT, prompt_len_P, prompt_ids_B) = rows, prompts
        t = prompt_len
        tx = step_lib.make_optimizer(LR, b1=BETAS[0], b2=BETAS[1], weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP)
        update = step_lib.make_policy_gradient_update(step_lib.create_train_state(model, tx)[0], tx)
        self.advantages_B = jnp.asarray(adv_B)
        self.batches = {
            "ours": step_lib.SequenceBatch(jnp.asarray(tokens_BxL), jnp.asarray(valid_BxL), jnp.asarray(weights_BxR)),
            "ours shared": step_lib.SharedPromptBatch(
                jnp.asarray(prompts_PxT), jnp.asarray(prompt_len_P, jnp.int32),
                step_lib.RolloutRows(jnp.asarray(prompt_ids_B), jnp.asarray(tokens_BxL[:, t:]),
                                     jnp.asarray(valid_BxL[:, t:]), jnp.asarray(weights_BxR)))}
        self.states, self.compiled, self.compile_s, self.first = {}, {}, {}, {}
        for side in sides:
            self.states[side] = step_lib.create_train_state(model, tx)[1]
            start = time.perf_counter()
            self.compiled[side] = update.lower(self.states[side], self.batches[side], self.advantages_B).compile()
            self.compile_s[side] = time.perf_counter() - start
            before = hf_named_arrays(cfg, self.states[side].params)
            self.states[side], metrics = self.step(side)
            self.first[side] = ({k: v - before[k] for k, v in hf_named_arrays(cfg, self.states[side].params).items()},
                                float(metrics["loss"]), float(metrics["grad_norm"]))

    def step(self, side: str):
        return self.compiled[side](self.states[side], self.batches[side], self.advantages_B)

    def call(self, side: str):
        """One timed update of ``side``, waited for."""
        def call():
            self.states[side], _ = self.step(side)
            jax.block_until_ready(self.states[side])
        return call


def make_torch_step(torch, hf_model, rows, prompt_len: int, response_len: int):
    """``(torch_step, fused)``: PyTorch's update on the same batch, loss, clipping and AdamW (``fused``: its fused
    CPU kernel, else ``foreach``); ``torch_step()`` returns the step's loss and pre-clip gradient norm."""
    tokens_BxL, valid_BxL, positions_BxL, weights_BxR, adv_B = rows
    t, r = prompt_len, response_len
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

    return torch_step, fused


def first_torch_step(hf_model, torch_step):
    """``(update, loss, grad_norm)`` of PyTorch's first step: its parameter change per HF name (float64)."""
    hf_before = {name: p.detach().double().numpy().copy() for name, p in hf_model.named_parameters()}
    torch_loss, torch_norm = torch_step()
    torch_update = {name: p.detach().double().numpy() - hf_before[name] for name, p in hf_model.named_parameters()}
    return torch_update, torch_loss, torch_norm


def check_first_steps(cfg: D.DecoderConfig, sides: list[str], first: dict, torch_first) -> tuple[list[str], list[str]]:
    """``(failures, check lines)``: each of our layouts' first step (loss, gradient norm, update directions)
    against PyTorch's."""
    torch_update, torch_loss, torch_norm = torch_first
    failures, check_lines = [], []
    checked = [name.format(last=cfg.n_layers - 1) for name in CHECKED_TENSORS]
    for side in sides:
        ours_update, ours_loss, ours_norm = first[side]
        loss_err = abs(ours_loss - torch_loss) / max(abs(torch_loss), 1e-12)
        norm_err = abs(ours_norm - torch_norm) / max(abs(torch_norm), 1e-12)
        if not loss_err < LOSS_RTOL:
            failures.append(f"{side}: first-step losses differ: ours {ours_loss:.8g}, PyTorch {torch_loss:.8g} "
                            f"(relative {loss_err:.2e} >= {LOSS_RTOL:g})")
        if not norm_err < NORM_RTOL:
            failures.append(f"{side}: first-step gradient norms differ: ours {ours_norm:.8g}, PyTorch "
                            f"{torch_norm:.8g} (relative {norm_err:.2e} >= {NORM_RTOL:g})")
        if set(ours_update) != set(torch_update):
            failures.append(f"parameter names differ: {sorted(set(ours_update) ^ set(torch_update))}")
            continue
        cosines = {name: cosine(ours_update[name], torch_update[name]) for name in checked if name in torch_update}
        names = sorted(ours_update)
        cosines["all parameters"] = cosine(np.concatenate([ours_update[n].ravel() for n in names]),
                                           np.concatenate([torch_update[n].ravel() for n in names]))
        all_cos = {n: cosine(ours_update[n], torch_update[n]) for n in names}
        worst = min(all_cos, key=all_cos.get)
        for name, c in cosines.items():
            if not c > COSINE_MIN:
                failures.append(f"{side}: first update of {name}: cosine(ours, PyTorch) = {c:.6f} <= {COSINE_MIN}")
        check_lines.append(
            f"check ({side}): first-step loss {ours_loss:.7f} vs PyTorch {torch_loss:.7f} (relative {loss_err:.1e}); "
            f"grad norm {ours_norm:.5f} vs {torch_norm:.5f} (relative {norm_err:.1e}); cosine of the first updates: "
            + ", ".join(f"{n} {c:.6f}" for n, c in cosines.items()) + f"; lowest {worst} {all_cos[worst]:.6f}: ok")
    return failures, check_lines


def matmul_calls(torch, rng: np.random.Generator) -> dict:
    """The 2048^2 float32 matmul references, jnp (compiled) and torch, on the same inputs, each called once."""
    a_jnp = jnp.asarray(rng.standard_normal((MATMUL_N, MATMUL_N)), jnp.float32)
    b_jnp = jnp.asarray(rng.standard_normal((MATMUL_N, MATMUL_N)), jnp.float32)
    matmul = jax.jit(jnp.matmul).lower(a_jnp, b_jnp).compile()
    a_t, b_t = torch.from_numpy(np.array(a_jnp)), torch.from_numpy(np.array(b_jnp))
    jax.block_until_ready(matmul(a_jnp, b_jnp))
    _ = a_t @ b_t
    return {"jnp matmul": lambda: jax.block_until_ready(matmul(a_jnp, b_jnp)), "torch matmul": lambda: a_t @ b_t}


def time_rounds(calls: dict, sides: list[str], steps: int) -> list[dict]:
    """Rounds of [jnp matmul, ours, jnp matmul, ours shared, jnp matmul, PyTorch, jnp matmul, torch matmul], every
    other round in reverse order, so that each round's ratios compare calls made under the same load. Per round:
    name -> median (wall s, CPU s)."""
    order = []
    for side in sides + ["torch"]:
        order += ["jnp matmul", side]
    order.append("torch matmul")
    rounds = []
    for i in range(steps):
        timed = collections.defaultdict(list)
        for name in (order if i % 2 == 0 else order[::-1]):
            cpu_start, start = cpu_seconds(), time.perf_counter()
            calls[name]()
            timed[name].append((time.perf_counter() - start, cpu_seconds() - cpu_start))
        rounds.append({name: np.median(np.array(v), axis=0) for name, v in timed.items()})
    return rounds


def summarise(rounds: list[dict], work: dict[str, float], sides: list[str], names) -> dict:
    """Per-side medians (``sec``, ``cpu``) and the per-round figures: ``ratio`` (PyTorch time / ours), ``frac``
    (a side's FLOP/s over its round's jnp matmul's), ``cpu_ratio`` (the ratio from CPU seconds, median)."""
    def per_round(fn):
        return np.array([fn(rd) for rd in rounds])

    matmul_flops = 2 * MATMUL_N**3
    return dict(
        sec={name: float(np.median(per_round(lambda rd, n=name: rd[n][0]))) for name in names},
        cpu={name: float(np.median(per_round(lambda rd, n=name: rd[n][1]))) for name in names},
        # Headline figures: medians of the per-round ratios (each round's calls share that round's load).
        ratio={side: per_round(lambda rd, s=side: rd["torch"][0] / rd[s][0]) for side in sides},
        frac={side: per_round(lambda rd, s=side: (work[s] / rd[s][0]) / (matmul_flops / rd["jnp matmul"][0]))
              for side in sides + ["torch"]},
        # The same from CPU seconds (process user + system time during each call, all threads): a loaded machine
        # stretches wall time when it deschedules threads, much less the CPU time a call uses.
        cpu_ratio={side: float(np.median(per_round(lambda rd, s=side: rd["torch"][1] / rd[s][1]))) for side in sides})


def print_setup(args, model, cfg, hf_model, torch, transformers, fused: bool, xla_threads: int, n_tokens: int,
                num_prompts: int, n_valid: int, check_lines: list[str]) -> None:
    """The run's shapes, libraries, threads and load, then the checks' lines."""
    t, r = args.prompt, args.response
    print(f"RL update (forward + backward + AdamW), maze_full params={D.count_params(model):,} float32, "
          f"B={args.batch} rollouts of {num_prompts} prompts, T={t} R={r} ({n_tokens:,} tokens/step, "
          f"{n_valid:,} valid), steps={args.steps}")
    print(f"jax {jax.__version__} ({jax.default_backend()}), XLA intra-op pool threads={xla_threads} "
          f"(PJRT_NPROC={os.environ.get('PJRT_NPROC', 'unset')}); torch {torch.__version__} "
          f"threads={torch.get_num_threads()}, transformers {transformers.__version__} "
          f"(attn={hf_model.config._attn_implementation}, AdamW {'fused' if fused else 'foreach'}); ours: attention "
          f"{attention_name(cfg, t + r)}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for line in check_lines:
        print(line)


def print_timings(figures: dict, work: dict[str, float], compile_s: dict[str, float], sides: list[str],
                  rounds: list[dict], n_tokens: int) -> None:
    """Each side's tokens/s, the matmul references, matmul shares, CPU-second ratios and the per-round times."""
    sec, cpu, frac, cpu_ratio = figures["sec"], figures["cpu"], figures["frac"], figures["cpu_ratio"]
    matmul_flops = 2 * MATMUL_N**3
    labels = {"ours": "ours, joined sequences (jitted update) ", "ours shared": "ours, shared prompts (the trainer's)",
              "torch": "PyTorch (HF Qwen2 SDPA + AdamW)        "}
    for name in sides + ["torch"]:
        extra = f", compile {compile_s[name]:.1f} s" if name in compile_s else ""
        print(f"{labels[name]}: {n_tokens / sec[name]:9.1f} tokens/s  ({sec[name]:.3f} s/step, {cpu[name]:.2f} CPU "
              f"s/step, {work[name] / 1e9:.0f} GFLOP/step{extra})")
    print(f"dense float32 matmul {MATMUL_N}^2: jnp {matmul_flops / sec['jnp matmul'] / 1e9:.1f} GFLOP/s "
          f"({cpu['jnp matmul']:.3f} CPU s), torch {matmul_flops / sec['torch matmul'] / 1e9:.1f} GFLOP/s "
          f"({cpu['torch matmul']:.3f} CPU s)")
    print("share of the jnp matmul's FLOP/s (each side's own work): " + ", ".join(
        f"{name} {100 * float(np.median(frac[name])):.1f}%" for name in sides + ["torch"]))
    print("by CPU seconds instead of wall time (informative: the targets below are wall clock): " + ", ".join(
        f"{name}/PyTorch = {cpu_ratio[name]:.2f}x" for name in sides))
    print("per round (s, " + " / ".join(sides + ["PyTorch"]) + " / jnp matmul GFLOP/s): " + ", ".join(
        "/".join(f"{rd[n][0]:.2f}" for n in sides + ["torch"]) + f"/{matmul_flops / rd['jnp matmul'][0] / 1e9:.0f}"
        for rd in rounds))


def print_targets(figures: dict, sides: list[str]) -> None:
    """The per-round ranges, the targets of the headline layout (ours shared where K > 1) and the result line."""
    ratio, frac = figures["ratio"], figures["frac"]
    print("targets (the trainer's layout, ours shared where K > 1; medians of per-round values):")
    headline = sides[-1]
    r_head, f_head = float(np.median(ratio[headline])), float(np.median(frac[headline]))
    for side in sides:
        print(f"  {side}/PyTorch per round {ratio[side].min():.2f}..{ratio[side].max():.2f}x, median "
              f"{float(np.median(ratio[side])):.2f}x; matmul share {100 * frac[side].min():.0f}.."
              f"{100 * frac[side].max():.0f}%")
    print(target_line(f"{headline} >= {TARGET_RATIO:g}x PyTorch update tokens/s (wall)", f"{r_head:.2f}x",
                      r_head >= TARGET_RATIO))
    print(target_line(f"{headline} >= {100 * TARGET_MATMUL_FRACTION:.0f}% of dense matmul FLOP/s (wall)",
                      f"{100 * f_head:.1f}%", f_head >= TARGET_MATMUL_FRACTION))
    r_joined, f_joined = float(np.median(ratio["ours"])), float(np.median(frac["ours"]))
    ratio_met, frac_met = r_head >= TARGET_RATIO, f_head >= TARGET_MATMUL_FRACTION
    print(f"result: {headline}/PyTorch = {r_head:.2f}x ({'met' if ratio_met else 'NOT met'}, target >= "
          f"{TARGET_RATIO:g}x), {100 * f_head:.1f}% of matmul throughput ({'met' if frac_met else 'NOT met'}, "
          f"target >= {100 * TARGET_MATMUL_FRACTION:.0f}%); the same computation as PyTorch (joined): "
          f"{r_joined:.2f}x, {100 * f_joined:.1f}%")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads > 0:  # read when JAX's CPU backend starts, i.e. at the first computation below
        os.environ["PJRT_NPROC"] = str(args.threads)
    libraries = torch_and_transformers(args.threads)
    if libraries is None:
        return 0
    torch, transformers = libraries
    cfg, model, hf_model, xla_threads = load_models(args, torch, transformers)
    rng = np.random.default_rng(0)
    rows, prompts = make_batch(cfg, args.batch, args.prompt, args.response, args.rollouts_per_prompt, rng)
    t, r = args.prompt, args.response
    num_prompts = len(prompts[1])
    sides = ["ours"] + (["ours shared"] if args.rollouts_per_prompt > 1 else [])
    ours = OurUpdates(cfg, model, sides, rows, prompts, t)
    torch_step, fused = make_torch_step(torch, hf_model, rows, t, r)
    failures, check_lines = check_first_steps(cfg, sides, ours.first, first_torch_step(hf_model, torch_step))
    if failures:  # a fast wrong answer is no result: no timing
        return report_failures(failures)

    calls = {side: ours.call(side) for side in sides}
    calls["torch"] = torch_step
    calls.update(matmul_calls(torch, rng))
    xla_threads = max(xla_threads, xla_pool_threads())
    rounds = time_rounds(calls, sides, args.steps)
    work = {"ours": update_flops(cfg, args.batch, t, r, None), "torch": update_flops(cfg, args.batch, t, r, None),
            "ours shared": update_flops(cfg, args.batch, t, r, num_prompts)}
    figures = summarise(rounds, work, sides, calls)
    tokens_BxL, valid_BxL = rows[0], rows[1]
    print_setup(args, model, cfg, hf_model, torch, transformers, fused, xla_threads, tokens_BxL.size, num_prompts,
                int(valid_BxL.sum()), check_lines)
    print_timings(figures, work, ours.compile_s, sides, rounds, tokens_BxL.size)
    print_targets(figures, sides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
