"""Architecture: requests are validated once, in the tokenizer manager; the scheduler and the
grammar queue never parse sampling parameters or constraint specs again."""

from __future__ import annotations

import ast
import pathlib

import radixlm.runtime.scheduler as scheduler_pkg

PARSERS = {
    "from_dict", "validate", "constraint_from_params", "check_regex", "canonical_schema",
    "parse_choices", "wire_sampling", "parse_sampling",
}


def _names(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.alias):
            found.add(node.name.split(".")[-1])
    return found


def test_scheduler_package_calls_no_parser():
    files = sorted(pathlib.Path(scheduler_pkg.__file__).parent.glob("*.py"))
    assert any(f.name == "grammar_queue.py" for f in files)
    for path in files:
        assert not (_names(path) & PARSERS), (path.name, _names(path) & PARSERS)
