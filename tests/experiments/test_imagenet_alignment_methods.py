"""How the alignment analysis runs a method follows from the method's allocator-registry entry, not its name
(experiments/imagenet_alignment/methods.py), and the analysis's modules depend on each other one way.

Cheap: no model is compiled. A budget is prepared (``budgets.prepare_budget``) with stand-ins for the compiled
programs, which record what they are asked, for allocators registered under new names."""

import dataclasses
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.imagenet_alignment import budgets as budgets_lib
from experiments.imagenet_alignment import config as config_lib
from experiments.imagenet_alignment import draws
from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment import methods as methods_lib
from experiments.imagenet_alignment.settings import AnalysisSettings
from sera_jax import core
from tests.core.test_import_graph import find_cycle, package_imports

PACKAGE = "experiments.imagenet_alignment"
FOLDER = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "imagenet_alignment"
# The analysis's modules, each allowed to import only those before it (the one-way direction; the package's other
# modules, config, estimators and model, sit below them all).
ANALYSIS_LAYERS = ("methods", "gradients", "cosines", "weight_profiles", "allocations", "draws", "programs",
                   "settings", "budgets", "analysis")

# (decides after sampling, samples in rounds, allocates from a pilot, shares uniform's rollouts, closed form online,
#  the method's loss) of every method the analysis can compare, as their registry entries make them.
KINDS = {
    "uniform": (False, False, False, False, False, ("uniform", True)),
    "sera": (False, False, False, False, False, ("sera", True)),
    "sera_pilot": (False, False, False, False, False, ("sera_pilot", True)),
    "sera_no_correction": (False, False, False, False, False, ("sera", False)),
    "sera_all_active": (False, False, False, False, False, ("sera_all_active", True)),
    "sera_sum": (False, False, False, False, False, ("sera_sum", True)),
    "dynamo": (False, False, False, False, False, ("dynamo", False)),
    "knapsack": (False, False, False, False, False, ("knapsack", False)),
    "dapo": (True, False, False, True, True, ("dapo", False)),
    "pods": (True, False, False, True, False, ("pods", False)),
    "reinforce_ada": (True, True, False, False, False, ("reinforce_ada", False)),
    "dars_et": (True, False, True, False, False, ("dars_et", False)),
}


def kind(method):
    M = methods_lib
    return (M.decides_after_sampling(method), M.samples_in_rounds(method), M.allocates_from_pilot(method),
            M.shares_uniform_rollouts(method), M.has_online_closed_form(method), M.method_loss(method))


def test_every_analysable_method_is_run_as_its_registry_entry_says():
    assert set(KINDS) == set(methods_lib.METHODS)
    for method, expected in KINDS.items():
        assert kind(method) == expected, method
    # The online ones are exactly those the registry gives a train mask or rounds.
    for method in config_lib.ANALYSABLE:
        entry = core.get_allocator(method)
        assert methods_lib.decides_after_sampling(method) == (entry.keep_fn is not None or entry.round_fn is not None)


def test_an_allocator_that_reads_no_success_rate_allocates_uniformly():
    """What ``methods.reads_p`` relies on: every registered allocator that allocates before sampling without an
    estimate gives uniform's counts (so the analysis runs none of them in the oracle program)."""
    for name, entry in core.ALLOCATORS.items():
        if entry.needs_estimate or entry.round_fn is not None:
            continue
        for num_prompts, budget in ((4, 8), (5, 23), (16, 64)):
            counts = entry.counts(None, budget, num_prompts=num_prompts, n_min=2, n_max=budget)
            np.testing.assert_array_equal(counts, core.uniform_counts(num_prompts, budget), err_msg=name)


def _renamed(monkeypatch, name, like, correction=None, rule=None):
    """Registers ``like``'s entry under ``name`` (and its loss or train-mask rule where the analysis needs one)."""
    monkeypatch.setitem(core.ALLOCATORS, name, dataclasses.replace(core.get_allocator(like), name=name))
    if correction is not None:
        monkeypatch.setitem(config_lib.ALLOCATOR_CORRECTION, name, correction)
    if rule is not None:
        monkeypatch.setitem(E.ONLINE_RULES, name, rule)


@pytest.fixture
def new_names(monkeypatch):
    """Six allocators under names the analysis has never seen, each a copy of a known one's entry."""
    _renamed(monkeypatch, "my_uniform", "uniform", correction=True)
    _renamed(monkeypatch, "my_counts", "dynamo", correction=False)
    _renamed(monkeypatch, "my_filter", "dapo", rule="mixed")
    _renamed(monkeypatch, "my_subset", "pods", rule="max_variance")
    _renamed(monkeypatch, "my_rounds", "reinforce_ada", rule="balanced")
    _renamed(monkeypatch, "my_pilot", "dars_et", rule="mixed")
    names = ("uniform", "my_uniform", "my_counts", "my_filter", "my_subset", "my_rounds", "my_pilot")
    monkeypatch.setattr(methods_lib, "METHODS", names)
    return names


def test_new_names_are_run_as_the_entries_they_copy(new_names):
    copies = {"my_uniform": "uniform", "my_counts": "dynamo", "my_filter": "dapo", "my_subset": "pods",
              "my_rounds": "reinforce_ada", "my_pilot": "dars_et"}
    for name, like in copies.items():
        assert kind(name)[:5] == kind(like)[:5], name
        assert kind(name)[5] == (name, kind(like)[5][1]), name


def _stand_ins(num_prompts, num_classes, chunk):
    """Stand-ins for ``programs.Compiled``'s functions a budget uses, each recording its calls."""
    calls = {}

    def record(name, result):
        def fn(*args, **kwargs):
            calls.setdefault(name, []).append((args, kwargs))
            return result(*args, **kwargs)
        return fn

    rounds_counts = jnp.asarray([[1, 7, 4, 4], [6, 2, 4, 4]], jnp.int32)
    fns = types.SimpleNamespace(
        chunk=chunk, replicated=jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        allocations=record("allocations", lambda p, s, *, allocators, budget, **k: (
            {a: jnp.asarray([7, 5, 2, 2], jnp.int32) for a in allocators}, None)),
        expected_fixed=record("expected_fixed", lambda probs, labels, counts, corrections, **k: (
            jnp.zeros((counts.shape[0], num_prompts, num_classes)), jnp.ones((counts.shape[0], num_prompts)))),
        online_counts=record("online_counts", lambda *a, methods, **k: {
            **{m: rounds_counts for m in methods if methods_lib.samples_in_rounds(m)},
            **{f"{m}/rounds": jnp.asarray([3, 5]) for m in methods if methods_lib.samples_in_rounds(m)},
            "pilot_successes": jnp.asarray([[0, 2, 1, 2], [2, 2, 0, 1]], jnp.int32)}),
        dapo_expected=record("dapo_expected", lambda *a, **k: (jnp.full((num_prompts, num_classes), 2.0),
                                                                jnp.full((num_prompts,), 3.0))),
    )
    return fns, calls, rounds_counts


def test_a_budget_treats_new_allocators_by_their_registry_entries(new_names):
    """``budgets.prepare_budget`` with allocators it knows only by their entries: the count allocator that reads p
    goes to the oracle program, the one that reads none gets uniform's counts; the train-mask ones run online on
    uniform's counts, the rounds one on each draw's rounds, the pilot one on each draw's pilot (two sampling calls);
    only the mixed-group filter on uniform's counts has a closed form."""
    num_prompts, num_classes, n_bar = 4, 3, 4
    settings = AnalysisSettings(budgets=(n_bar,), estimators=("maxrl",), num_draws=2, draw_chunk=2, microbatch=0,
                                pilot_draws=2, norm_budget=n_bar, norm_examples=num_prompts, n_min=2, n_max_factor=4,
                                n_max_table=16, n0=2, allocators=new_names, keep_per_prompt=2, round_size=2)
    fns, calls, rounds_counts = _stand_ins(num_prompts, num_classes, settings.draw_chunk)
    probs = jax.nn.softmax(jnp.asarray(np.random.default_rng(0).normal(size=(num_prompts, num_classes)), jnp.float32))
    labels = jnp.asarray([0, 1, 2, 0])
    p = E.success_probabilities(probs, labels)
    b = budgets_lib.prepare_budget(settings, fns, "maxrl", n_bar, jax.random.key(0), probs, labels, p)

    assert b.methods == ("uniform", "my_uniform", "my_counts")
    assert b.online == ("my_filter", "my_subset", "my_rounds", "my_pilot")
    ((_, allocations_kwargs),) = calls["allocations"]
    assert allocations_kwargs["allocators"] == ("my_counts",)
    uniform = np.full(num_prompts, n_bar)
    np.testing.assert_array_equal(b.counts["my_uniform"], uniform)
    np.testing.assert_array_equal(b.counts["my_counts"], [7, 5, 2, 2])
    np.testing.assert_array_equal(b.draw_corrections, [True, True, False])
    ((_, online_kwargs),) = calls["online_counts"]
    assert online_kwargs["methods"] == ("my_rounds", "my_pilot")
    pilot = E.dars_draw_counts(jnp.asarray([[0, 2, 1, 2], [2, 2, 0, 1]]), 2, num_prompts * n_bar, n_max=4 * n_bar)
    assert not np.array_equal(np.asarray(pilot[0]), uniform)
    for a, expected in enumerate((uniform[None], uniform[None], rounds_counts, pilot)):
        np.testing.assert_array_equal(np.asarray(b.online_counts[:, a]),
                                      np.broadcast_to(expected, (2, num_prompts)), err_msg=b.online[a])
    np.testing.assert_array_equal(b.sampling_rounds["my_rounds"], [3, 5])
    np.testing.assert_array_equal(b.sampling_rounds["my_pilot"], [2.0, 2.0])  # a pilot, then the rest
    for m in ("my_filter", "my_subset"):
        np.testing.assert_array_equal(b.sampling_rounds[m], [1.0, 1.0])
    assert len(calls["dapo_expected"]) == 1
    assert {"my_filter"} == set(b.rows) & set(b.online) == set(b.s_eff) & set(b.online)
    assert {"my_rounds", "my_pilot"} <= set(b.counts) and not {"my_filter", "my_subset"} & set(b.counts)


def test_online_programs_follow_the_entries(new_names, monkeypatch):
    """The online programs, traced: a rounds method's counts and rounds, one shared pilot for a pilot method
    (``draws.online_counts``); a copy of PODS's entry weighs its kept rollouts as PODS does (advantages from the
    kept ones, ``Allocator.advantages_from_kept``), and flipping that attribute changes the estimate."""
    num_prompts, num_classes, keys = 4, 3, jax.random.split(jax.random.key(1), 2)
    probs = jax.nn.softmax(jnp.asarray(np.random.default_rng(2).normal(size=(num_prompts, num_classes)), jnp.float32))
    labels = jnp.asarray([0, 1, 2, 0])
    shapes = jax.eval_shape(lambda k: draws.online_counts(k, probs, labels, 16, length=16, n0=2, round_size=2, keep=2,
                                                          methods=("my_rounds", "my_pilot")), keys)
    assert set(shapes) == {"my_rounds", "my_rounds/rounds", "pilot_successes"}
    assert shapes["my_rounds"].shape == shapes["pilot_successes"].shape == (2, num_prompts)

    counts = jnp.full((num_prompts,), 6, jnp.int32)

    def cotangent(method):
        return np.asarray(E.online_cotangent(method, keys[0], probs, labels, counts, 24, estimator="maxrl", keep=4,
                                             length=24)[0])

    np.testing.assert_array_equal(cotangent("my_subset"), cotangent("pods"))
    monkeypatch.setitem(core.ALLOCATORS, "my_subset",
                        dataclasses.replace(core.ALLOCATORS["my_subset"], advantages_from_kept=False))
    assert not np.allclose(cotangent("my_subset"), cotangent("pods"))


def test_the_analysis_modules_depend_one_way():
    graph = {p.stem: package_imports(p, FOLDER, PACKAGE) - {"__init__"} for p in sorted(FOLDER.glob("*.py"))}
    assert find_cycle({m: graph[m] & set(ANALYSIS_LAYERS) for m in ANALYSIS_LAYERS}) == []
    for i, module in enumerate(ANALYSIS_LAYERS):
        assert graph[module] & set(ANALYSIS_LAYERS) <= set(ANALYSIS_LAYERS[:i]), (module, graph[module])
    for module in ("config", "estimators", "model"):
        assert not graph[module] & set(ANALYSIS_LAYERS), (module, graph[module])
    # analysis.py is the entry: the experiment imports it, no module of the analysis does.
    assert {m for m, imported in graph.items() if "analysis" in imported} == {"experiment"}
