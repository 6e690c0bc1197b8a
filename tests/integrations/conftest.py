"""tunix sets flax's ``flax_always_shard_variable`` to False for the whole process when it is imported
(``tunix.utils.env_utils``). Collection imports these test files in every test worker, so the flag is put back
after collection, and set to tunix's value only while a test file of this folder runs: the rest of the suite keeps
flax's own default."""

import flax
import pytest

_FLAX_DEFAULT = flax.config.flax_always_shard_variable


def pytest_collection_finish(session):
    flax.config.update("flax_always_shard_variable", _FLAX_DEFAULT)


@pytest.fixture(autouse=True, scope="module")
def tunix_flax_settings():
    flax.config.update("flax_always_shard_variable", False)
    yield
    flax.config.update("flax_always_shard_variable", _FLAX_DEFAULT)
