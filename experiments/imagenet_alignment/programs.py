"""The analysis's jitted programs for one (model, mesh, analysis shape), with explicit shardings: ``compiled``
builds them once per process (``Compiled``); the analysis (``analysis.py``, ``budgets.py``), the p-estimate
study (``p_estimates.py``) and the planner (``experiment.planned_calls``) call them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.allocations import allocations, expected_fixed
from experiments.imagenet_alignment.draws import draw_cotangents, online_counts, online_draw_cotangents, pilot_draws
from experiments.imagenet_alignment.gradients import chunk_gradients, forward_stats, per_example_grad_norms
from experiments.imagenet_alignment.model import FAST_COMPILE
from sera_jax.train import sharding as sh


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The jitted functions of one (model, mesh, analysis shape); built once per process by ``compiled``."""

    forward: Any
    chunk_grads: Any
    norms: Any
    expected_fixed: Any
    pilot_draws: Any
    allocations: Any
    pilot_expected: Any
    draws: Any
    online_counts: Any
    online_draws: Any
    dapo_expected: Any
    project: Any  # E.projected_scales: each draw's per-prompt weight estimates (the weight profiles)
    chunk: int
    rows: NamedSharding  # (P, ...) arrays: split over the data axes
    chunk_rows: NamedSharding  # (M, P, ...) arrays (a chunk of M cotangents): split along P
    replicated: NamedSharding
    norms_rows: NamedSharding  # inputs of the per-example route


class WaitsForItsOutputs:
    """A jitted program whose call returns once its outputs are computed (``lower`` and the rest pass through).

    Why: XLA:CPU admits at most 32 programs in flight per device and takes a slot before a program's inputs are
    ready, from a thread pool that can start one device's part of a collective program after later programs on
    that device. When the analysis follows a collective program with many small eager operations on its outputs
    (``prepare_budget`` indexing one row per method), those can fill a device's slots while waiting for the
    program whose last part then never gets a slot: the other devices wait in its all-gather until XLA aborts
    the process (seen under load on 2 cores with 8 forced devices; ``tests/experiments/
    test_imagenet_alignment.py``). Waiting for each program's outputs keeps every later operation's inputs
    ready; the programs run for far longer than the host takes to launch the next one."""

    def __init__(self, jitted):
        self.jitted = jitted

    def __call__(self, *args, **kwargs):
        return jax.block_until_ready(self.jitted(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self.jitted, name)


@functools.lru_cache(maxsize=8)
def compiled(graphdef, mesh: Mesh, data_axes: tuple[str, ...], chunk: int, microbatches: int,
             fast_compile: bool = False) -> Compiled:
    """Jitted analysis functions with explicit shardings: images and cotangents split over the data axes
    along P, parameters replicated. Cached, so repeated runs in one process (tests) compile once."""
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = sh.batch_sharding(mesh, data_axes)
    chunk_rows = NamedSharding(mesh, PartitionSpec(None, rows.spec[0]))
    # On CPU, LLVM's optimisation of the many small kernels of the sampling programs costs far more compile
    # time than it saves at run time; ``fast_compile`` extends this to the model programs (tests, notebooks).
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    model_options = FAST_COMPILE if (fast_compile and on_cpu) else None
    small_options = FAST_COMPILE if on_cpu else None
    forward = jax.jit(functools.partial(forward_stats, graphdef, microbatches=microbatches, chunk=chunk),
                      in_shardings=(replicated, replicated, rows, rows),
                      out_shardings=(rows, rows, rows, chunk_rows), compiler_options=model_options)
    chunk_grads = jax.jit(functools.partial(chunk_gradients, graphdef, microbatches=microbatches),
                          in_shardings=(replicated, replicated, rows, chunk_rows, replicated),
                          out_shardings=replicated, compiler_options=model_options)
    # XLA:CPU with several (forced host) devices returns wrong per-example convolution weight gradients
    # when the vmapped examples are split across devices (also under shard_map; cf. jax-ml/jax#36886), while
    # the unsplit program is right: on CPU the per-example route runs replicated (it only feeds the figure).
    example_rows = replicated if (on_cpu and mesh.devices.size > 1) else rows
    norms = jax.jit(functools.partial(per_example_grad_norms, graphdef),
                    in_shardings=(replicated, replicated, example_rows, example_rows), out_shardings=example_rows,
                    compiler_options=model_options)

    def small(fn, static, options=small_options):
        # Replicated outputs: their consumers then always see the same input shardings (one compilation).
        return jax.jit(fn, static_argnames=static, compiler_options=options, out_shardings=replicated)

    # The online methods' programs compile once for every budget and then run sorts and rounds over the whole
    # layout: optimised they run 3-5x faster on CPU for ~20% more compile time, so they are only built with
    # LLVM's optimisations off with ``fast_compile`` (tests, notebooks).
    online_options = model_options

    programs = dict(
        forward=forward, chunk_grads=chunk_grads, norms=norms,
        expected_fixed=small(expected_fixed, ("estimator", "max_n")),
        pilot_draws=small(pilot_draws, ("n0", "num_outcomes")),
        allocations=small(functools.partial(allocations, replicated=replicated),
                          ("n0", "budget", "n_min", "n_max", "estimator", "allocators")),
        pilot_expected=small(E.pilot_expected_from_outcomes, ("n0", "estimator", "max_extra", "num_groups")),
        draws=jax.jit(draw_cotangents, static_argnames=("estimator", "length", "methods"),
                      out_shardings=chunk_rows, compiler_options=small_options),
        online_counts=small(functools.partial(online_counts, replicated=replicated),
                            ("length", "n0", "round_size", "keep", "methods"), online_options),
        online_draws=jax.jit(online_draw_cotangents, static_argnames=("estimator", "length", "methods", "keep"),
                             out_shardings=(chunk_rows, replicated), compiler_options=online_options),
        dapo_expected=small(E.dapo_expected_cotangent, ("estimator", "max_n", "dyadic_pieces")),
        project=small(E.projected_scales, ()))
    if on_cpu and mesh.devices.size > 1:  # forced host devices share one process's thread pool
        programs = {name: WaitsForItsOutputs(program) for name, program in programs.items()}
    return Compiled(**programs, chunk=chunk, rows=rows, chunk_rows=chunk_rows, replicated=replicated,
                    norms_rows=example_rows)
