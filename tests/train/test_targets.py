"""Compiling the planned calls for GPUs and TPUs without them (sera_jax.train.targets, experiments.plan
--target/--topology).

The compile tests need the ``targets`` extra (the CUDA plugin, ptxas, libtpu) and fail, not skip, without it:
CI installs it (scripts/test.sh), and a plan that silently stopped compiling for a target is what they guard.
"""

import functools
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from experiments import plan as plan_cli
from sera_jax.train import targets

REPO = pathlib.Path(__file__).resolve().parents[2]
MAZE = "experiments/maze/config.py:tiny"


def _plan(*args, config=MAZE):
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_WORKER_HOSTNAMES="localhost")
    return subprocess.run([sys.executable, "-m", "experiments.plan", f"--config={config}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=env)


@functools.lru_cache(maxsize=None)
def _plan_once(config: str, flags: tuple[str, ...], calls: tuple[str, ...]):
    return _plan(*flags, "--only", *calls, config=config)


def _rows(stdout: str) -> dict[str, list[str]]:
    """The target table's rows by call name: [peak, peak unit, FLOPs, bytes, ...]."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"(pilot sampling|rollout sampling|evaluation sampling|update|sft step|ce step|rl step|"
                     r"validation|analysis forward|analysis draw chunk)\s+(.*)", line)
        if m:
            rows[m.group(1)] = m.group(2).split()
    return rows


def _positive(field: str) -> float:
    return float(field.rstrip("*"))


def test_the_plugins_are_installed():
    """The ``targets`` extra is part of the test environment: without it the compile tests below could not run."""
    for module in ("jax_cuda12_plugin", "nvidia.cuda_nvcc", "libtpu"):
        assert importlib.util.find_spec(module) is not None, f"{module} missing: pip install -e '.[targets]'"


GPU, TPU = ("--platform=cuda", "--target=h200"), ("--platform=tpu", "--topology=v5e:2x2")
MATH, IMAGES = "experiments/math_reasoning/config.py:tiny", "experiments/imagenet_alignment/config.py:tiny"


@pytest.mark.parametrize("config, flags, compiler, calls", [
    # Every experiment's tiny config, for one H200 (XLA:GPU) and over 4 v5e chips (XLA:TPU, the config's mesh laid
    # over the topology). The decoders' sampling calls share the decoding loop's program shape, so a decoding loop
    # and a gradient step each keep these near 10 s on 2 cores; the command line compiles every call.
    (MAZE, GPU, "XLA:GPU H200", ("rollout sampling", "update")),
    (MAZE, TPU, "XLA:TPU v5e", ("rollout sampling", "update")),
    (MATH, GPU, "XLA:GPU H200", ("rollout sampling", "update")),
    (MATH, TPU, "XLA:TPU v5e", ("rollout sampling", "update")),
    (IMAGES, GPU, "XLA:GPU H200", ("rl step", "analysis draw chunk")),
    (IMAGES, TPU, "XLA:TPU v5e", ("rl step", "analysis draw chunk")),
])
def test_every_tiny_config_compiles_for_the_target_with_its_compiler(config, flags, compiler, calls):
    out = _plan_once(config, flags, calls)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert f"compiler: {compiler};" in out.stdout and f"(fits) [{compiler}]" in out.stdout
    rows = _rows(out.stdout)
    assert set(rows) == set(calls), out.stdout
    for name, fields in rows.items():
        peak, flops, bytes_accessed = float(fields[0]), _positive(fields[2]), _positive(fields[3])
        assert peak > 0 and flops > 0 and bytes_accessed > 0, (name, fields)


def test_the_decoders_flops_count_every_decoding_step():
    """XLA's cost analysis counts the sampler's decoding loop once; the plan's FLOPs are the model's count of
    every step (sera_jax.models.flops), so they are not marked as a lower bound and exceed one step's."""
    out = _plan_once(MAZE, GPU, ("rollout sampling", "update"))  # the compile test's plan, made once
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    fields = _rows(out.stdout)["rollout sampling"]
    assert not fields[2].endswith("*"), out.stdout
    rows, prompts, prompt_len, new_tokens = map(int, re.search(
        r"(\d+) of \d+ rows per call; (\d+) x (\d+) prompt .* x (\d+) tokens", " ".join(fields)).groups())
    import experiments.maze.config as maze_config
    from experiments.maze.experiment import build_model
    from sera_jax.models import flops

    cfg = build_model(maze_config.get_config("tiny"), 0).cfg
    counted = flops.sampling_flops(cfg, prompts, prompt_len, rows, new_tokens)
    assert float(fields[2]) == pytest.approx(counted, rel=5e-3)  # the table's three digits
    assert counted > 2 * flops.block_params(cfg) * rows * new_tokens  # every step, not the loop body once


def test_cudnn_attention_compiles_for_an_h200_forward_and_backward():
    """The decoder's attention at bf16, resolved for CUDA, is cuDNN's fused kernel, which XLA:GPU builds at compile
    time (the targets extra's cuDNN): without it the maze and math GPU configs' updates do not compile."""
    import jax
    import jax.numpy as jnp

    from sera_jax.models import attention

    devices = targets.target_devices("cuda", "h200", 1)
    placed = jax.sharding.SingleDeviceSharding(devices[0])
    q = jax.ShapeDtypeStruct((2, 64, 4, 64), jnp.bfloat16, sharding=placed)
    kv = jax.ShapeDtypeStruct((2, 2, 64, 64), jnp.bfloat16, sharding=placed)
    span = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=placed)

    def loss(q, k, v, start, end):
        return attention.attention(q, k, v, start, end).astype(jnp.float32).sum()

    with attention.lowering_for("cuda"):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, span, span).compile()
    text = compiled.as_text()
    assert "__cudnn$fmhaSoftmax" in text and "__cudnn$fmhaSoftmaxBackward" in text, text[:2000]


def test_a_call_over_the_targets_memory_fails(monkeypatch):
    """A peak over the chip's HBM exits 1 (in-process: the CPU fallback over conftest's 8 devices, the H200's
    memory shrunk to 1 KiB)."""
    def missing(platform):
        raise targets.MissingPluginError(f"platform={platform}: jax-cuda12-plugin is not installed")

    monkeypatch.setattr(targets, "require_plugin", missing)
    monkeypatch.setitem(targets.TARGETS, "h200", targets.TARGETS["h200"].__class__(
        **{**targets.TARGETS["h200"].__dict__, "hbm_bytes": 1024}))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = plan_cli.main([f"--config={MAZE}", "--platform=cuda", "--target=h200", "--devices=8",
                              "--only", "update"])
    assert code == 1, out.getvalue()
    assert "[XLA:CPU (no plugin)]" in out.getvalue() and "DOES NOT FIT" in out.getvalue()


def test_the_roofline_is_the_slower_of_compute_and_memory():
    chip = targets.Target("toy", "tpu", "toy", peak_flops=100.0, hbm_bytes=10, hbm_bandwidth=10.0)
    # Compute-bound: 1000 FLOPs take 10 s, 50 bytes 5 s -> 10 s at full utilisation.
    assert targets.roofline_seconds(1000, 50, chip) == 10.0 and targets.mfu_bound(1000, 50, chip) == 1.0
    # Memory-bound: 200 bytes take 20 s, 1000 FLOPs would take 10 -> 20 s, MFU 1000 / (20 * 100) = 0.5.
    assert targets.roofline_seconds(1000, 200, chip) == 20.0 and targets.mfu_bound(1000, 200, chip) == 0.5
    assert targets.mfu_bound(0, 0, chip) == 0.0
    # Two devices of one chip (a v4 chip's TensorCores) share its peak, memory and bandwidth.
    half = targets.per_device(chip, 2)
    assert (half.peak_flops, half.hbm_bytes, half.hbm_bandwidth) == (50.0, 5, 5.0)


GPU_TARGETS = [t.name for t in targets.TARGETS.values() if t.platform == "cuda"]


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_each_gpus_figures_match_its_shipped_target_config(name):
    """Memory and bandwidth are the target config's own (the figures XLA:GPU plans with), and the table's dense bf16
    peak is within 2% of the config's tensor-core rate: 2 FLOPs x clock x units x ops per clock x cores."""
    target = targets.get_target(name, "cuda")
    text = (pathlib.Path(targets.__file__).parent / "target_configs" / target.target_config).read_text()
    assert f"device_memory_size: {target.hbm_bytes}" in text
    bandwidth = int(re.search(r"memory_bandwidth: (\d+)", text).group(1))
    assert target.hbm_bandwidth == pytest.approx(bandwidth, rel=2e-3)
    cores = int(re.search(r"core_count: (\d+)", text).group(1))
    matrix = text[text.index("matrix_unit_description"):]
    clock, units, ops = re.search(r"key: 16 value \{ clock_rate_ghz: ([\d.]+) units_per_core: (\d+) "
                                  r"ops_per_clock: (\d+)", matrix).groups()  # key 16: BF16
    assert target.peak_flops == pytest.approx(2 * float(clock) * 1e9 * int(units) * int(ops) * cores, rel=0.02)


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_each_gpu_target_compiles_a_program_with_xla_gpu(name):
    """Each shipped GpuTargetConfigProto parses in the bundled XLA and compiles a bf16 matmul for its chip."""
    import jax
    import jax.numpy as jnp

    device, = targets.target_devices("cuda", name, 1)
    assert targets.get_target(name).label in device.device_kind
    operand = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(device))
    compiled = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(operand, operand).compile()
    assert compiled.memory_analysis().output_size_in_bytes == 512 * 512 * 2


def test_bad_targets_and_topologies_are_named():
    with pytest.raises(ValueError, match="target='a100'"):
        targets.get_target("a100")
    with pytest.raises(ValueError, match="target='v5p': not a known cuda target"):
        targets.target_devices("cuda", "v5p")
    bare = targets.Target("bare", "cuda", "Bare", 1e15, 2**30, 1e12)  # a GPU in the table without a config
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(targets.TARGETS, "bare", bare)
        with pytest.raises(ValueError, match="target='bare': no GpuTargetConfigProto"):
            targets.target_devices("cuda", "bare")
    with pytest.raises(ValueError, match="topology='v9z:2x2'"):
        targets.parse_topology("v9z:2x2")
    with pytest.raises(ValueError, match="topology='v5p'"):
        targets.parse_topology("v5p")
    with pytest.raises(ValueError, match="num_devices=12"):
        targets.gpu_topology(12)
    assert targets.topology_chips("v5p:2x2x2") == 8 and targets.gpu_topology(16) == "1x2x8"


def test_a_missing_plugin_is_named(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(targets.MissingPluginError, match="jax-cuda12-plugin is not installed"):
        targets.require_plugin("cuda")
    with pytest.raises(targets.MissingPluginError, match=r"libtpu \(jax\[tpu\]\) is not installed"):
        targets.require_plugin("tpu")


def test_target_flags_are_checked_against_the_platform():
    bad = _plan("--platform=tpu", "--target=h200")
    assert bad.returncode == 2 and "--target=h200" in bad.stderr
    bad = _plan("--platform=cuda", "--target=b300")
    assert bad.returncode == 2 and "target='b300'" in bad.stderr
