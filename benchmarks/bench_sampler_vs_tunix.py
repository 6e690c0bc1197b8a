"""Tokens/s of our jitted sampler against tunix's vanilla sampler (``tunix.generate.sampler.Sampler``, what
tunix's ``VanillaRollout`` engine runs) on the maze policy, same weights, prompts, new tokens, temperature,
threads and device, measured in the same run, after checking that both compute the same thing.

    .venv/bin/python benchmarks/bench_sampler_vs_tunix.py                         # maze cpu policy, both layouts
    .venv/bin/python benchmarks/bench_sampler_vs_tunix.py --layout=64x1 --repeats=3
    .venv/bin/python benchmarks/bench_sampler_vs_tunix.py --size=gpu --threads=0  # maze gpu policy, accelerator

Needs the ``tunix`` extra. Model: the maze experiment's own decoder config (``experiments/maze/config.py``:
``--size=cpu`` is the ``cpu`` variant's 2-layer d=64 policy on 9x9 mazes, float32; ``--size=gpu`` the paper's
``maze_full`` policy on 17x17 mazes, bfloat16 compute over float32 parameters), random weights
(``random_decoder``), moved into tunix's own ``Qwen2`` by ``sera_jax.integrations.tunix_models.to_tunix_qwen2``
(our HF checkpoint read by tunix's safetensors loader). Prompts: real maze prompts (``maze.render_prompts``,
the maze vocabulary of 32 ids, all of one length T); new tokens: the maze's response cap
(``maze.response_length``: 45 at 9x9, 180 at 17x17), temperature 1, no top-p / top-k, no stop token (every row
generates all R tokens on both sides: the same work).

Layouts (``--layout``): ``64x1`` B = 64 rollouts of 64 prompts (one each); ``16x16`` B = 256 rollouts, 16 of
each of 16 prompts.

* ours: ``make_sample_fn`` (each prompt prefilled once, its KV cache shared by its rollouts, B slots);
* tunix: ``Sampler.__call__`` as ``VanillaRollout.generate`` calls it (``echo=False``, ``pad_output=False``,
  ``return_logprobs=True``, ``max_prompt_length=T``, KV cache of T + R slots). tunix's sampler has no prompt
  sharing: for ``16x16`` each prompt is passed 16 times (256 input strings), so every copy is prefilled and
  keeps its own prompt cache; that is the closest equivalent, and the ratio of that layout includes what
  sharing saves. Its call is end to end as tunix's API is (strings in: ids written as text and read by a
  ``TokenIdTokenizer``, so tunix's model sees exactly our token ids; token arrays, text and log-probs out); its
  host-side part (tokenising, detokenising) is timed alone and printed. Its decode loop runs R model steps
  after the prefill (the last one's token is dropped), ours R - 1.
* tunix's sampler treats every token equal to its pad id as padding, including generated ones (masked from
  later attention), and a random policy emits the maze's PAD (0); the adapter gives tunix pad id = vocab size,
  which never occurs (the prompts need no padding).

Checks, before timing (exit status 1 on failure): (1) tunix's sampler's own log-probs of its sampled tokens
equal our teacher-forced log-probs (``Decoder``, ``token_logprobs``) of the same sequences; (2) our sampler's
``logp_policy`` equals tunix's teacher-forced ``tunix.rl.common.compute_per_token_logps`` of our samples (16 rows
of each layout's timed calls); (3) greedy decoding (tunix: no ``top_p``; ours: ``greedy=True``) of 8 prompts
gives identical tokens (a row whose first difference is a float near-tie, the two tokens' logits within ``TIE``
under our model, would be reported, not failed). These run in float32: with the ``gpu`` policy (bfloat16 compute)
checks 1 and 2 on the timed calls only bound the difference loosely (two implementations round differently in
bfloat16: 0.14 apart on its log-probs), and checks 1-3 also run exactly on float32 twins of both models (same
weights, float32 compute).

Timing: ``--repeats`` rounds of [ours, tunix] (every other round reversed) after a warm-up (ahead-of-time
compilation for ours, one untimed call for tunix); rate = B x R / the median wall time of a call; ratio = median
over rounds of tunix time / ours. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402  (bench_sampler imports these too: no backend starts before set_threads)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench_sampler import set_threads  # noqa: E402
from common import report_failures  # noqa: E402
from sera_jax.models import decoder as D  # noqa: E402
from sera_jax.models import sampler as S  # noqa: E402

LAYOUTS = {"64x1": (64, 64), "16x16": (256, 16)}  # name -> (B rollouts, P prompts)
CHECK_ROWS = 16
GREEDY_PROMPTS = 8
# Compute dtype -> log-prob tolerance. float32: the checks of what is computed. bfloat16 (the timed gpu policy):
# only that the timed samplers run the same model (two implementations' bfloat16 rounding; observed 0.14 on
# maze_full at 17x17); its exact checks run on float32 twins (same weights, float32 compute).
LOGP_ATOL = {"float32": 1e-4, "bfloat16": 0.5}
TIE = 1e-4  # float32 greedy runs may part only where the two tokens' logits are this close (a float near-tie)
CHECKS = ("tunix sampler log-probs - our teacher forcing, on its samples",
          "our logp_policy - tunix compute_per_token_logps, on our samples")


def parse_args(argv) -> argparse.Namespace:
    """The command line, checked (``--repeats`` >= 1)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("cpu", "gpu"), default="cpu",
                        help="maze config variant whose policy and maze size to use (gpu: maze_full, 17x17)")
    parser.add_argument("--layout", choices=("all", *LAYOUTS), default="all")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of [ours, tunix] (median)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (XLA's Eigen pool off and the process pinned to one core when 1); "
                             "0: XLA's default (use it on an accelerator)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    return args


@dataclasses.dataclass
class Setting:
    """The maze policy's config and what both samplers are given: ``T``-token prompts (enough for every layout),
    ``R`` new tokens, tunix's pad id (``vocab_size``: see the module docstring, never generated, never needed) and
    token-id tokenizer, and our stop-token list that stops nothing."""

    cfg: D.DecoderConfig
    dtype: str
    scale: float
    size: int
    T: int
    R: int
    all_prompts: np.ndarray
    pad: int
    eos: int
    tokenizer: Any  # sera_jax.integrations.tunix_models.TokenIdTokenizer
    no_stop: jax.Array


def maze_setting(variant: str) -> Setting:
    """The ``variant`` maze config's policy and maze size, and real maze prompts (``maze.render_prompts``)."""
    from experiments.maze import config as maze_config
    from experiments.maze import experiment as maze_experiment
    from sera_jax.envs import maze
    from sera_jax.integrations import tunix_models as TM

    config = maze_config.get_config(variant)
    cfg = nnx.eval_shape(lambda: maze_experiment.build_model(config, 0)).cfg
    size = config.maze.size
    T, R = maze.prompt_length(size), maze.response_length(size)
    max_prompts = max(p for _, p in LAYOUTS.values())
    grids, _ = maze.make_train_mazes(size, 0, max_prompts, set(), seed=7)
    all_prompts = np.asarray(maze.render_prompts(jnp.asarray(grids)), np.int32)
    assert all_prompts.shape == (max_prompts, T), all_prompts.shape
    pad = cfg.vocab_size  # see the module docstring: never generated, never needed
    return Setting(cfg=cfg, dtype=jnp.dtype(cfg.dtype).name, scale=0.3 if variant == "cpu" else 0.1, size=size,
                   T=T, R=R, all_prompts=all_prompts, pad=pad, eos=maze.EOS,
                   tokenizer=TM.TokenIdTokenizer(eos_id=maze.EOS, pad_id=pad), no_stop=jnp.asarray([-1], jnp.int32))


class Pair:
    """Our decoder of ``cfg`` with the benchmark's random weights, the same weights in tunix's Qwen2, and each
    side's sampler and teacher-forced log-probs."""

    def __init__(self, cfg: D.DecoderConfig, setting: Setting):
        from tunix.generate import sampler as tunix_sampler

        from sera_jax.integrations import tunix_models as TM

        self.setting = setting
        T, R = setting.T, setting.R
        self.model = D.random_decoder(cfg, seed=0, scale=setting.scale)
        self.graphdef, self.state = nnx.split(self.model)
        with tempfile.TemporaryDirectory() as tmp:
            self.qwen2 = TM.to_tunix_qwen2(cfg, self.model, tmp)
        self.tunix_sample = tunix_sampler.Sampler(self.qwen2, setting.tokenizer, tunix_sampler.CacheConfig(
            cache_size=T + R, num_layers=cfg.n_layers, num_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim))
        graphdef = self.graphdef

        @jax.jit
        def teacher_forced(st, seq):
            valid = jnp.ones(seq.shape, bool)
            return D.token_logprobs(nnx.merge(graphdef, st), seq, D.positions_from_valid(valid), valid)

        self.teacher_forced = teacher_forced

    def ours(self, prompts_PxT, ids_B, key, greedy=False):
        """Our sampler and the arguments of its call."""
        T, R = self.setting.T, self.setting.R
        p = prompts_PxT.shape[0]
        return S.make_sample_fn(self.graphdef, max_new_tokens=R, greedy=greedy), (
            self.state, jnp.asarray(prompts_PxT), jnp.full((p,), T, jnp.int32), jnp.asarray(ids_B), key,
            jnp.float32(1.0), self.setting.no_stop)

    def tunix_call(self, rows_BxT, seed, greedy=False):
        """``VanillaRollout.generate``'s call of the sampler: temperature 1, no top-k, full nucleus (greedy:
        no top_p, tunix's greedy mode)."""
        from sera_jax.integrations import tunix_models as TM

        kw = {} if greedy else dict(temperature=1.0, top_p=1.0, top_k=None, return_logprobs=True)
        return self.tunix_sample(input_strings=[TM.ids_text(p) for p in rows_BxT],
                                 max_generation_steps=self.setting.R, max_prompt_length=self.setting.T, echo=False,
                                 seed=seed, pad_output=False, eos_tokens=[-1], **kw)

    def logp_errors(self, rows_BxT, ours_out, tunix_out, n=CHECK_ROWS):
        """(max |tunix sampler log-probs - our teacher forcing| on its samples, max |our logp_policy - tunix
        compute_per_token_logps| on ours), first ``n`` rows."""
        from tunix.rl import common as tunix_common

        T, R = self.setting.T, self.setting.R
        tunix_tokens = np.stack([np.asarray(x) for x in tunix_out.tokens[:n]])
        assert tunix_tokens.shape == (n, R), tunix_tokens.shape
        ref = np.asarray(self.teacher_forced(self.state, jnp.asarray(np.concatenate([rows_BxT[:n], tunix_tokens], 1))))
        err1 = float(np.abs(np.asarray(tunix_out.logprobs[:n]) - ref[:, T:]).max())
        graphdef_t, state_t = nnx.split(self.qwen2)
        theirs = np.asarray(tunix_common.compute_per_token_logps(
            graphdef_t, state_t, jnp.asarray(rows_BxT[:n]), ours_out.tokens_BxR[:n], pad_id=self.setting.pad,
            eos_id=self.setting.eos))
        return err1, float(np.abs(np.asarray(ours_out.logp_policy_BxR[:n]) - theirs).max())


def print_header(args, setting: Setting, timed: Pair, tunix_version: str) -> None:
    """The policy, the maze size, the call's shapes and the libraries' versions."""
    cfg, size = setting.cfg, setting.size
    print(f"maze {args.size} policy: {D.count_params(timed.model):,} params ({cfg.n_layers} layers, "
          f"d={cfg.d_model}, {cfg.n_heads}/{cfg.n_kv_heads} heads, vocab {cfg.vocab_size}; {setting.dtype} compute, "
          f"{jnp.dtype(cfg.param_dtype).name} parameters), {size}x{size} mazes: prompt T={setting.T}, new tokens "
          f"R={setting.R}, temperature 1, repeats={args.repeats}, threads={args.threads or 'default'}")
    print(f"jax={jax.__version__} ({jax.default_backend()}: {jax.devices()[0].device_kind}) tunix={tunix_version}")


def check_greedy(exact: Pair, setting: Setting, failures: list[str]) -> str:
    """Check 3 (the models and both samplers' caches): greedy decoding of the same prompts, float32; its line."""
    g, R = GREEDY_PROMPTS, setting.R
    greedy_prompts = setting.all_prompts[:g]
    fn, call = exact.ours(greedy_prompts, np.arange(g, dtype=np.int32), jax.random.key(0), greedy=True)
    ours_greedy = np.asarray(fn(*call).tokens_BxR)
    tunix_greedy = np.stack([np.asarray(x) for x in exact.tunix_call(greedy_prompts, 0, greedy=True).tokens])
    ties = []
    for b in np.flatnonzero((ours_greedy != tunix_greedy).any(1)):
        j = int(np.argmax(ours_greedy[b] != tunix_greedy[b]))
        seq = np.concatenate([greedy_prompts[b], ours_greedy[b, :j]])[None]
        logits = np.asarray(exact.model(jnp.asarray(seq)))[0, -1]
        ties.append((int(b), j, float(abs(logits[ours_greedy[b, j]] - logits[tunix_greedy[b, j]]))))
    agreement = float(np.mean(ours_greedy == tunix_greedy))
    if any(gap > TIE for *_, gap in ties):
        failures.append(f"greedy tokens differ beyond a near-tie (row, step, logit gap): {ties}")
    return (f"check 3: float32 greedy tokens, {g} prompts x {R}: "
            + ("identical" if not ties else f"agreement {agreement:.3f}; first differences (row, step, "
               f"logit gap) {ties}"))


def check_float32_twins(exact: Pair, setting: Setting, failures: list[str]) -> list[str]:
    """Checks 1 and 2 in float32 on 16 prompts, one rollout each (when the timed policy computes in bfloat16)."""
    n = CHECK_ROWS
    prompts = setting.all_prompts[:n]
    fn, call = exact.ours(prompts, np.arange(n, dtype=np.int32), jax.random.key(2))
    errs = exact.logp_errors(prompts, fn(*call), exact.tunix_call(prompts, 0))
    lines = []
    for i, (label, err) in enumerate(zip(CHECKS, errs)):
        lines.append(f"check {i + 1}: float32 twins, {n} samples: max |{label}| = {err:.1e} "
                     f"(tolerance {LOGP_ATOL['float32']:g})")
        if not err <= LOGP_ATOL["float32"]:
            failures.append(f"float32: {label} differ by {err:.2e}")
    return lines


def time_layout(name: str, timed: Pair, setting: Setting, repeats: int, failures: list[str]) -> dict:
    """One layout: ours compiled ahead of time and tunix warmed up, checks 1 and 2 on the timed samplers' own
    samples, then ``repeats`` rounds of [ours, tunix] (every other round reversed) and tunix's host-side part."""
    from sera_jax.integrations import tunix_models as TM

    B, P = LAYOUTS[name]
    R = setting.R
    prompts_PxT = setting.all_prompts[:P]
    ids_B = np.repeat(np.arange(P, dtype=np.int32), B // P)
    rows_BxT = prompts_PxT[ids_B]  # tunix: every rollout its own copy of its prompt
    fn, call = timed.ours(prompts_PxT, ids_B, jax.random.key(1))
    start = time.perf_counter()
    compiled = fn.lower(*call).compile()  # ahead of time: no untimed full run needed
    compile_ours = time.perf_counter() - start
    start = time.perf_counter()
    tunix_out = timed.tunix_call(rows_BxT, 0)  # warm-up: compiles tunix's prefill and decode for these shapes
    compile_tunix = time.perf_counter() - start
    ours_out = jax.block_until_ready(compiled(*call))
    # Checks 1 and 2 on the first rows of the timed samplers' own samples.
    errs = timed.logp_errors(rows_BxT, ours_out, tunix_out)
    for label, err in zip(CHECKS, errs):
        if not err <= LOGP_ATOL[setting.dtype]:
            failures.append(f"{name}: {label} differ by {err:.2e}")

    # Timing: rounds of [ours, tunix], every other round reversed.
    rounds = []
    for i in range(repeats):
        sides = {}
        for side in (("ours", "tunix") if i % 2 == 0 else ("tunix", "ours")):
            start = time.perf_counter()
            if side == "ours":
                ours_out = jax.block_until_ready(compiled(*call))
            else:
                tunix_out = timed.tunix_call(rows_BxT, i + 1)
            sides[side] = time.perf_counter() - start
        rounds.append(sides)
    assert int(ours_out.lengths_B.min()) == R and all(len(x) == R for x in tunix_out.tokens)
    # tunix's host-side part of a call: tokenising the prompts, detokenising the outputs (its public methods).
    start = time.perf_counter()
    for row in rows_BxT:
        timed.tunix_sample.tokenize(TM.ids_text(row))
    for x in tunix_out.tokens:
        timed.tunix_sample.tokenizer.decode(np.asarray(x).tolist())
    host_s = time.perf_counter() - start
    return dict(name=name, B=B, P=P, rounds=rounds, errs=errs, host_s=host_s, compile_ours=compile_ours,
                compile_tunix=compile_tunix,
                t_ours=float(np.median([r["ours"] for r in rounds])),
                t_tunix=float(np.median([r["tunix"] for r in rounds])),
                ratio=float(np.median([r["tunix"] / r["ours"] for r in rounds])))


def print_layout(r: dict, setting: Setting) -> None:
    """One layout's rates, ratio and its checks 1 and 2 (``time_layout``'s result)."""
    n_tokens = r["B"] * setting.R
    print(f"\nlayout {r['name']}: B={r['B']} rollouts, P={r['P']} prompts ({r['B'] // r['P']} a prompt); "
          f"{n_tokens:,} new tokens a call")
    print(f"  ours (make_sample_fn)         : {n_tokens / r['t_ours']:10.1f} tokens/s  ({r['t_ours']:.3f} s/call; "
          f"compile {r['compile_ours']:.1f} s)")
    print(f"  tunix (Sampler, vanilla)      : {n_tokens / r['t_tunix']:10.1f} tokens/s  "
          f"({r['t_tunix']:.3f} s/call; first call {r['compile_tunix']:.1f} s; its host-side tokenise + "
          f"detokenise {1e3 * r['host_s']:.1f} ms)")
    print(f"  ratio (ours / tunix tokens/s) : {r['ratio']:.2f}x (rounds: "
          + ", ".join(f"{x['tunix'] / x['ours']:.2f}x" for x in r["rounds"]) + ")")
    for i, (label, err) in enumerate(zip(CHECKS, r["errs"])):
        print(f"  check {i + 1}: {setting.dtype}, {CHECK_ROWS} samples: max |{label}| = {err:.1e} "
              f"(tolerance {LOGP_ATOL[setting.dtype]:g})")


def main(argv=None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)  # before JAX's backend starts
    try:
        import tunix
    except ImportError:
        print("needs the 'tunix' extra: .venv/bin/pip install -e .[tunix]")
        return 0
    setting = maze_setting(args.size)
    timed = Pair(setting.cfg, setting)
    # The checks of what is computed run in float32: in bfloat16 two implementations round differently by more
    # than any useful tolerance (maze_full, 17x17: log-probs 0.14 apart, greedy runs parting at near-ties).
    exact = timed if setting.dtype == "float32" else Pair(dataclasses.replace(setting.cfg, dtype="float32"), setting)
    print_header(args, setting, timed, getattr(tunix, "__version__", "?"))
    failures: list[str] = []
    check_lines = [check_greedy(exact, setting, failures)]
    if exact is not timed:
        check_lines += check_float32_twins(exact, setting, failures)
    results = [time_layout(name, timed, setting, args.repeats, failures)
               for name in (LAYOUTS if args.layout == "all" else [args.layout])]
    for r in results:
        print_layout(r, setting)
    print("\n".join(check_lines))
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
