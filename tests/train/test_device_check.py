"""scripts/device_check.py: its dry run (every part on CPU, maze tiny) writes strict JSON in which every part is ok,
every key is present, every number finite and every ratio computed, and nothing was skipped without saying so; a
failing part and a part cut by its budget are reported, the other parts kept; the update's FLOP count against an
enumeration of the attention pairs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "scripts" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def strict_json(path: pathlib.Path) -> dict:
    """The file as JSON, refusing NaN and Infinity (which Python's json would otherwise write and read)."""
    def refuse(name):
        raise ValueError(f"{path}: non-finite number {name} in the JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module")
def dc():
    return load_script()


@pytest.fixture(scope="module")
def dry_run(dc, tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check") / "device_check.json"
    code = dc.main(["--dry_run", f"--out={out}"])
    return code, strict_json(out)


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def numbers(tree, path=""):
    """(path, value) of every number in a JSON tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path, tree


def test_every_part_ran_ok(dc, dry_run):
    code, report = dry_run
    assert code == 0, dc.summary(report)
    assert report["schema"] == dc.SCHEMA and report["dry_run"] is True and report["status"] == "ok"
    assert set(report["parts"]) == set(dc.PARTS)
    for name, part in report["parts"].items():
        assert part["status"] == "ok" and part["error"] is None and part["skipped_work"] == [], (name, part)
        assert finite(part["wall_seconds"]) and part["wall_seconds"] > 0 and finite(part["budget_seconds"])
        assert part["result"], name
    assert all(finite(v) for _, v in numbers(report)), "jsonable must leave only finite numbers"


def test_environment_records_versions_device_and_code(dry_run):
    env = dry_run[1]["parts"]["environment"]["result"]
    for key in ("python", "packages", "backend", "device_kind", "platform_version", "cuda_versions", "nvidia_smi",
                "jax_env", "jax_in_project_range", "git_commit", "source_sha256", "setup"):
        assert key in env, key
    assert env["packages"]["jax"] and env["packages"]["jaxlib"] and env["backend"] == "cpu"
    assert len(env["source_sha256"]) == 64


def test_rl_steps_ran_every_step_and_timed_every_call(dc, dry_run):
    report = dry_run[1]
    rl = report["parts"]["rl_steps"]["result"]
    steps = report["steps_requested"]
    assert steps >= 2 and rl["steps_done"] == steps and [s["step"] for s in rl["steps"]] == list(range(steps))
    assert set(rl["calls"]) == set(dc.STEP_CALLS)  # maze tiny's sera: a pilot, the rollouts, the update
    for name, call in rl["calls"].items():
        assert call["calls"] == steps and call["timed_calls"] == steps - 1 and not call["includes_compilation"], name
        assert finite(call["seconds_median"]) and call["seconds_median"] > 0
        assert call["peak_bytes_so_far_after_first_call"] > 0
    assert rl["calls"]["rollout sampling"]["tokens_per_second"] > 0
    for s in rl["steps"]:
        assert finite(s["wall_seconds"]) and finite(s["step_seconds"]) and s["tokens_sampled"] > 0
    assert finite(rl["step_seconds_median"]) and rl["peak_bytes"] > 0
    assert rl["memory_source"].startswith("live_arrays")  # CPU keeps no allocator statistics: said so


def test_plan_planned_every_call_of_a_step(dc, dry_run):
    plan = dry_run[1]["parts"]["plan"]["result"]
    assert set(plan["calls"]) == set(dc.STEP_CALLS)
    assert "evaluation sampling" in plan["not_planned"]  # listed with its reason, not dropped
    for name, call in plan["calls"].items():
        for key in ("peak_bytes", "flops", "bytes_accessed", "roofline_seconds", "mfu_bound", "compile_seconds"):
            assert finite(call[key]) and call[key] > 0, (name, key)
    assert plan["target"]["name"] == "h200"


def test_throughput_timed_every_repeat(dry_run):
    report = dry_run[1]
    tp = report["parts"]["throughput"]["result"]
    repeats = report["repeats_requested"]
    assert tp["sampler"]["repeats"] == repeats and tp["update"]["repeats"] == repeats
    for key in ("tokens_per_second", "rollouts_per_second", "slot_steps_per_second", "seconds_median"):
        assert finite(tp["sampler"][key]) and tp["sampler"][key] > 0, key
    for key in ("model_flops", "mfu", "seconds_median", "fraction_of_measured_matmul"):
        assert finite(tp["update"][key]) and tp["update"][key] > 0, key
    assert finite(tp["matmul"]["flops_per_second"])


def test_every_kernel_check_ran_or_says_why_not(dc, dry_run):
    kernels = dry_run[1]["parts"]["kernels"]["result"]
    checks = {c["name"]: c for c in kernels["checks"]}
    not_applicable = {n for n, c in checks.items() if c.get("not_applicable")}
    assert not_applicable == {"attention.cudnn (prompt, float32)", "attention.pallas_tpu"}
    assert all(checks[n]["reason"] for n in not_applicable)
    ran = {n for n in checks if n not in not_applicable}
    assert ran == {"attention.cudnn (prompt, bfloat16)", "attention.blockwise (prompt, bfloat16)",
                   "attention.blockwise (prompt, float32)", "decode_attention.batched (bfloat16)",
                   "decode_attention.batched (float32)"}
    assert checks["attention.cudnn (prompt, bfloat16)"]["stand_in"] is True  # no cuDNN on CPU: said so
    for name in ran:
        c = checks[name]
        parts = ("forward", "dq", "dk", "dv") if c["kind"] == "full" else ("forward",)
        for p in parts:
            assert c[p]["pass"] and finite(c[p]["max_abs_err"]) and finite(c[p]["max_rel_err"]), (name, p)
            assert c[p]["tolerance"] == dc.TOLERANCES[c["dtype"]]
        assert c["pass"]
    assert kernels["all_pass"] and kernels["auto_resolves_to"] == {"bfloat16": "blockwise", "float32": "blockwise"}


def test_comparison_has_every_ratio(dry_run):
    c = dry_run[1]["comparison"]
    assert c["missing"] == []
    assert finite(c["memory"]["measured_over_planned"]) and c["memory"]["measured_over_planned"] > 0
    for name, call in c["calls"].items():
        for key in ("measured_over_roofline", "measured_peak_so_far_over_planned"):
            assert finite(call[key]) and call[key] > 0, (name, key)
    assert finite(c["step"]["measured_over_roofline"])
    mfu = c["update_mfu"]
    for key in ("mfu_model_flops", "mfu_xla_flops", "planned_mfu_bound", "xla_over_model_flops"):
        assert finite(mfu[key]) and mfu[key] > 0, key
    # The tiny update has no loop, so XLA counts every FLOP: at least the model's matmuls and attention pairs, plus
    # the elementwise work (norms, softmax, AdamW) that update_model_flops leaves out.
    assert mfu["xla_flops_is_lower_bound"] is False and 1.0 <= mfu["xla_over_model_flops"] <= 2.5
    assert finite(c["sampler"]["tokens_per_second"])


def test_a_failing_part_is_reported_and_the_others_kept(dc, tmp_path):
    out = tmp_path / "dc.json"
    code = dc.main(["--dry_run", f"--out={out}", "--parts=environment,throughput"])
    report = strict_json(out)
    assert code == 1 and report["status"] == "failed"
    parts = report["parts"]
    assert parts["environment"]["status"] == "ok" and parts["environment"]["result"]["device_kind"]
    assert parts["throughput"]["status"] == "failed"  # it re-times rl_steps' calls, and rl_steps did not run
    assert parts["throughput"]["error"]["type"] == "RuntimeError" and parts["throughput"]["error"]["traceback"]
    for name in ("rl_steps", "plan", "kernels"):
        assert parts[name]["status"] == "skipped" and parts[name]["skipped_work"], name
    assert "rl_steps" in report["comparison"]["missing"]


def test_work_cut_by_the_budget_is_listed(dc, tmp_path):
    out = tmp_path / "dc.json"
    code = dc.main(["--dry_run", f"--out={out}", "--parts=kernels", "--part_budget=kernels=0.01"])
    kernels = strict_json(out)["parts"]["kernels"]
    assert code == 3 and kernels["status"] == "partial"
    ran = [c for c in kernels["result"]["checks"] if not c.get("not_applicable")]
    assert len(ran) == 1 and len(kernels["skipped_work"]) == 4  # the first check runs, the other four are listed


def test_update_model_flops_counts_the_attention_pairs(dc):
    """Against an enumeration: prompt token i sees keys 0..i; response token j (of the R - 1 fed) sees the T prompt
    keys and responses 0..j; joined sequences of T + R - 1 tokens are causal throughout."""
    @dataclasses.dataclass
    class Cfg:
        vocab_size: int = 7
        d_model: int = 4
        n_layers: int = 2
        n_heads: int = 2
        n_kv_heads: int = 1
        head_dim: int = 3
        ffn_dim: int = 5

    cfg, p, t, b, r = Cfg(), 2, 5, 6, 4
    from sera_jax.models.flops import block_params

    matmul = 2 * block_params(cfg)
    assert block_params(cfg) == 2 * (4 * (2 + 2) * 3 + 2 * 3 * 4 + 3 * 4 * 5)
    per_pair, head = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim, 2 * cfg.d_model * cfg.vocab_size * b * r
    pairs = p * sum(i + 1 for i in range(t)) + b * sum(t + j + 1 for j in range(r - 1))
    shared = matmul * (p * t + b * (r - 1)) + head + per_pair * pairs
    assert dc.update_model_flops(cfg, p, t, b, r, share_prompts=True) == 3 * shared
    length = t + r - 1
    joined = matmul * b * length + head + per_pair * b * sum(i + 1 for i in range(length))
    assert dc.update_model_flops(cfg, p, t, b, r, share_prompts=False) == 3 * joined


def test_error_stats_is_normwise_and_fails_on_nan(dc):
    import numpy as np

    ref = np.array([[2.0, -4.0], [1.0, 0.0]])
    got = ref + np.array([[0.0, 0.1], [0.0, -0.2]])
    s = dc.error_stats(got, ref, tolerance=0.05)
    assert s["max_abs_err"] == pytest.approx(0.2) and s["max_rel_err"] == pytest.approx(0.05) and s["pass"]
    masked = dc.error_stats(got, ref, tolerance=0.01, mask=np.array([True, False]))  # rows: the first only
    assert masked["max_abs_err"] == pytest.approx(0.1) and not masked["pass"]
    bad = dc.error_stats(np.array([np.nan, 1.0]), np.array([1.0, 1.0]), tolerance=1.0)
    assert not bad["pass"] and not bad["finite"]


def test_the_time_limit_signal_is_recorded(dc, tmp_path, monkeypatch):
    """scripts/device_check.sh's ``timeout`` sends SIGTERM: the part it lands in fails with TimeLimit, the JSON is
    written and the exit status is timeout's 124."""
    import os
    import signal
    import time

    def interrupted(device):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM was not handled")

    monkeypatch.setattr(dc, "environment", interrupted)
    out = tmp_path / "dc.json"
    code = dc.main(["--dry_run", f"--out={out}", "--parts=environment"])
    report = strict_json(out)
    assert code == 124 and report["status"] == "failed"
    assert report["parts"]["environment"]["status"] == "failed"
    assert report["parts"]["environment"]["error"]["type"] == "TimeLimit"


def test_nvidia_smi_is_read_from_its_csv_and_header(dc, tmp_path, monkeypatch):
    """A stand-in nvidia-smi printing what a driver 580 machine prints: the query's fields, and the header's CUDA
    version; one refusing the long query is asked for the basic fields."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\ncase "$1" in\n'
                    '  --query-gpu=name,driver_version,memory.total) echo "NVIDIA H200, 580.159.03, 143771 MiB";;\n'
                    '  --query-gpu=*) if [ -n "$REFUSE" ]; then exit 2; fi\n'
                    '    echo "NVIDIA H200, 580.159.03, 143771 MiB, 700.00 W, 1980 MHz, 3201 MHz, P0, 31";;\n'
                    '  *) echo "| NVIDIA-SMI 580.159.03   Driver Version: 580.159.03   CUDA Version: 13.0 |";;\nesac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    info = dc.nvidia_smi()
    assert info["name"] == "NVIDIA H200" and info["driver_version"] == "580.159.03"
    assert info["clocks.max.sm"] == "1980 MHz" and info["cuda_driver_api"] == "13.0"
    monkeypatch.setenv("REFUSE", "1")
    assert dc.nvidia_smi() == {"name": "NVIDIA H200", "driver_version": "580.159.03", "memory.total": "143771 MiB",
                               "cuda_driver_api": "13.0"}
