"""One runner for the RL method comparisons (maze, math): ``run_comparison(experiment, config, workdir)``.

Per seed a start policy (the experiment's model, then SFT when ``config.sft.steps > 0``; with
``config.sft.shared`` one for all seeds, which then differ only in RL), optionally a profile of that start,
then RL from that same start for every method of ``config.methods`` (``config.sera`` changed as the
experiment's ``methods`` table says; a top-level change to a field the table sets for a method it runs is
refused, ``check_method_fields``: those runs would ignore it). Each phase prints a line as it begins
(``writers.status``); the closing summary gives each method's final pass@k with its k. Results over seeds with
paired differences against uniform go to ``WORKDIR/results.json``; the experiment draws its figures from them.
A rerun with fewer seeds or methods keeps the earlier results of those it does not rerun (``with_earlier_runs``);
a rerun with fewer ``rl.steps`` than a run's checkpoint is refused (``run_loop``). Seeds pool across invocations
and machines, each seed's methods from one start (``check_seed_start``; ``start_by_seed`` in results.json).

Workdir layout: ``sft/`` (shared start) or ``seed_<seed>/sft/``, and ``seed_<seed>/METHOD/`` (checkpoints, metrics;
with ``config.log.wandb`` on, each of these folders is one W&B run, ``writers.wandb_run``).
One fingerprint rule protects it (``rl_fingerprint``): every config field except those that may change
between a run and its resume (``MAY_CHANGE``) and the experiment's file locations.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Iterable
from typing import Any, Optional

import jax
import ml_collections
from absl import logging
from flax import nnx

import sera_jax.core as core
from sera_jax.report import matched as matched_lib
from sera_jax.report import stats as stats_lib
from sera_jax.rl import config as rl_config
from sera_jax.rl.settings import (RLSettings, RunSettings, SftSettings, check_task_fit, frozen, parse_run_settings,
                                  parse_sft_settings)
from sera_jax.rl.sft import run_sft
from sera_jax.rl.task import RLTask
from sera_jax.rl.trainer import SampleFns, data_order, make_sample_fns, make_update, sample_fn_settings, train_rl
from sera_jax.train import config_utils
from sera_jax.train import sharding as sharding_lib
from sera_jax.train.loop import StepAllowance, StopRequested
from sera_jax.train.workdir import claim_workdir, prepare_workdir
from sera_jax.train.writers import (MetricWriter, format_pass_at_k, print_summary, record_run_start, status,
                                    validate_wandb_config, wandb_run, write_results_json)

# Fields a resumed run may change: more RL steps or seeds, other methods, evaluation and logging, memory knobs
# and the mesh (checkpoints restore into any layout). Everything else changes what the checkpoints mean.
MAY_CHANGE = ("variant", "seeds", "methods", "rl.steps", "rl.sample_chunk", "rl.update_microbatches",
              "rl.logprob_chunk", "rl.share_prompts", "rl.sample_slots", "model.attention", "model.remat",
              "model.scan_layers", "eval", "ckpt", "log.progress", "log.wandb", "mesh",
              "matched_pass_at_1")


def rule_fingerprint(config: ml_collections.ConfigDict, allocator: Optional[core.Allocator] = None) -> dict[str, str]:
    """What a method's checkpoints record beyond its config: the released SERA rule, for the methods that run it.
    'sera' named the all-active max–min before the released rule took its name; a checkpoint saved then lacks
    this entry, so resuming it under the new rule is refused with the field named (its files are kept).
    ``allocator``: the one ``config.sera.method`` names, when the caller holds it (else looked up here)."""
    if rl_config.method_allocator(config, allocator).may_skip_prompts:
        return {"sera_rule": "released (active set, zero-rollout prompts)"}
    return {}


def method_rl_fingerprint(experiment: "Experiment", method: str) -> dict[str, Any]:
    """The ``config.rl`` fields a method changes (a learning-rate arm), which its checkpoints must record: they are
    not in the comparison's own fingerprint. Empty for the methods that share ``config.rl``."""
    rl_fields = experiment.methods[method].get("rl", {})
    return {"method_rl": dict(sorted(rl_fields.items()))} if rl_fields else {}


def rl_fingerprint(config: ml_collections.ConfigDict, locations: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fingerprint of an RL comparison's workdir: every leaf of ``config`` but ``MAY_CHANGE`` and
    ``locations`` (fields that say where files are, not what they hold)."""
    return config_utils.fingerprint(config, tuple(config.keys()), exclude=MAY_CHANGE + tuple(locations))


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What a comparison needs from an experiment (its ``main`` builds one and calls ``run_comparison``)."""

    name: str
    methods: dict[str, dict]  # method -> the fields of config.sera it changes
    reference_config: Callable[[str], ml_collections.ConfigDict]  # get_config(variant): the known fields
    make_task: Callable[[ml_collections.ConfigDict, pathlib.Path], RLTask]
    build_model: Callable[..., nnx.Module]  # (config, task, seed, mesh) -> the untrained start model
    make_figures: Callable[[dict, dict, pathlib.Path], list]  # (results, config dict, out dir) -> paths
    endless_task: bool = False  # no fixed training set (so no history tracker)
    knows_success_rates: bool = False
    locations: tuple[str, ...] = ()
    # (config, task, model, seed, start_dir, placement) -> a summary of the start policy stored in results
    profile_start: Optional[Callable[..., Optional[dict]]] = None
    extra_rows: Callable[[ml_collections.ConfigDict], dict[str, int]] = lambda config: {}
    describe_task: Callable[[ml_collections.ConfigDict, RLTask], dict] = lambda config, task: {}


def method_config(experiment: Experiment, config: ml_collections.ConfigDict, method: str):
    return rl_config.method_config(config, experiment.methods, method)


def check_run_lists(config: ml_collections.ConfigDict) -> None:
    """``config.seeds`` and ``config.methods`` name each run once: an empty list would write an empty
    results.json, and a repeated entry would train the same run twice and count it twice in the statistics."""
    for field in ("seeds", "methods"):
        values = tuple(config[field])
        if not values:
            raise ValueError(f"config.{field} is empty: there is nothing to run")
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if repeated:
            raise ValueError(f"config.{field}={values!r} repeats {repeated}: list each once")
    if not all(config_utils.is_int(s) for s in config.seeds):
        raise ValueError(f"config.seeds={tuple(config.seeds)!r}: seeds must be ints")


def check_method_fields(experiment: Experiment, config: ml_collections.ConfigDict,
                        reference: ml_collections.ConfigDict) -> None:
    """Refuses a field that ``config.methods`` decides: each method's entry of the experiment's methods table sets
    its ``config.sera`` fields (and ``config.rl`` ones, for an arm of a learning-rate sweep), so the same field
    changed at the top level (``--config.sera.method=dynamo``) would be ignored by the runs of the methods that set
    it to another value. A change from the variant's config (``reference``, ``experiment.reference_config``) to
    such a field is a ValueError naming ``config.methods``, what each method sets, and the methods that set the
    value asked for."""
    set_by: dict[str, dict[str, Any]] = {}  # field -> {method run: the value it sets}
    for method in config.methods:
        for path, value in method_fields(experiment, method).items():
            set_by.setdefault(path, {})[method] = value
    problems = []
    for path, values in sorted(set_by.items()):
        group, name = path.split(".")  # method_fields names config.sera and config.rl fields only
        asked = config[group][name]
        if _same(asked, reference[group].get(name)) or all(_same(asked, v) for v in values.values()):
            continue  # unchanged, or every method that sets it sets the value asked for
        givers = [m for m in experiment.methods
                  if path in method_fields(experiment, m) and _same(method_fields(experiment, m)[path], asked)]
        hint = (f"methods that set {asked!r}: {', '.join(givers)}" if givers
                else f"no method sets {asked!r}; the methods: {', '.join(sorted(experiment.methods))}")
        problems.append(f"config.{path}={asked!r} would be ignored: config.methods decides it, each method setting "
                        f"its own ({', '.join(f'{m}: {v!r}' for m, v in values.items())}); choose the methods with "
                        f"--config.methods=a,b ({hint})")
    if problems:
        raise ValueError("; ".join(problems))


def _same(a: Any, b: Any) -> bool:
    """Equal as config values (a tuple equals the list it becomes in JSON)."""
    return frozen(a) == frozen(b)


def method_fields(experiment: Experiment, method: str) -> dict[str, Any]:
    """{dotted config field: value} of what ``method``'s entry of the experiment's methods table sets
    (``{"sera.method": "uniform", ..., "rl.learning_rate": 3e-6}``)."""
    sera = dict(experiment.methods[method])
    rl = sera.pop("rl", {})
    return {**{f"sera.{k}": v for k, v in sera.items()}, **{f"rl.{k}": v for k, v in rl.items()}}


def check_methods(experiment: Experiment, config: ml_collections.ConfigDict, num_shards: int,
                  num_train_prompts: Optional[int] = None) -> dict[str, RunSettings]:
    """Every method's settings, parsed and checked once, before any work (``settings.parse_run_settings``: valid
    for the task, its rows split over the shards; ``num_train_prompts``: the training set's size where it is
    known). The task-dependent checks follow when the task is built (``check_task_fit``)."""
    return {method: parse_run_settings(
        method_config(experiment, config, method), endless=experiment.endless_task,
        knows_success_rates=experiment.knows_success_rates, num_shards=num_shards,
        extra_rows=experiment.extra_rows(config), num_train_prompts=num_train_prompts) for method in config.methods}


def planning_settings(experiment: Experiment, config: ml_collections.ConfigDict) -> tuple[RunSettings, SftSettings]:
    """The settings of a run of ``config`` as it stands (``config.sera`` and ``config.rl``, no method's changes) and
    of its SFT start, checked as a comparison's door checks them: what the memory planner lays out."""
    sft = parse_sft_settings(config)
    return parse_run_settings(config, endless=experiment.endless_task,
                              knows_success_rates=experiment.knows_success_rates), sft


def check_methods_fit_task(experiment: Experiment, settings: dict[str, RunSettings], task: RLTask) -> None:
    """The checks of each method's settings that need the built ``task`` (its training set, its response cap)."""
    for method_settings in settings.values():
        check_task_fit(method_settings, endless=experiment.endless_task, num_train_prompts=task.num_train_prompts,
                       max_new_tokens=task.max_new_tokens)


def start_policy(experiment: Experiment, config: ml_collections.ConfigDict, task: RLTask, seed: int,
                 start_dir: pathlib.Path, placement: sharding_lib.Placement,
                 allowance: Optional[StepAllowance] = None,
                 workdir: Optional[pathlib.Path] = None, who: str = "start",
                 sft: Optional[SftSettings] = None) -> tuple[nnx.Module, list]:
    """The policy every method of a seed starts from (SFT when ``sft.steps``; ``sft``: the settings parsed at the
    door, else ``config.sft``'s), on the run's mesh. ``workdir``: the comparison's (default ``start_dir``), which
    names the SFT's W&B run; ``who``: the start's name in the status line."""
    sft = sft or SftSettings.from_config(config)
    sft_dir = start_dir / "sft"
    status(f"{who}: SFT, {plural(sft.steps, 'step')} ({sft_dir})" if sft.steps else f"{who}: start policy, no SFT")
    model = experiment.build_model(config, task, seed, placement.mesh)
    log: list = []
    if sft.steps:
        with MetricWriter(sft_dir, wandb=wandb_run(config, workdir or start_dir, sft_dir)) as writer:
            model, log = run_sft(model, lambda step: task.sft_batch(step, sft.batch_size),
                                 steps=sft.steps, learning_rate=sft.learning_rate, b1=sft.b1, b2=sft.b2,
                                 weight_decay=sft.weight_decay, schedule=sft.schedule,
                                 warmup_steps=sft.warmup_steps, workdir=sft_dir, writer=writer,
                                 allowance=allowance, show_progress=config.log.progress)
    nnx.update(model, placement.tree(nnx.state(model)))  # SFT ran on one device; RL runs on the mesh
    return model, log


def run_comparison(experiment: Experiment, config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
                   stop_after: Optional[int] = None) -> Optional[dict[str, Any]]:
    """Runs (or resumes) the comparison; returns the results written to ``WORKDIR/results.json``, or None when
    ``stop_after`` optimizer steps (SFT and RL, all runs of this invocation) stopped it first."""
    try:
        return _run_comparison(experiment, config, workdir, StepAllowance(stop_after))
    except StopRequested:
        logging.warning("stopped after %d optimizer steps (--stop_after); run again to resume", stop_after)
        return None


def _run_comparison(experiment: Experiment, config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                    allowance: StepAllowance) -> dict[str, Any]:
    record_run_start()  # results.json names the commit this run started from, not the one its last write sees
    reference = experiment.reference_config(config.variant)
    check_run_lists(config)
    check_matched_spec(config, experiment.methods)
    config_utils.check_no_unknown_fields(config, reference)
    sft = parse_sft_settings(config)
    validate_wandb_config(config)
    placement = sharding_lib.make_placement(config.mesh)
    settings = check_methods(experiment, config, placement.num_batch_shards)  # each method's, parsed once
    check_method_fields(experiment, config, reference)
    workdir = prepare_workdir(workdir)
    fingerprint = rl_fingerprint(config, experiment.locations)
    claim_workdir(workdir, fingerprint)
    earlier_file, earlier = read_earlier_results(workdir)  # runs this invocation may not rerun (read first)
    earlier_starts = start_by_seed(earlier_file, earlier)
    task = experiment.make_task(config, workdir)
    data_order(task, config, 0)  # a task that cannot reorder fails here, before any training
    # ... or too small a run; each method's allocator, looked up there once, goes on to its run's fingerprint.
    check_methods_fit_task(experiment, settings, task)
    # One optimizer and compiled update per set of config.rl settings (the methods share config.rl unless one
    # changes it, as a learning-rate arm does). The samplers are shared likewise, one per set of sampling settings
    # (built on first use, so each compiles once per comparison).
    updates: dict[RLSettings, tuple] = {}
    sample_fns: dict[tuple, SampleFns] = {}
    runs: dict[str, list[dict]] = {m: [] for m in config.methods}
    starts: dict[str, tuple[nnx.Module, list, Optional[dict]]] = {}
    num_runs = len(config.seeds) * len(config.methods)
    status(f"{experiment.name}: {plural(len(config.seeds), 'seed')} x {plural(len(config.methods), 'method')} "
           f"({', '.join(config.methods)}), {plural(config.rl.steps, 'RL step')} each, in {workdir}")
    for seed in config.seeds:
        name, start_dir = ("shared", workdir) if sft.shared else (str(seed), workdir / f"seed_{seed}")
        if name not in starts:
            # A shared start has its own seed (not the first of config.seeds), so that an invocation with other
            # seeds rebuilds the same start (on a machine with the same floating point) and its runs can be
            # pooled with the earlier ones.
            start_seed = sft.seed if sft.shared else seed
            who = f"shared start (sft.seed {start_seed})" if sft.shared else f"seed {seed}"
            model, log = start_policy(experiment, config, task, start_seed, start_dir, placement, allowance, workdir,
                                      who=who, sft=sft)
            for other in (config.seeds if sft.shared else (seed,)):  # before any of them trains
                check_seed_start(earlier_starts, other, final_loss(log))
            profile = None if experiment.profile_start is None else experiment.profile_start(
                config, task, model, start_seed, start_dir, placement)
            starts[name] = (model, log, profile)
        start = starts[name][0]
        start_evaluation = None  # the seed's step-0 evaluation: the same for every method (one start, seed, key)
        for method in config.methods:
            run_dir = workdir / f"seed_{seed}" / method
            run_config = method_config(experiment, config, method)
            done = sum(len(r) for r in runs.values())
            status(f"seed {seed}, {method} (run {done + 1} of {num_runs}): RL, "
                   f"{plural(run_config.rl.steps, 'step')} ({run_dir})")
            run_settings = settings[method]
            samplers = shared_sample_fns(sample_fns, nnx.graphdef(start), task, run_settings)
            if run_settings.rl not in updates:
                updates[run_settings.rl] = make_update(nnx.graphdef(start), run_settings)
            update = updates[run_settings.rl]
            with MetricWriter(run_dir, wandb=wandb_run(run_config, workdir, run_dir)) as writer:
                run = train_rl(task, start, run_settings, run_dir, seed=seed, writer=writer, placement=placement,
                               fingerprint={**fingerprint, "method": method,
                                            **rule_fingerprint(run_config, run_settings.allocator),
                                            **method_rl_fingerprint(experiment, method)},
                               update=update, sample_fns=samplers,
                               allowance=allowance, show_progress=config.log.progress,
                               start_evaluation=start_evaluation, desc=f"seed {seed}, {method}")
            if start_evaluation is None and run.evaluations and run.evaluations[0]["step"] == 0:
                start_evaluation = run.evaluations[0]
            runs[method].append({"seed": seed, "history": run.history, "evaluations": run.evaluations,
                                 "rollouts_spent": run.step * config.rl.rollouts_per_step})
    runs, kept = with_earlier_runs(runs, earlier, config.rl.steps * config.rl.rollouts_per_step)
    results = stats_lib.summarize_runs(runs)
    matched = matched_lib.matched_endpoints(results["methods"], config.matched_pass_at_1) if "matched_pass_at_1" in config else None
    if matched is not None:
        results["matched_pass_at_1"] = matched
    if kept:
        results["kept_from_earlier_invocations"] = kept
        results["earlier_provenance"] = earlier_provenance(earlier_file)
    results["sft_final_loss"] = {name: final_loss(log) for name, (_, log, _) in starts.items()}
    now_starts = {seed: results["sft_final_loss"]["shared" if sft.shared else str(seed)]
                  for seed in config.seeds}
    seeds = sorted({r["seed"] for method_runs in runs.values() for r in method_runs})
    results["start_by_seed"] = {str(s): now_starts[s] if s in now_starts else earlier_starts.get(s) for s in seeds}
    profiles = {name: prof for name, (_, _, prof) in starts.items() if prof is not None}
    if profiles:
        results["start_profile"] = profiles
    description = experiment.describe_task(config, task)
    if description:
        results["task"] = description
    results_path = write_results_json(workdir, results, config)
    figures = []
    if jax.process_index() == 0:  # one writer of the shared workdir's figures
        figures = experiment.make_figures(results, config_utils.config_to_dict(config), workdir)
    print_summary(pass_at_k_summary(results),
                  title=f"{experiment.name}: final pass@k (mean over {plural(len(seeds), 'seed')})")
    status(f"results: {results_path}" + (f" and {plural(len(figures), 'figure')} in {workdir}" if figures else ""))
    return results


def plural(n: int, noun: str) -> str:
    """``1 seed``, ``2 seeds``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def pass_at_k_summary(results: dict[str, Any]) -> dict[str, str]:
    """method -> its final pass@k (mean over seeds), each labelled with its k (``pass@1 0.123  pass@2 ...``)."""
    return {method: format_pass_at_k(entry["pass_at_k"]["k"], entry["pass_at_k"]["mean"])
            for method, entry in results["methods"].items() if "pass_at_k" in entry}


def check_matched_spec(config: ml_collections.ConfigDict, known_methods: Iterable[str]) -> None:
    """``config.matched_pass_at_1`` (when the variant has one) names methods of the experiment and evaluated k's:
    fail before any work, not when the results are written. (An invocation may run some of them: the endpoint is
    computed once the pooled results hold them all.)"""
    if "matched_pass_at_1" not in config:
        return
    spec, known = config.matched_pass_at_1, set(known_methods)
    for field in ("treated", "references"):
        unknown = [m for m in spec[field] if m not in known]
        if unknown or not spec[field]:
            raise ValueError(f"config.matched_pass_at_1.{field}={tuple(spec[field])!r}: {unknown or 'empty'}; "
                             f"each must be a method of the experiment ({sorted(known)})")
    missing = [k for k in (1, spec.k, *spec.other_ks) if k not in config.eval.ks]
    if missing:
        raise ValueError(f"config.matched_pass_at_1 reads pass@k at k={missing}, which config.eval.ks="
                         f"{tuple(config.eval.ks)!r} does not evaluate")


def shared_sample_fns(built: dict[tuple, SampleFns], graphdef: nnx.GraphDef, task: RLTask,
                      settings: RunSettings) -> SampleFns:
    """The samplers of a run of ``settings``: those in ``built`` for equal sampling settings
    (``sample_fn_settings``), else new ones, added to ``built``."""
    key = sample_fn_settings(graphdef, task, settings)
    if key not in built:
        built[key] = make_sample_fns(graphdef, task, settings)
    return built[key]


def read_earlier_results(workdir: pathlib.Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """An earlier invocation's ``WORKDIR/results.json`` and its runs (``({}, {})`` if there is no file)."""
    path = workdir / "results.json"
    if not path.exists():
        return {}, {}
    try:
        payload = json.loads(path.read_text())
        return payload, stats_lib.runs_from_summary(payload["results"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a results.json this runner wrote ({e!r}); move it away to start "
                         "the results afresh (the checkpoints are untouched)") from e


def final_loss(sft_log: list) -> Optional[float]:
    """A start's identity in results.json: its SFT final loss (None without SFT)."""
    return float(sft_log[-1]["loss"]) if sft_log else None


def start_by_seed(earlier_file: dict[str, Any], earlier: dict[str, list[dict[str, Any]]]) -> dict[int, Any]:
    """seed -> the start (SFT final loss) the earlier runs of that seed trained from. A results.json written
    before ``start_by_seed`` was kept names its starts in ``sft_final_loss`` only: "shared", or one per seed."""
    results = earlier_file.get("results", {})
    if "start_by_seed" in results:
        return {int(seed): loss for seed, loss in results["start_by_seed"].items()}
    losses = results.get("sft_final_loss") or {}
    seeds = {r["seed"] for method_runs in earlier.values() for r in method_runs}
    return {seed: losses.get("shared", losses.get(str(seed))) for seed in seeds}


def check_seed_start(earlier_starts: dict[int, Any], seed: int, now: Optional[float]) -> None:
    """Refuses to run a seed whose earlier runs trained from another start: a seed's methods are compared in
    pairs, so they must share their start. Earlier runs of other seeds are pooled whatever their start: SFT is
    deterministic for a config and seed on one machine, but another machine's floating point (XLA's CPU code
    differs with the instruction set) trains another start from the same seed, so a comparison continued in
    another session adds whole seeds, each with all its methods, and ``start_by_seed`` says which start each
    seed trained from."""
    before = earlier_starts.get(seed)
    if before is not None and now is not None and float(before) != float(now):
        raise ValueError(f"results.json holds runs of seed {seed} from another start (SFT final loss {before!r}, "
                         f"now {now!r}: other code, data or machine): the methods of a seed must share their "
                         "start; run seeds that are not in results.json, or move results.json away")


def earlier_provenance(earlier_file: dict[str, Any]) -> list[dict[str, Any]]:
    """The commands and commits of the earlier invocations whose runs a results.json keeps, oldest first."""
    chain = list(earlier_file.get("results", {}).get("earlier_provenance", []))
    return chain + ([earlier_file["provenance"]] if earlier_file.get("provenance") else [])


def with_earlier_runs(runs: dict[str, list[dict]], earlier: dict[str, list[dict]],
                      rollouts_spent: int) -> tuple[dict[str, list[dict]], list[str]]:
    """``runs`` plus the earlier runs of (method, seed) pairs this invocation did not run, so a rerun with fewer
    seeds or methods keeps the others' results; only earlier runs of the same length (``rollouts_spent``) are
    kept, as results of runs of another length would be pooled with these. Returns (runs, "method/seed" kept)."""
    merged = {m: list(r) for m, r in runs.items()}
    kept, skipped = [], []
    for method, method_runs in earlier.items():
        done = {r["seed"] for r in merged.get(method, [])}
        for run in method_runs:
            if run["seed"] in done:
                continue
            if run["rollouts_spent"] != rollouts_spent:
                skipped.append(f"{method}/{run['seed']}")
                continue
            merged.setdefault(method, []).append(run)
            kept.append(f"{method}/{run['seed']}")
        if any(k.startswith(f"{method}/") for k in kept):
            merged[method].sort(key=lambda r: r["seed"])
    if skipped:
        logging.warning("results.json: earlier runs %s trained for another number of rollouts than %d; not kept "
                        "(their checkpoints are; rerun them with their seeds and methods to report them)",
                        ", ".join(skipped), rollouts_spent)
    return merged, kept
