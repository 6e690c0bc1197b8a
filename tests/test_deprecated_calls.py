"""Deprecated calls that pytest.ini cannot turn into errors: their libraries warn without a stacklevel (or with one
that lands inside the library), so the warning is attributed to the library and its ignore line there would also
hide a call of ours. A source check closes that gap."""

import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]
# pattern -> the current API to use instead
DEPRECATED = {
    r"\boptax\.global_norm\(": "optax.tree.norm",
    r"\.to_pure_dict\(\)": "nnx.to_pure_dict(state) (the nnx.State method is deprecated)",
    r"\bnnx\.Param\([^)]*\bsharding=": "out_sharding=",
}


def _python_sources() -> list[pathlib.Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / p for p in tracked.stdout.split() if p != "tests/test_deprecated_calls.py"]


def test_no_tracked_source_calls_an_api_whose_deprecation_warning_pytest_cannot_attribute_to_it():
    found = []
    for path in _python_sources():
        text = path.read_text(errors="replace")
        for pattern, instead in DEPRECATED.items():
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {m.group(0)!r} (use {instead})")
    assert not found, "\n".join(found)
