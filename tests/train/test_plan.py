"""The memory planner's library (sera_jax.train.plan): sizes, lowering, custom calls and a plan of calls handed in.

Its command line over the experiments' configs (python -m experiments.plan) is tested in
tests/experiments/test_plan.py."""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.train import plan

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_parse_bytes_reads_binary_and_decimal_units():
    assert plan.parse_bytes("141GiB") == 141 * 2**30 and plan.parse_bytes("80GB") == 80 * 10**9
    assert plan.parse_bytes("1.5 MiB") == 3 * 2**19 and plan.parse_bytes("512") == 512
    with pytest.raises(ValueError, match="--device_memory='lots'"):
        plan.parse_bytes("lots")


def test_the_device_count_flag_is_replaced_and_the_others_kept():
    flags = "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x"
    assert plan.with_host_device_count(flags, 2) == ("--xla_backend_optimization_level=0 --xla_dump_to=/tmp/x "
                                                     "--xla_force_host_platform_device_count=2")
    assert plan.with_host_device_count("", 4) == "--xla_force_host_platform_device_count=4"


def test_the_planner_imports_no_experiment():
    """The dependency runs from experiments to sera_jax: importing the planner's library imports no experiment
    (its command line, experiments/plan.py, looks the experiment up)."""
    check = "import sys, sera_jax.train.plan; print(sorted(m for m in sys.modules if m.startswith('experiments')))"
    out = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_a_memory_plan_compiles_the_calls_it_is_handed(capsys):
    """``calls_for`` is asked for the calls over JAX's devices (None); a peak over the device's memory exits 1."""
    x = jax.ShapeDtypeStruct((1024,), jnp.float32)
    asked = []

    def calls_for(devices):
        asked.append(devices)
        return [plan.PlannedCall("sine", jax.jit(jnp.sin), (x,), note="4 KiB in and out")]

    assert plan.plan_memory(calls_for, "toy", 1, 2**20) == 0 and asked == [None]
    out = capsys.readouterr().out
    assert "toy on 1 device(s) of 1.00 MiB" in out and "4 KiB in and out" in out and "(fits)" in out
    assert plan.plan_memory(calls_for, "toy", 1, 1024) == 1  # 4 KiB argument + 4 KiB output
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_a_program_that_cannot_be_lowered_is_named_and_the_others_still_lowered():
    x = jax.ShapeDtypeStruct((2,), jnp.float32)
    host = jax.jit(lambda a: jax.pure_callback(np.asarray, x, a))  # a CPU host callback: not for a TPU
    rows = [plan.lower(plan.PlannedCall("host step", host, (x,)), "tpu"),
            plan.lower(plan.PlannedCall("sine", jax.jit(jnp.sin), (x,)), "tpu")]
    text = plan.format_lowering(rows, "tpu")
    assert rows[0].custom_calls is None and "FAILED host step" in text and "ValueError" in text
    assert rows[1].custom_calls == {} and "OK     sine" in text
    assert text.splitlines()[-1] == "lowered for tpu: 1 of 2 programs; failed: host step"


def test_custom_call_targets_are_counted():
    text = ('%0 = stablehlo.custom_call @tpu_custom_call(%a) : x\n%1 = stablehlo.custom_call @Sharding(%0)\n'
            '%2 = stablehlo.custom_call @tpu_custom_call(%1)')
    assert plan.custom_call_targets(text) == {"Sharding": 1, "tpu_custom_call": 2}


def test_custom_call_targets_keep_dollar_and_quoted_names():
    """cuDNN's attention targets hold '$' (once cut there: '__cudnn' alone); MLIR quotes a symbol it cannot
    write bare."""
    text = ('%0 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%a) : x\n'
            '%1 = stablehlo.custom_call @__cudnn$fmhaSoftmaxBackward(%b) : x\n'
            '%2 = stablehlo.custom_call @"odd target/1"(%c) : x\n')
    assert plan.custom_call_targets(text) == {"__cudnn$fmhaSoftmax": 1, "__cudnn$fmhaSoftmaxBackward": 1,
                                              "odd target/1": 1}
