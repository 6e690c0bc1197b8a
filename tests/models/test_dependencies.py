"""The dependency direction of ``sera_jax.models`` (CONTRIBUTING.md: ``core`` <- ``models`` <- ``rl``/``train``):
its modules import, of this package, only ``sera_jax.core`` and each other; never ``sera_jax.rl``, whose task
protocol imports ``SampleOutput`` from ``sera_jax.models.sampler`` rather than the other way round."""

import ast
import pathlib

MODELS = pathlib.Path(__file__).resolve().parents[2] / "sera_jax" / "models"
ALLOWED = ("sera_jax.core", "sera_jax.models")


def imported_modules(path: pathlib.Path) -> list[str]:
    """Every module ``path`` imports, at any depth of the file (imports inside functions included)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("sera_jax.models" if node.level else node.module)  # relative: inside the package
    return names


def test_models_import_nothing_from_rl_or_any_later_layer():
    files = sorted(MODELS.glob("*.py"))
    assert any(f.name == "sampler.py" for f in files)  # the sampler lives here, beside the decoder
    bad = [f"{f.name}: {name}" for f in files for name in imported_modules(f)
           if name.split(".")[0] == "sera_jax" and not name.startswith(ALLOWED)]
    assert not bad, f"sera_jax.models imports later layers: {bad}"
