"""Controlled gradient alignment of SERA vs MaxRL's uniform allocation (docs/method.md §8A), end to end.

The experiment as a function, ``run(config, workdir)``, and the calls the memory planner compiles,
``planned_calls(config, devices)``; ``main.py`` is its command line:

    python -m experiments.imagenet_alignment.main \
        --config=experiments/imagenet_alignment/config.py:cpu --workdir=/tmp/imagenet_alignment

1. Cross-entropy pre-training with checkpoints at ``config.pretrain.checkpoint_steps``.
2. At each of those checkpoints, the alignment analysis (``analysis.py``), cached in
   ``<workdir>/analysis/step_<s>.json``.
3. Training dynamics: cross-entropy and MaxRL with each registry allocator of ``dynamics.methods`` (uniform, the
   released SERA, the all-active SERA) from the same initialisation, per seed.
4. ``<workdir>/results.json`` (``{"results": {"checkpoints", "training", ...}, "config", "provenance"}``, the
   provenance naming the commit the run started from) and the figures.

A config in training mode (``config.mode``: paper_imagenet, classification) runs step 3 alone as a seed-paired
comparison (``comparison.run_training``).

A killed run resumes: training runs restart from their latest checkpoint and analysed stages are reused.
``--stop_after=N`` stops after N optimizer steps of this invocation, as a kill would (for tests).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from experiments.imagenet_alignment import analysis, comparison, figures, programs, training
from experiments.imagenet_alignment import config as config_lib
from experiments.imagenet_alignment import model as model_lib
from experiments.imagenet_alignment.dataset import analysis_set, load_data
from experiments.imagenet_alignment.settings import AnalysisSettings
from sera_jax.models import resnet
from sera_jax.train import config_utils, files, writers
from sera_jax.train.loop import StepAllowance, StopRequested
from sera_jax.train.plan import PlannedCall
from sera_jax.train.sharding import make_mesh
from sera_jax.train.workdir import claim_workdir, prepare_workdir

# Fields whose change invalidates a cached per-checkpoint analysis.
ANALYSIS_FINGERPRINT = training.PRETRAIN_FINGERPRINT + ("analysis", "sera")
# What a cached analysis holds: one written by another version is recomputed (2: the weight profiles; 3: a prompt
# without rollouts weighs 0 in the expected gradient and is left out of the scale statistics).
ANALYSIS_VERSION = 3


def _analyse_stages(ctx: training.RunContext, stages: list[int], init_params, init_stats) -> list[dict[str, Any]]:
    """The analysis of every stage, reusing ``<workdir>/analysis/step_<s>.json`` written under the same config (and
    ``ANALYSIS_VERSION``)."""
    config = ctx.config
    out_dir = ctx.workdir / "analysis"
    out_dir.mkdir(exist_ok=True)
    fingerprint = config_utils.to_jsonable(config_utils.fingerprint(config, ANALYSIS_FINGERPRINT))
    settings = AnalysisSettings.from_config(config)
    x, labels = analysis_set(ctx.data, config.analysis.num_prompts)
    results = []
    for step in writers.progress(stages, desc="alignment analysis", disable=not config.log.progress):
        path = out_dir / f"step_{step}.json"
        if path.exists():
            cached = json.loads(path.read_text())
            if cached.get("fingerprint") == fingerprint and cached.get("version", 1) == ANALYSIS_VERSION:
                logging.info("analysis of step %d: reusing %s", step, path)
                results.append(cached["result"])
                continue
        params, stats = training.load_pretrained(ctx, step, init_params, init_stats)
        key = jax.random.fold_in(jax.random.key(config.seed), step)
        result = {"step": step, **analysis.analyse_checkpoint(settings, ctx.graphdef, params, stats, x, labels,
                                                              ctx.mesh, key, data_axes=ctx.data_axes)}
        cache = {"fingerprint": fingerprint, "version": ANALYSIS_VERSION, "result": config_utils.to_jsonable(result)}
        if jax.process_index() == 0:  # temp file + rename: a killed run never leaves half a cache file
            files.write_json_atomic(path, cache)
        results.append(result)
    return results


def _training_results(config: ml_collections.ConfigDict, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per method: eval steps, per-seed curves of pass@k and accuracy, and their mean over seeds."""
    d = config.dynamics
    methods = {}
    for method, seed_runs in runs.items():
        pass_at_k = {str(k): [r["pass_at_k"][str(k)] for r in seed_runs] for k in d.pass_k}
        methods[method] = {
            "seeds": list(d.seeds),
            "step": seed_runs[0]["step"],
            "pass_at_k": pass_at_k,
            "accuracy": [r["accuracy"] for r in seed_runs],
            "mean_pass_at_k": {k: np.mean(np.asarray(v), axis=0).tolist() for k, v in pass_at_k.items()},
            "resumed_from_step": [r["resumed_from_step"] for r in seed_runs],
        }
    return {"pass_k": list(d.pass_k), "rollouts_per_step": config.optim.batch_size * d.rollouts_per_prompt,
            "rollouts_per_prompt": d.rollouts_per_prompt, "estimator": d.estimator, "methods": methods}


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, stop_after: int | None = None,
        devices=None, make_figures: bool = True) -> dict[str, Any] | None:
    """Runs (or resumes) the whole experiment; returns the results, or None if ``stop_after`` stopped it. The
    run's door: the config is checked here, once, and the provenance read."""
    writers.record_run_start()  # results.json names the commit the run started from, not its last write's
    config_lib.validate_config(config)
    if config.mode == "training":
        return comparison.run_training(config, workdir, stop_after=stop_after, devices=devices,
                                       make_figures=make_figures)
    big = config.variant in ("gpu", "full")
    workdir = prepare_workdir(workdir, min_free_bytes=(1 << 30) if big else (1 << 26))
    # The analyses are cached under their own fingerprint and recomputed when it changes; the CE and dynamics
    # checkpoints are not, so the workdir is tied to the pre-training fields.
    claim_workdir(workdir, config_utils.fingerprint(config, training.PRETRAIN_FINGERPRINT))
    mesh = make_mesh(config.mesh, devices)
    data = load_data(config)
    build = functools.partial(model_lib.build_model, config, data.num_classes, data.image_shape[-1])
    graphdef, params, stats = build(config.seed)
    ctx = training.make_context(config, workdir, data, mesh, graphdef, StepAllowance(stop_after),
                                data_axes=tuple(a for a in config.mesh.data_axes if a in mesh.axis_names))
    try:
        pretrain = training.run_pretraining(ctx, params, stats)
        checkpoints = _analyse_stages(ctx, pretrain["checkpoint_steps"], params, stats)
        runs = {m: [training.run_dynamics(ctx, m, seed, build) for seed in config.dynamics.seeds]
                for m in config.dynamics.methods}
    except StopRequested:
        logging.warning("stopped after %d optimizer steps (--stop_after); run again to resume", stop_after)
        return None
    results = {"checkpoints": checkpoints, "training": _training_results(config, runs), "pretrain": pretrain,
               "analysis_set": {"num_prompts": config.analysis.num_prompts, "dataset": config.data.name,
                                "num_classes": data.num_classes}}
    writers.write_results_json(workdir, results, config)
    if make_figures:
        results["figures"] = [p.name for p in figures.make_all(results, workdir)]
    writers.print_summary(summary(results), title=f"imagenet_alignment ({config.variant})")
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers: every method's sampled-estimate cosine per budget at every checkpoint, final mean
    pass@k."""
    out: dict[str, Any] = {}
    for ck in results["checkpoints"]:
        out[f"step {ck['step']} N_bar"] = " ".join(f"{n:>6}" for n in ck["budgets"])
        for method, stats in ck["methods"].items():
            out[f"step {ck['step']} cos {method}"] = " ".join(f"{c:6.3f}" for c in stats["cos_sampled_mean"])
    for method, run in results["training"]["methods"].items():
        for k, curve in run["mean_pass_at_k"].items():
            out[f"final pass@{k} {method}"] = round(curve[-1], 4)
    return out


# ------------------------------------------------------------------------------------------ memory plan

# (image shape, classes) of each dataset, without reading it.
DATASET_SHAPES = {"digits": ((8, 8, 1), 10), "cifar10": ((32, 32, 3), 10), "imagenet2012": ((224, 224, 3), 1000)}


def _abstract(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def planned_calls(config: ml_collections.ConfigDict, devices=None) -> list[PlannedCall]:
    """The jitted calls of a run of ``config`` with abstract arguments (``python -m sera_jax.train.plan``): the CE
    and RL (dynamics) train steps and the validation call as ``training.compiled_steps`` builds them, and the
    analysis's two model programs (``programs.compiled``): the forward pass over the analysis set and one chunk
    of ``analysis.draw_chunk`` cotangents' gradients (the alignment draws), with the config's shapes. In training
    mode: the train steps its methods run and the validation call."""
    image_shape, num_classes = DATASET_SHAPES[config.data.name]
    mesh = make_mesh(config.mesh, devices)  # over ``devices`` (default: JAX's)
    data_axes = tuple(a for a in config.mesh.data_axes if a in mesh.axis_names)
    kwargs = dict(model_lib._resnet_kwargs(config, image_shape[-1]))
    with nnx.use_eager_sharding(False):
        module = nnx.eval_shape(lambda: resnet.build_resnet(config.model.name, num_classes,
                                                            nnx.Rngs(jax.random.key(0, impl="rbg")), **kwargs))
    graphdef, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
    tx = training.optimizer_from_config(config)
    steps = training.compiled_steps(graphdef, tx, mesh, data_axes, training._rl_static(config))
    rep, rows = steps.replicated, steps.rows
    state = jax.tree.map(lambda x: _abstract(x.shape, x.dtype, rep),
                         jax.eval_shape(lambda p, s: training.init_state(p, s, tx), params, stats))
    n = config.optim.batch_size
    batch = {"image": _abstract((n, *image_shape), jnp.float32, rows), "label": _abstract((n,), jnp.int32, rows)}
    lr = _abstract((), jnp.float32, rep)
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep)
    m = config.dynamics.rollouts_per_prompt
    e = config.data.eval_batch_size
    calls = []
    if config.mode == "alignment" or config_lib.CROSS_ENTROPY in config.dynamics.methods:  # pre-training, or a run
        calls.append(PlannedCall("ce step", steps.ce, (state, batch, lr), f"{n} images"))
    if training.rl_methods(config):  # one program for every RL method (an allocator switch), monitor included
        calls.append(PlannedCall("rl step", steps.rl, (state, batch, lr, key, _abstract((), jnp.int32, rep),
                                                       _abstract((), jnp.bool_, rep)),
                                 f"{n} images x {m} sampled labels, gradient monitor"))
    calls.append(PlannedCall("validation", steps.eval, (state["params"], state["batch_stats"],
                                                        _abstract((e, *image_shape), jnp.float32, rows),
                                                        _abstract((e,), jnp.int32, rows)), f"{e} images"))
    if config.mode == "training":  # no analysis
        return calls
    a = config.analysis
    micro = max(1, a.num_prompts // a.microbatch) if a.microbatch else 1
    fns = programs.compiled(graphdef, mesh, data_axes, a.draw_chunk, micro)
    x = _abstract((a.num_prompts, *image_shape), jnp.float32, fns.rows)
    p, s = state["params"], state["batch_stats"]
    calls.append(PlannedCall("analysis forward", fns.forward, (p, s, x, _abstract((a.num_prompts,), jnp.int32, fns.rows)),
                             f"{a.num_prompts} images in {micro} microbatch(es)"))
    cot = _abstract((a.draw_chunk, a.num_prompts, num_classes), jnp.float32, fns.chunk_rows)
    calls.append(PlannedCall("analysis draw chunk", fns.chunk_grads, (p, s, x, cot, p),
                             f"{a.draw_chunk} cotangents' gradients over {a.num_prompts} images"))
    return calls
