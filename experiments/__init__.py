"""The paper's experiments, by name: one registry, as ``sera_jax.core.ALLOCATORS`` is for the allocators.

``EXPERIMENTS`` maps each experiment's name (its folder, ``experiments/NAME/``) to the module that holds its
``run(config, workdir)`` and ``planned_calls(config, devices)``; ``experiment_module(name)`` imports that module. Tools that
take a config file (the memory planner, ``python -m experiments.plan --config=experiments/NAME/config.py:...``)
look the experiment up here rather than probing for a module path. Importing this package imports no experiment:
the modules are named as strings and imported on demand (``sera_jax`` never imports ``experiments``; the
dependency runs the other way). A new experiment adds its line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: dict[str, str] = {
    "imagenet_alignment": "experiments.imagenet_alignment.experiment",
    "math_reasoning": "experiments.math_reasoning.experiment",
    "maze": "experiments.maze.experiment",
}


def experiment_module(name: str) -> ModuleType:
    """The module of the registered experiment ``name`` (imported now); ValueError naming the known ones."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known experiments: {sorted(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])
