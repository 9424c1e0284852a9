"""Fixtures of the runtime's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def aot_cache(tmp_path_factory):
    """A cache of its own for one module's compiled graphs (children inherit it), so a test
    module builds them as a first start does."""
    path = str(tmp_path_factory.mktemp("aot-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXLM_CACHE", path)
        yield path
