"""Math reasoning: uniform MaxRL vs SERA at matched training rollouts (docs/method.md §8C).

The experiment as a function, ``run(config, workdir)``, and the calls the memory planner compiles,
``planned_calls(config, devices)``; ``main.py`` is its command line:

    python -m experiments.math_reasoning.main --config=experiments/math_reasoning/config.py:cpu --workdir=/tmp/math

Per seed: the policy (a decoder trained from scratch with SFT on worked solutions, or a pretrained model from
``config.model.dir``), the success-rate profile of that starting policy on the training prompts, then RL from
that same policy for each method over a fixed training set (several epochs; SERA's p estimates come from
the ``history`` tracker). Unbiased pass@k on held-out problems. Writes ``WORKDIR/results.json`` (pass@k per
method with 95% CIs over seeds, training rollouts, the start profile, the config), per-step metrics under
``WORKDIR/seed_*/<method>/`` and figures; a killed run resumes from its checkpoints when started again with
the same workdir.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Callable, Optional

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from experiments.math_reasoning import config as config_lib
from experiments.math_reasoning.task import MathTask, build_tokenizer, make_task, require_dir
from sera_jax.models import decoder
from sera_jax.report import figures as figures_lib
from sera_jax.rl import comparison
from sera_jax.rl import config as rl_config
from sera_jax.rl import evaluation
from sera_jax.train import sharding as sharding_lib
from sera_jax.train.files import write_json_atomic

# where files are, not what they are: may change (data.eval_dirs: the paper_* variants' evaluation sets)
LOCATIONS = ("data.dir", "data.eval_dir", "data.eval_dirs", "model.dir")
PROFILE_BINS = np.linspace(0.0, 1.0, 11)


# ------------------------------------------------------------------------------------------------ model


def build_model(config: ml_collections.ConfigDict, task: MathTask, seed: int,
                mesh: Optional[jax.sharding.Mesh] = None) -> decoder.Decoder:
    """A decoder from scratch (``model.source='scratch'``) or the pretrained one in ``config.model.dir``."""
    m = config.model
    if m.source == "pretrained":
        return load_pretrained(config, mesh)
    if m.source != "scratch":
        raise ValueError(f"config.model.source={m.source!r}: must be 'scratch' or 'pretrained'")
    cfg = decoder.DecoderConfig(
        vocab_size=task.tokenizer.vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
        n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, ffn_dim=m.ffn_dim, dtype=m.dtype, tie_embeddings=True,
        max_seq_len=task.prompt_len + task.max_new_tokens, **execution_options(config))
    return decoder.Decoder(cfg, rngs=nnx.Rngs(seed))


def execution_options(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """How the decoder runs (attention kernel, rematerialisation, scanned layers): not what it computes."""
    return {k: config.model[k] for k in ("attention", "remat", "scan_layers")}


def load_pretrained(config: ml_collections.ConfigDict, mesh: Optional[jax.sharding.Mesh]) -> decoder.Decoder:
    """The Hugging Face checkpoint in ``config.model.dir`` (config.json + safetensors). With a mesh, each
    parameter goes straight into its layout under ``config.mesh.rules`` (FSDP over "fsdp") as it is read, so
    a large model never sits whole on one device."""
    from sera_jax.models import hf_loader  # imported here: only the pretrained configs need it

    model_dir = require_dir(config.model.dir, "config.model.dir",
                            f"the Hugging Face files of {config.model.hf_repo} (config.json, *.safetensors)",
                            config.model.hf_repo, "model")

    def layout(cfg: decoder.DecoderConfig) -> nnx.State:
        shardings = sharding_lib.abstract_sharded(lambda: decoder.Decoder(cfg, rngs=nnx.Rngs(0)), mesh,
                                                  tuple(config.mesh.rules))[2]
        return jax.tree.map(sharding_lib.drop_trivial_axes, shardings)

    return hf_loader.load_hf_checkpoint(model_dir, dtype=config.model.dtype, param_dtype=config.model.param_dtype,
                                        shardings=None if mesh is None else layout, **execution_options(config))


# ---------------------------------------------------------------------------------------------- placement


def method_config(config, method: str):
    """The shared config with ``config.sera`` changed as ``config_lib.METHODS[method]`` says."""
    return rl_config.method_config(config, config_lib.METHODS, method)


# ------------------------------------------------------------------------------------------ start profile


def success_profile(model: nnx.Module, task: MathTask, samples: int, *, seed: int, rows_per_call: int,
                    shard_fn: Callable[[Any], Any] = lambda x: x, temperature: float = 1.0,
                    show_progress: bool = False) -> np.ndarray:
    """Successes out of ``samples`` rollouts (temperature ``temperature``) of every training prompt: the
    per-prompt success rates the RL run starts from. Returns correct counts ``(M,)``."""
    return evaluation.success_counts(model, task, lambda keys: task.prompt_batch(task.train, keys),
                                     task.num_train_prompts, samples, seed=seed, rows_per_call=rows_per_call,
                                     shard_fn=shard_fn, temperature=temperature, desc="start profile",
                                     show_progress=show_progress)


def profile_summary(correct: np.ndarray, samples: int, levels: np.ndarray) -> dict[str, Any]:
    """Histogram of per-prompt success rates (10 bins), fractions at 0 and 1, and means per level."""
    rates = correct / samples
    hist, _ = np.histogram(rates, bins=PROFILE_BINS)
    out = {"samples_per_prompt": samples, "bins": PROFILE_BINS.tolist(), "histogram": hist.tolist(),
           "frac_zero": float(np.mean(correct == 0)), "frac_one": float(np.mean(correct == samples)),
           "frac_spread": float(np.mean((correct > 0) & (correct < samples))), "mean": float(rates.mean()),
           "quantiles": {str(q): float(np.quantile(rates, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}}
    if np.any(levels >= 0):
        out["mean_by_level"] = {str(lv): float(rates[levels == lv].mean()) for lv in np.unique(levels)}
    return out


def make_figures(results: dict[str, Any], config: dict[str, Any], out_dir: pathlib.Path,
                 prefix: str = "") -> list[pathlib.Path]:
    """Every figure of the experiment from its results and config as saved in ``results.json``."""
    ks = tuple(k for k in (1, 8, 64) if k in config["eval"]["ks"]) or (1,)
    paths = figures_lib.pass_at_k_figures(results, out_dir, prefix=prefix, ks=ks,
                                          title=f"Math ({config['data']['source']}, {config['variant']})")
    if results.get("start_profile"):
        paths.append(pathlib.Path(out_dir) / f"{prefix}start_success_rates.png")
        figures_lib.success_rate_histogram(results["start_profile"]).savefig(paths[-1], dpi=110)
    return paths


# -------------------------------------------------------------------------------------------------- run


def profile_start(config: ml_collections.ConfigDict, task: MathTask, model: nnx.Module, seed: int,
                  start_dir: pathlib.Path, placement: sharding_lib.Placement) -> Optional[dict]:
    """The start profile of a policy (cached in ``start_dir/start_profile.json`` for resumed runs), without
    the per-prompt counts."""
    n = config.log.profile_samples
    if not n:
        return None
    path = start_dir / "start_profile.json"
    if path.is_file():
        summary = json.loads(path.read_text())
    else:
        correct = success_profile(model, task, n, seed=seed, rows_per_call=config.eval.max_rollouts_per_call,
                                  shard_fn=placement.batch, temperature=config.rl.temperature,
                                  show_progress=config.log.progress)
        summary = profile_summary(correct, n, task.train.levels)
        summary["correct"] = correct.tolist()
        if jax.process_index() == 0:
            write_json_atomic(path, summary)
    return {k: v for k, v in summary.items() if k != "correct"}


def _make_task(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> MathTask:
    task = make_task(config, build_tokenizer(config, workdir))
    logging.info("math task: %d train / %d eval prompts, prompt length %d, responses up to %d tokens",
                 task.num_train_prompts, len(task.eval.records), task.prompt_len, task.max_new_tokens)
    return task


def _profile_rows(config: ml_collections.ConfigDict) -> dict[str, int]:
    if not config.log.profile_samples:
        return {}
    return {"config.log.profile_samples (rows per call)": rl_config.rows_per_call(
        config.log.profile_samples, config.eval.max_rollouts_per_call)}


def describe_task(config: ml_collections.ConfigDict, task: MathTask) -> dict[str, Any]:
    out = {"num_train": task.num_train_prompts, "num_eval": len(task.eval.records), "prompt_len": task.prompt_len,
           "max_new_tokens": task.max_new_tokens, "vocab_size": task.tokenizer.vocab_size,
           "epochs": config.rl.steps * config.rl.prompts_per_step / task.num_train_prompts,
           "grading": {**config.grading.to_dict(), "timeouts": task.grading_timeouts}}
    if config.data.get("eval_sets"):  # the pooled held-out set's make-up: problems per evaluation set
        sources = [r["source"] for r in task.eval.records]
        out["eval_sets"] = {name: sources.count(name) for name in config.data.eval_sets}
    return out


EXPERIMENT = comparison.Experiment(
    name="math_reasoning", methods=config_lib.METHODS, reference_config=config_lib.get_config,
    make_task=_make_task, build_model=lambda config, task, seed, mesh: build_model(config, task, seed, mesh),
    make_figures=make_figures, knows_success_rates=MathTask.knows_success_rates, locations=LOCATIONS,
    profile_start=profile_start, extra_rows=_profile_rows, describe_task=describe_task)


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
        stop_after: Optional[int] = None) -> Optional[dict]:
    """Runs (or resumes) the comparison of ``config.methods``; returns the results (None if ``stop_after``
    optimizer steps stopped it first, as a kill would)."""
    config_lib.validate_config(config)  # before any work: the fields only some variants have
    return comparison.run_comparison(EXPERIMENT, config, workdir, stop_after=stop_after)


def write_paper_tiny_files(directory: str | pathlib.Path, *, seed: int = 0) -> dict[str, str]:
    """Files in the SERA authors' layouts for the ``paper_tiny`` variant, written under ``directory``: a tiny
    random decoder with its tokenizer as a Hugging Face checkpoint (``model/``), 16 training problems as their
    prepared verl parquet (``math35/train.parquet``; ``paper_tiny`` reads the first 8, as ``paper_math`` its
    8,192), and 4 held-out problems in each of three pinned source layouts (AIME 2025's, OlympiadBench's and
    Minerva's ``test.jsonl``). The problems are arithmetic word problems (``sera_jax.envs.arithmetic``). Returns
    ``{config field: path}``, the overrides that point ``paper_tiny`` at them (``--config.FIELD=PATH``). Needs
    pyarrow (the ``math`` extra)."""
    from experiments.math_reasoning.task import LADDERS
    from sera_jax.data import math_data
    from sera_jax.data import tokenizer as tok_lib
    from sera_jax.envs import arithmetic
    from sera_jax.models import hf_loader

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("write_paper_tiny_files writes parquet through pyarrow: pip install 'sera_jax[math]'") from e
    root = pathlib.Path(directory)
    levels = {lv: LADDERS["one_digit"][lv] for lv in (1, 2)}
    train = arithmetic.generate_problems(16, seed=seed, split="train", levels=levels)
    held_out = arithmetic.generate_problems(12, seed=seed, split="test", levels=levels)
    suffix = math_data.QWEN_INSTRUCTION
    tokenizer = tok_lib.train_tokenizer(arithmetic.corpus(200, seed=seed + 2, extra_texts=[suffix]), vocab_size=512)
    tokenizer.save(root / "model")
    cfg = decoder.DecoderConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                                head_dim=8, ffn_dim=32, dtype="float32", tie_embeddings=True, max_seq_len=512)
    hf_loader.save_hf_checkpoint(decoder.Decoder(cfg, rngs=nnx.Rngs(seed)), root / "model")
    # qwen/prepare_polaris.py's row layout (their data/math35 rows have the same fields).
    rows = [dict(data_source="tiny_math35", id=i, ability="math",
                 prompt=[dict(role="user", content=p.question + suffix)],
                 reward_model=dict(style="rule", ground_truth=str(p.answer)), extra_info=dict(split="train", index=i))
            for i, p in enumerate(train)]
    (root / "math35").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "math35" / "train.parquet")
    layouts = {  # evaluation/paper_assets.json: each set's question field; OlympiadBench's answers in a list, in $
        "aime25": lambda i, p: dict(id=i, problem=p.question, answer=str(p.answer)),
        "olympiadbench": lambda i, p: dict(id=i, question=p.question, final_answer=[f"${p.answer}$"],
                                           is_multiple_answer=False, unit=None, answer_type="Numerical"),
        "minerva": lambda i, p: dict(question=p.question, answer=str(p.answer)),
    }
    paths = {"model.dir": str(root / "model"), "data.dir": str(root / "math35" / "train.parquet")}
    for k, (name, layout) in enumerate(layouts.items()):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(layout(i, p)) for i, p in enumerate(held_out[4 * k:4 * k + 4])]
        (folder / "test.jsonl").write_text("\n".join(lines) + "\n")
        paths[f"data.eval_dirs.{name}"] = str(folder)
    return paths


# ------------------------------------------------------------------------------------------ memory plan

# config.json fields of the pretrained models the gpu/full/paper_* configs name, for planning without their files.
KNOWN_ARCHITECTURES = {
    "HuggingFaceTB/SmolLM2-360M-Instruct": dict(
        model_type="llama", vocab_size=49152, hidden_size=960, num_hidden_layers=32, num_attention_heads=15,
        num_key_value_heads=5, intermediate_size=2560, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, max_position_embeddings=8192),
    "Qwen/Qwen3-1.7B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=6144, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=32768),
    "Qwen/Qwen2.5-Math-1.5B": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=4096),
    "Qwen/Qwen3-4B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=9728, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=32768),
}


def planned_calls(config: ml_collections.ConfigDict, devices=None) -> list:
    """The jitted calls of a run of ``config`` with abstract arguments (``python -m experiments.plan``), laid
    over ``devices`` (default: JAX's):
    the pretrained architecture from ``config.model.dir/config.json`` (or ``KNOWN_ARCHITECTURES``), prompts
    of ``data.max_prompt_tokens``; the from-scratch model and its prompts from the generated task."""
    from sera_jax.models import hf_loader
    from sera_jax.rl.memory import planned_rl_calls

    config_lib.validate_config(config)
    settings, sft = comparison.planning_settings(EXPERIMENT, config)
    d, m = config.data, config.model
    if m.source == "pretrained":
        path = pathlib.Path(m.dir).expanduser() / "config.json"
        hf = json.loads(path.read_text()) if path.is_file() else KNOWN_ARCHITECTURES.get(m.hf_repo)
        if hf is None:
            raise ValueError(f"config.model.dir={m.dir!r} has no config.json and config.model.hf_repo="
                             f"{m.hf_repo!r} is not in KNOWN_ARCHITECTURES")
        cfg = hf_loader.config_from_hf(hf, dtype=m.dtype, param_dtype=m.param_dtype, **execution_options(config))
        return planned_rl_calls(lambda: decoder.Decoder(cfg, rngs=nnx.Rngs(0)), settings, mesh_config=config.mesh,
                                prompt_len=d.max_prompt_tokens, max_new_tokens=d.max_new_tokens, num_stop_tokens=2,
                                devices=devices)
    task = make_task(config, build_tokenizer(config))
    return planned_rl_calls(lambda: build_model(config, task, 0), settings, mesh_config=config.mesh,
                            prompt_len=task.prompt_len, max_new_tokens=task.max_new_tokens,
                            num_stop_tokens=len(task.stop_tokens), sft=sft, sft_answer_len=task.max_new_tokens,
                            devices=devices)
