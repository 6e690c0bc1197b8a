"""Timing helpers shared by the benchmarks (wall clock, after compilation, JAX's async dispatch waited for)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np


def median_ms(fn: Callable, *args, repeats: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``fn(*args)`` in milliseconds, after ``warmup`` untimed calls (compilation).

    Outputs are passed through ``jax.block_until_ready`` so that JAX's asynchronous dispatch is not
    mistaken for speed; NumPy outputs pass through unchanged.
    """
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def target_line(name: str, value: str, met: bool | None) -> str:
    """One line of a benchmark's target summary; ``met=None`` when the target was not measured."""
    verdict = "not measured" if met is None else ("met" if met else "NOT met")
    return f"  {name:<48} {value:>14}  {verdict}"


def report_failures(failures: list[str]) -> int:
    """Prints the correctness failures loudly (a fast wrong answer is no result); the exit status to return."""
    if not failures:
        return 0
    print("\n" + "!" * 80 + "\nCORRECTNESS CHECK FAILED\n" + "\n".join(failures) + "\n" + "!" * 80, file=sys.stderr)
    return 1


def torch_and_transformers(threads: int):
    """``(torch, transformers)`` set up for a side-by-side CPU run (offline, no progress bars, ``threads`` torch
    threads unless 0), or None after saying that the 'parity' extra is missing."""
    try:
        import torch
        import transformers
    except ImportError:
        print("needs the 'parity' extra: .venv/bin/pip install -e .[parity]")
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.utils.logging.disable_progress_bar()
    if threads > 0:
        torch.set_num_threads(threads)
    return torch, transformers
