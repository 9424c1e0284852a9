"""outlines-core indexes kept on disk, so a grammar compiled once loads in a fraction of a second
after a restart (``json_object``'s generic JSON index takes ~10 s to build on 2 cores and
~0.1 s to read back).

Files live under ``$RADIXLM_CACHE/grammars/<vocabulary key>/<regex key>.index``: the vocabulary
key hashes the pickled vocabulary and the outlines-core version, so another tokenizer or
release never reads them. Only builds slower than ``min_build_s`` are written (a cheap regex is
rebuilt faster than it is read), and the oldest files go once the directory passes
``budget_bytes``. The files are pickles written by this engine into the user's own cache, the
same trust as the compiled step graphs beside them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from importlib.metadata import version
from typing import Any

from radixlm.runtime.loader.text_tokenizer import cache_root

logger = logging.getLogger(__name__)

SUFFIX = ".index"


def grammar_cache_dir() -> str:
    return os.path.join(cache_root(), "grammars")


class IndexCache:
    def __init__(
        self, root: str, vocabulary: bytes, budget_bytes: int = 2 << 30, min_build_s: float = 1.0
    ) -> None:
        key = hashlib.sha256(vocabulary + version("outlines_core").encode()).hexdigest()[:24]
        self.dir = os.path.join(root, key)
        self.budget_bytes = budget_bytes
        self.min_build_s = min_build_s

    def get(self, regex: str) -> Any | None:
        """The stored index of ``regex``, or None (missing or unreadable)."""
        path = self._path(regex)
        try:
            with open(path, "rb") as f:
                index = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001 - a damaged file is a miss, and is dropped
            logger.warning("grammar cache file %s is unreadable (%s); rebuilding it", path, e)
            _remove(path)
            return None
        os.utime(path)  # NOTE: recently used files are evicted last
        return index

    def put(self, regex: str, index: Any, build_s: float) -> None:
        """Store ``index`` when its build took ``min_build_s`` or more; never raises."""
        if build_s < self.min_build_s:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                pickle.dump(index, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self._path(regex))  # NOTE: atomic: readers see a whole file or none
            self._evict()
        except OSError as e:
            logger.warning("grammar cache: could not store an index in %s: %s", self.dir, e)

    def _path(self, regex: str) -> str:
        name = hashlib.sha256(regex.encode()).hexdigest()[:32]
        return os.path.join(self.dir, name + SUFFIX)

    def _evict(self) -> None:
        files = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(SUFFIX):
                stat = entry.stat()
                files.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget_bytes:
                break
            _remove(path)
            total -= size


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
