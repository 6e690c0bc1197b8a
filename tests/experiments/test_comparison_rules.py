"""Rules both RL comparisons (maze, math) share through ``sera_jax.rl.comparison``, checked on each."""

import dataclasses

import pytest

from experiments.math_reasoning import config as math_config
from experiments.math_reasoning import experiment as math_experiment
from experiments.maze import config as maze_config
from experiments.maze import experiment as maze_experiment

EXPERIMENTS = {"maze": (maze_config, maze_experiment), "math_reasoning": (math_config, math_experiment)}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_oracle_estimates_are_refused_before_any_work(tmp_path, name):
    config_lib, experiment = EXPERIMENTS[name]
    config = config_lib.get_config("tiny")
    config.sera.p_estimate = "oracle"  # neither task knows p under the policy
    with pytest.raises(ValueError, match=r"config\.sera\.p_estimate='oracle'.*cannot give the true success rates"):
        experiment.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_a_field_the_methods_decide_is_refused_before_any_work(tmp_path, name):
    """``--config.sera.method=serra`` used to run a whole comparison and record "serra": every method of
    ``config.methods`` sets ``sera.method`` itself, so the top-level value was never read."""
    config_lib, experiment = EXPERIMENTS[name]
    config = config_lib.get_config("tiny")
    config.methods = ("uniform",)
    config.sera.method = "serra"
    with pytest.raises(ValueError, match=r"config\.sera\.method='serra' would be ignored: config\.methods decides "
                                         r"it, each method setting its own \(uniform: 'uniform'\); choose the methods "
                                         r"with --config\.methods=a,b \(no method sets 'serra'; the methods: "):
        experiment.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


# A methods table of the usual kinds (the experiments' own tables change as methods are added and renamed).
TABLE = {
    "uniform": dict(method="uniform", estimator="maxrl", correction=False),
    "sera": dict(method="sera", estimator="maxrl", correction=True),
    "sera_epochs": dict(method="sera", estimator="maxrl", p_estimate="epoch_history", correction=True),
    "grpo": dict(method="uniform", estimator="grpo", correction=False),
    "uniform_lr": dict(method="uniform", estimator="maxrl", correction=False, rl=dict(learning_rate=3e-6)),
}
IGNORED = {  # name: (methods run, top-level changes, the message's words)
    "estimator": (("uniform", "sera"), {"sera.estimator": "grpo"},
                  r"config\.sera\.estimator='grpo' would be ignored: config\.methods decides it, each method setting "
                  r"its own \(uniform: 'maxrl', sera: 'maxrl'\); .* \(methods that set 'grpo': grpo\)$"),
    "correction": (("uniform", "sera"), {"sera.correction": False},
                   r"config\.sera\.correction=False would be ignored: .*\(uniform: False, sera: True\)"),
    "estimates": (("uniform", "sera_epochs"), {"sera.p_estimate": "history"},
                  r"config\.sera\.p_estimate='history' would be ignored: .*\(sera_epochs: 'epoch_history'\); .*"
                  r"no method sets 'history'"),
    "learning rate": (("sera", "uniform_lr"), {"rl.learning_rate": 1e-3},
                      r"config\.rl\.learning_rate=0\.001 would be ignored: .*\(uniform_lr: 3e-06\)"),
    "two fields": (("uniform",), {"sera.method": "dynamo", "sera.estimator": "grpo"},
                   r"config\.sera\.estimator='grpo' would be ignored: .*\(methods that set 'grpo': grpo\); "
                   r"config\.sera\.method='dynamo' would be ignored: .*\(no method sets 'dynamo'; the methods: "
                   r"grpo, sera, sera_epochs, uniform, uniform_lr\)$"),
}
USED = {  # name: (methods run, top-level changes every run reads)
    "set by no method run": (("uniform", "sera"), {"sera.p_estimate": "history", "sera.n_max": 16}),
    "set by every method run to the value asked for": (("uniform", "grpo"), {"sera.correction": False}),
    "a learning rate the methods share": (("uniform", "sera"), {"rl.learning_rate": 1e-3}),
}


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_a_change_some_method_would_ignore_names_config_methods(case):
    from sera_jax.rl import comparison
    experiment = dataclasses.replace(maze_experiment.EXPERIMENT, methods=TABLE)
    methods, changes, message = IGNORED[case]
    config = maze_config.get_config("tiny")
    config.methods = methods
    for path, value in changes.items():
        section, field = path.split(".")
        config[section][field] = value
    with pytest.raises(ValueError, match=message):
        comparison.check_method_fields(experiment, config, maze_config.get_config("tiny"))


@pytest.mark.parametrize("case", sorted(USED))
def test_a_change_every_run_reads_passes(case):
    from sera_jax.rl import comparison
    experiment = dataclasses.replace(maze_experiment.EXPERIMENT, methods=TABLE)
    methods, changes = USED[case]
    config = maze_config.get_config("tiny")
    config.methods = methods
    for path, value in changes.items():
        section, field = path.split(".")
        config[section][field] = value
    comparison.check_method_fields(experiment, config, maze_config.get_config("tiny"))


BAD_FIELDS = {
    # field: (value, the message's words); each used to fail only after SFT, or (empty seeds) to write an empty
    # results.json, or (a repeated seed) to train a run twice and count it twice.
    "seeds": ((), r"config\.seeds is empty"),
    "seeds ": ((0, 0), r"config\.seeds=\(0, 0\) repeats \[0\]"),
    "methods": (("uniform", "uniform"), r"config\.methods=\('uniform', 'uniform'\) repeats \['uniform'\]"),
    "sera.n_min": (0, r"config\.sera\.n_min=0 is too small for config\.sera\.estimator='maxrl'"),
    "eval.ks": ((1, 8), r"config\.eval\.ks=\(1, 8\): must be increasing ints in \[1, eval\.samples_per_prompt=4\]"),
    "eval.ks ": ((0,), r"config\.eval\.ks=\(0,\)"),
    "eval.ks  ": ((2, 1), r"config\.eval\.ks=\(2, 1\)"),
    # silently trained (a negative learning rate climbs the loss; -1 SFT steps ran none) or failed after SFT
    "rl.learning_rate": (-1e-4, r"config\.rl\.learning_rate=-0\.0001: must be a finite number > 0"),
    "rl.learning_rate ": (float("nan"), r"config\.rl\.learning_rate=nan: must be a finite number > 0"),
    "rl.b2": (1.0, r"config\.rl\.b2=1\.0: must be in \[0, 1\)"),
    "sft.steps": (-1, r"config\.sft\.steps=-1: must be an int >= 0"),
    "sft.batch_size": (0, r"config\.sft\.batch_size=0: must be an int >= 1"),
    "sft.learning_rate": (0.0, r"config\.sft\.learning_rate=0\.0: must be a finite number > 0"),
    "eval.every": (-1, r"config\.eval\.every=-1: must be an int >= 0 \(0: no evaluation\)"),
    "ckpt.max_to_keep": (0, r"config\.ckpt\.max_to_keep=0: must be an int >= 1, or None"),
    "sera.history_decay": (2.0, r"config\.sera\.history_decay=2\.0: must be in \(0, 1\]"),  # grew old counts
}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_bad_run_lists_evaluations_and_optimizers_are_refused_before_any_work(tmp_path, name, field):
    config_lib, experiment = EXPERIMENTS[name]
    config = config_lib.get_config("tiny")
    value, message = BAD_FIELDS[field]
    *parents, leaf = field.strip().split(".")
    node = config
    for parent in parents:
        node = node[parent]
    node[leaf] = value
    with pytest.raises(ValueError, match=message):
        experiment.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_field_but_the_declared_ones_is_in_the_fingerprint(name):
    from sera_jax.rl.comparison import MAY_CHANGE, rl_fingerprint

    config = EXPERIMENTS[name][0].get_config("tiny")
    fingerprint = rl_fingerprint(config, getattr(EXPERIMENTS[name][1], "LOCATIONS", ()))
    for field in ("rl.weight_decay", "rl.grad_clip", "rl.b1", "rl.b2", "rl.top_p", "rl.learning_rate",
                  "rl.temperature", "sera.method", "sera.n_max", "model.d_model", "sft.steps"):
        assert field in fingerprint, field
    assert not any(k == m or k.startswith(m + ".") for k in fingerprint for m in MAY_CHANGE)


def _run(seed: int, spent: int, final: float) -> dict:
    return {"seed": seed, "rollouts_spent": spent, "history": [{"step": 0, "loss": final}],
            "evaluations": [{"step": 1, "k": [1], "pass_at_k": [final]}]}


def test_a_rerun_keeps_the_seeds_and_methods_it_does_not_rerun():
    from sera_jax.rl.comparison import with_earlier_runs

    earlier = {"uniform": [_run(0, 32, 0.1), _run(1, 32, 0.2), _run(2, 32, 0.3)],
               "grpo": [_run(0, 32, 0.4), _run(1, 16, 0.5)]}  # grpo seed 1: a shorter run
    now = {"uniform": [_run(1, 32, 0.25)]}  # this invocation reran uniform seed 1 only
    merged, kept = with_earlier_runs(now, earlier, rollouts_spent=32)
    assert [(r["seed"], r["evaluations"][0]["pass_at_k"][0]) for r in merged["uniform"]] == \
        [(0, 0.1), (1, 0.25), (2, 0.3)]  # the rerun replaces its own seed only
    assert [r["seed"] for r in merged["grpo"]] == [0]  # a run of another length is not pooled
    assert kept == ["uniform/0", "uniform/2", "grpo/0"]



def test_the_samplers_are_built_once_and_shared_by_every_method_and_seed(tmp_path, monkeypatch):
    """Runs of equal sampling settings get the comparison's one ``SampleFns`` (one compilation each, not one
    per run): built once for 2 seeds x 2 methods, and every run's context holds those same functions."""
    from sera_jax.rl import comparison
    from sera_jax.rl import trainer as T

    config = maze_config.get_config("tiny")
    config.seeds, config.sft.steps, config.rl.steps = (0, 1), 0, 0  # no training: only what each run is built from
    from sera_jax.rl import config as rl_config
    from sera_jax.rl.settings import RunSettings

    built, contexts, validated = [], [], []
    make_sample_fns, make_context = comparison.make_sample_fns, T.make_context
    validate = rl_config.validate_rl_config
    monkeypatch.setattr(comparison, "make_sample_fns", lambda *a: built.append(make_sample_fns(*a)) or built[-1])
    monkeypatch.setattr(T, "make_context", lambda *a, **k: contexts.append(make_context(*a, **k)) or contexts[-1])
    monkeypatch.setattr(rl_config, "validate_rl_config", lambda c, **k: validated.append(c.sera.method) or
                        validate(c, **k))
    maze_experiment.run(config, tmp_path / "w")
    assert len(contexts) == len(config.seeds) * len(config.methods) == 4
    assert len(built) == 1
    assert all(c.sample_fn is built[0].train and c.eval_sample_fn is built[0].eval for c in contexts)
    # The RL settings are parsed once per method at the comparison's door; the runs get the typed records.
    assert sorted(validated) == sorted(config.methods)
    assert all(isinstance(c.settings, RunSettings) for c in contexts)


def test_runs_share_samplers_only_when_their_sampling_settings_are_equal():
    from flax import nnx

    from sera_jax.rl.comparison import shared_sample_fns
    from sera_jax.rl.trainer import make_sample_fns

    config = maze_config.get_config("tiny")
    task = maze_experiment.EXPERIMENT.make_task(config, None)
    graphdef = nnx.graphdef(maze_experiment.build_model(config, 0))
    built: dict = {}
    first = shared_sample_fns(built, graphdef, task, config)
    assert shared_sample_fns(built, graphdef, task, maze_experiment.method_config(config, "sera")) is first
    other = config.copy_and_resolve_references()
    other.rl.top_p = 0.9
    assert shared_sample_fns(built, graphdef, task, other) is not first and len(built) == 2
    assert first.train is first.eval  # training and evaluation sample alike here: one function
    other.eval.sample_slots = 3
    fns = make_sample_fns(graphdef, task, other)
    assert fns.train is not fns.eval and fns.eval._fn.keywords["num_slots"] == 3


def test_an_invocation_with_other_seeds_rebuilds_the_shared_start_and_pools_its_runs(tmp_path):
    """Runs made in two invocations with other seeds (e.g. two sessions, each with a fresh workdir and the first
    one's results.json) pool into one results.json: the shared start is built from ``sft.seed``, not the first
    of ``seeds``, so both invocations train from the same start, and the earlier command stays on record."""
    import json
    import shutil

    config = maze_config.get_config("tiny")
    config.methods, config.sft.shared, config.rl.steps = ("uniform",), True, 1
    config.seeds = (1,)
    first = maze_experiment.run(config, tmp_path / "a")
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "results.json", tmp_path / "b" / "results.json")
    config.seeds = (2,)
    second = maze_experiment.run(config, tmp_path / "b")
    assert second["sft_final_loss"] == first["sft_final_loss"]
    assert second["methods"]["uniform"]["seeds"] == [1, 2]
    assert second["kept_from_earlier_invocations"] == ["uniform/1"]
    earlier = json.loads((tmp_path / "a" / "results.json").read_text())["provenance"]
    assert second["earlier_provenance"] == [earlier]


def test_a_seed_runs_from_one_start_and_other_seeds_pool_from_any():
    """Another machine's floating point trains another start from the same config: its seeds pool with the
    earlier ones, but a seed whose earlier runs came from another start is refused (its methods are paired)."""
    from sera_jax.rl.comparison import check_seed_start, earlier_provenance, start_by_seed

    runs = {"uniform": [{"seed": 0}, {"seed": 3}], "sera": [{"seed": 0}]}
    old_file = {"results": {"sft_final_loss": {"shared": 0.5}, "earlier_provenance": [{"argv": ["x"]}]},
                "provenance": {"argv": ["y"]}}  # written before start_by_seed was kept
    assert start_by_seed(old_file, runs) == {0: 0.5, 3: 0.5}
    assert start_by_seed({"results": {"sft_final_loss": {"0": 0.5, "3": 0.25}}}, runs) == {0: 0.5, 3: 0.25}
    starts = start_by_seed({"results": {"start_by_seed": {"0": 0.5, "3": 0.7}}}, runs)
    assert starts == {0: 0.5, 3: 0.7}
    check_seed_start(starts, 0, 0.5)
    check_seed_start(starts, 5, 0.9)  # a new seed: any start
    check_seed_start({}, 0, 0.9)  # nothing earlier
    with pytest.raises(ValueError, match=r"runs of seed 3 from another start \(SFT final loss 0.7, now 0.5"):
        check_seed_start(starts, 3, 0.5)
    assert earlier_provenance(old_file) == [{"argv": ["x"]}, {"argv": ["y"]}]


def test_an_invocation_from_another_start_adds_seeds_and_refuses_earlier_ones(tmp_path):
    """The earlier results.json's start edited to another loss (as another machine would train it): new seeds
    pool, each with its own start in start_by_seed, and an earlier seed is refused before any training."""
    import json
    import shutil

    config = maze_config.get_config("tiny")
    config.methods, config.sft.shared, config.rl.steps = ("uniform",), True, 1
    config.seeds = (1,)
    first = maze_experiment.run(config, tmp_path / "a")
    loss = first["sft_final_loss"]["shared"]
    assert first["start_by_seed"] == {"1": loss}
    payload = json.loads((tmp_path / "a" / "results.json").read_text())
    payload["results"]["start_by_seed"] = {"1": loss + 1.0}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(json.dumps(payload))
    shutil.copytree(tmp_path / "a" / "sft", tmp_path / "b" / "sft")  # the same start, not trained again
    config.seeds = (2,)
    second = maze_experiment.run(config, tmp_path / "b")
    assert second["methods"]["uniform"]["seeds"] == [1, 2]
    assert second["start_by_seed"] == {"1": loss + 1.0, "2": loss}
    config.seeds = (1, 3)
    with pytest.raises(ValueError, match=r"runs of seed 1 from another start"):
        maze_experiment.run(config, tmp_path / "b")
    assert not (tmp_path / "b" / "seed_3").exists()


def test_a_seeds_start_is_evaluated_once_for_all_its_methods(tmp_path, monkeypatch):
    """The step-0 evaluation depends on the start, the seed and config.eval only, so the methods of a seed share
    one (sampled by the first method's run); later evaluations are each run's own. The shared one equals what
    sampling it again gives (the tiny maze evaluates at steps 0 and 2)."""
    from sera_jax.rl import trainer as T

    config = maze_config.get_config("tiny")
    config.methods, config.seeds = ("uniform", "sera"), (0, 1)
    calls = []
    evaluate = T.evaluate
    monkeypatch.setattr(T, "evaluate", lambda ctx, params, step, seed, **k: calls.append((seed, step)) or
                        evaluate(ctx, params, step, seed, **k))
    results = maze_experiment.run(config, tmp_path / "w")
    final = config.rl.steps
    assert sorted(calls) == sorted([(s, 0) for s in (0, 1)] + [(s, final) for s in (0, 1) for _ in range(2)])
    for seed in (0, 1):
        starts = [next(c for c in results["methods"][m]["curves"] if c["seed"] == seed)["evaluations"][0]
                  for m in config.methods]
        assert starts[0]["step"] == 0 and all(s == starts[0] for s in starts[1:])
    monkeypatch.setattr(T, "evaluate", evaluate)
    config.methods, config.seeds = ("sera",), (1,)  # alone in a fresh workdir: sera samples its own
    alone = maze_experiment.run(config, tmp_path / "alone")
    assert alone["methods"]["sera"]["curves"] == results["methods"]["sera"]["curves"][1:]


@pytest.mark.parametrize("text", ['{"results": {"methods": {"uniform": [', '{"provenance": {}}', '[1, 2]'])
def test_a_broken_results_file_is_refused_by_path_before_any_work_and_kept(tmp_path, text):
    """A results.json cut short, or not the runner's (no "results"), names itself and how to start afresh; it is
    neither overwritten nor trained past (no SFT start is written)."""
    config = maze_config.get_config("tiny")
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "results.json").write_text(text)
    with pytest.raises(ValueError, match=r"results\.json is not a results\.json this runner wrote.*move it away"):
        maze_experiment.run(config, workdir)
    assert (workdir / "results.json").read_text() == text
    assert not (workdir / "sft").exists()


def test_methods_run_in_a_second_workdir_pool_into_the_first_without_training(tmp_path):
    """Two workdirs sharing a start run different methods at once; the second's run folders copied into the
    first restore there with no optimizer step (``stop_after=0`` would stop any) and the same pass@k."""
    import json
    import shutil

    config = maze_config.get_config("tiny")
    config.sft.shared, config.rl.steps, config.seeds = True, 1, (1,)
    a, b = tmp_path / "a", tmp_path / "b"
    config.methods = ("uniform",)
    maze_experiment.run(config, a)
    b.mkdir()
    shutil.copytree(a / "sft", b / "sft")
    shutil.copy(a / "results.json", b / "results.json")
    config.methods = ("grpo",)
    second = maze_experiment.run(config, b)
    shutil.copytree(b / "seed_1" / "grpo", a / "seed_1" / "grpo")
    pooled = maze_experiment.run(config, a, stop_after=0)
    assert pooled is not None, "restoring a finished run must not train"
    assert pooled["methods"]["grpo"]["pass_at_k"] == second["methods"]["grpo"]["pass_at_k"]
    assert pooled["kept_from_earlier_invocations"] == ["uniform/1"]
    assert sorted(json.loads((a / "results.json").read_text())["results"]["methods"]) == ["grpo", "uniform"]


# DARS's sizes that core.dars refuses only once a step runs (core.dars.check_sizes), on a tiny config with P = 4.
DARS_SIZES = {
    # the schedule's exact int32 arithmetic stops at a pilot of 1024 rollouts
    "pilot": (dict(pilot_rollouts=1025, n_max=1100), 4 * 1030,
              r"config\.sera\.pilot_rollouts=1025, config\.sera\.n_min=2, .*the pilot size n0 must be <= 1024"),
    # int32 counts: refused even when nothing is left for the shares (B = P max(n_min, n0))
    "n_max": (dict(pilot_rollouts=2, n_min=3, n_max=2**31), 4 * 3,
              r"config\.sera\.pilot_rollouts=2, config\.sera\.n_min=3, .*n_max must be < 2\^31"),
    # B2 (n_max - max(n_min, n0)) = (2^18 - 8) (2^20 - 2) >= 2^31
    "shares": (dict(pilot_rollouts=2, n_min=2, n_max=2**20), 4 * 2**16,
               r"config\.rl\.rollouts_per_step=262144: budget 262144 is too large for exact int32 shares"),
}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
@pytest.mark.parametrize("case", sorted(DARS_SIZES))
def test_dars_sizes_refused_at_run_time_are_refused_by_the_config(name, case):
    from sera_jax.rl import comparison
    config_lib, experiment = EXPERIMENTS[name]
    config = config_lib.get_config("tiny")
    config.methods = ("dars",)
    sera, budget, message = DARS_SIZES[case]
    config.sera.update(sera)
    config.rl.update(prompts_per_step=4, rollouts_per_step=budget)
    with pytest.raises(ValueError, match=message):
        comparison.check_methods(experiment.EXPERIMENT, config, num_shards=1)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_dars_with_n_min_above_the_pilot_passes_the_config(name):
    """A pilot of 2 under n_min = 3: DARS reads its schedule at the pilot's 2 (core.dars.PilotFractions), so the
    config is valid (it used to fail at run time, once a prompt's pilot fraction 1/2 was no multiple of 1/3)."""
    from sera_jax.rl import comparison
    config_lib, experiment = EXPERIMENTS[name]
    config = config_lib.get_config("tiny")
    config.methods = ("dars",)
    config.sera.update(pilot_rollouts=2, n_min=3)
    config.rl.update(prompts_per_step=4, rollouts_per_step=16)
    comparison.check_methods(experiment.EXPERIMENT, config, num_shards=1)
