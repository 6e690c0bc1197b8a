import jax
import pytest


@pytest.fixture
def x64():
    """Runs a test with 64-bit floats enabled (restored afterwards)."""
    with jax.enable_x64(True):
        yield
