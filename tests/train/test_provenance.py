"""A run's results name the commit it started from (sera_jax.train.writers.run_provenance is read once a process)."""

import subprocess

from sera_jax.train import writers


def test_the_commit_is_the_one_read_at_the_runs_start(monkeypatch):
    heads = iter(["a" * 40, "b" * 40, "c" * 40])

    def fake_git(args, **kwargs):  # rev-parse answers the next commit; status answers "clean"
        out = next(heads) if "rev-parse" in args else ""
        return subprocess.CompletedProcess(args, 0, stdout=out + "\n", stderr="")

    monkeypatch.setattr(writers.subprocess, "run", fake_git)
    writers._first_provenance.cache_clear()
    try:
        writers.record_run_start()  # the run starts at commit a ...
        first = writers.run_provenance()
        first["commit"] = "changed by a caller"
        assert writers.run_provenance()["commit"] == "a" * 40  # ... and its later writes still say a
        assert writers.run_provenance()["dirty"] is False
    finally:
        writers._first_provenance.cache_clear()
