"""The README's training-loop example runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_example_runs():
    blocks = _python_blocks()
    assert blocks, "the README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    counts = namespace["counts"]
    assert int(counts.sum()) == 32 and counts.shape == (4,)
    assert namespace["adv"].shape == (32,) and namespace["w"].shape == (32,)
