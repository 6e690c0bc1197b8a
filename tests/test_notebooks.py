"""Executes every notebook in notebooks/ top to bottom; any cell error fails its test.

New notebooks are picked up automatically. The kernel runs this interpreter (a kernelspec written for the
test, so a ``python3`` spec installed elsewhere on the machine cannot substitute another Python), with the
test environment (CPU JAX) and ``MPLBACKEND=Agg``.
"""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # generous: the 2-core CI machine is shared; a notebook should take about a minute in all


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory) -> KernelSpecManager:
    """A KernelSpecManager whose only ``python3`` kernel is ipykernel under this interpreter."""
    kernel_dir = tmp_path_factory.mktemp("kernels")
    kernelspec.write_kernel_spec(kernel_dir / "python3")
    return KernelSpecManager(kernel_dirs=[str(kernel_dir)])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_specs, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # the kernel inherits this process's environment
    notebook = nbformat.read(path, as_version=4)
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=kernel_specs)
    client = nbclient.NotebookClient(
        notebook, km=kernel, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute()  # raises CellExecutionError (with the cell and traceback) on the first failing cell
    finally:
        # The client does not own a kernel manager it was handed, so it leaves the kernel (a JAX process of ~1 GiB)
        # running; stop it here.
        if kernel.has_kernel:
            kernel.shutdown_kernel(now=True)


def test_notebooks_found():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOK_DIR}"
