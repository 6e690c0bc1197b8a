"""prepare_workdir: creation, and clear errors for unusable workdirs."""

import errno
import json
import os

import pytest

from sera_jax.train import workdir as wd


def test_creates_nested_and_returns_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = wd.prepare_workdir("a/b/c", min_free_bytes=1)
    assert out == tmp_path / "a" / "b" / "c" and out.is_dir() and out.is_absolute()
    assert list(out.iterdir()) == []  # the write probe cleaned up after itself
    assert wd.prepare_workdir(out, min_free_bytes=1) == out  # existing directory is fine


def test_existing_file_and_uncreatable_path(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=rf"workdir {f} exists and is not a directory"):
        wd.prepare_workdir(f)
    with pytest.raises(ValueError, match=rf"workdir {f / 'sub'} cannot be created"):
        wd.prepare_workdir(f / "sub")
    with pytest.raises(ValueError, match="only local paths"):
        wd.prepare_workdir("gs://bucket/run")
    with pytest.raises(ValueError, match="workdir is empty"):
        wd.prepare_workdir("")


def test_full_disk_names_path_and_sizes(tmp_path):
    with pytest.raises(ValueError, match=rf"workdir {tmp_path} has only .* free; at least 1024.0 TiB"):
        wd.prepare_workdir(tmp_path, min_free_bytes=1 << 50)


def test_unwritable_names_path(tmp_path, monkeypatch):
    def refuse(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(wd, "_probe_write", refuse)
    with pytest.raises(ValueError, match=rf"workdir {tmp_path} is not writable: Permission denied"):
        wd.prepare_workdir(tmp_path, min_free_bytes=1)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_read_only_directory_really_fails(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=rf"workdir {ro} is not writable"):
            wd.prepare_workdir(ro, min_free_bytes=1)
    finally:
        ro.chmod(0o700)


def test_claim_workdir_records_then_refuses_another_config(tmp_path):
    fp = {"model.d_model": 32, "rl.learning_rate": 3e-4}
    wd.claim_workdir(tmp_path, {**fp, "model.d_model": 64})
    wd.claim_workdir(tmp_path, fp)  # the first run wrote nothing else: another config may take the workdir
    saved = (tmp_path / wd.FINGERPRINT_FILE).read_text()
    assert saved == json.dumps(fp, indent=1, sort_keys=True)  # the format earlier runs wrote
    assert sorted(os.listdir(tmp_path)) == [wd.FINGERPRINT_FILE]  # no temp file left
    (tmp_path / "checkpoints").mkdir()
    wd.claim_workdir(tmp_path, dict(fp))  # the same config resumes
    with pytest.raises(ValueError, match=r"(?s)holds a run with a different config.*"
                                         r"rl\.learning_rate: workdir=0\.0003, now=0\.001.*use a new --workdir"):
        wd.claim_workdir(tmp_path, {**fp, "rl.learning_rate": 1e-3})
    with pytest.raises(ValueError, match=r"model\.n_layers: workdir=<absent>, now=2"):
        wd.claim_workdir(tmp_path, {**fp, "model.n_layers": 2})
    assert (tmp_path / wd.FINGERPRINT_FILE).read_text() == saved  # a refused run changes nothing
    (tmp_path / wd.FINGERPRINT_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="is unreadable"):
        wd.claim_workdir(tmp_path, fp)
