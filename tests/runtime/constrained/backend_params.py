"""The grammar backends the tests run on: xgrammar (optional, the grammars extra) where it is
installed, else its cases skip."""

from __future__ import annotations

import importlib.util

import pytest

HAVE_XGRAMMAR = importlib.util.find_spec("xgrammar") is not None
# Names the ``backends`` and ``compilers`` fixtures build.
INSTALLED = ("outlines", "llguidance", *(("xgrammar",) if HAVE_XGRAMMAR else ()))
needs_xgrammar = pytest.mark.skipif(not HAVE_XGRAMMAR, reason="xgrammar is not installed")
# For ``parametrize``: every backend, xgrammar's cases skipped without it.
BACKENDS = ("outlines", "llguidance", pytest.param("xgrammar", marks=needs_xgrammar))
