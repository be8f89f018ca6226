"""``handlers.py`` only registers Kopf handlers: no classes, and every function but the
memo accessor is a Kopf handler that hands what Kopf gives it to the operator's parts
(``assembly.py``), so logic that creeps back in fails here."""

from __future__ import annotations

import ast
from pathlib import Path

HANDLERS = Path(__file__).resolve().parents[2] / "operator" / "sdcguard" / "handlers.py"
HELPERS = {"_op"}
"""Functions allowed beside the handlers: the typed read of Kopf's memo."""
LONGEST_HANDLER = 40
"""Lines: the start-up handler sets Kopf's settings, one line each."""


def _kopf_decorated(node: ast.AsyncFunctionDef | ast.FunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target).startswith("kopf."):
            return True
    return False


def test_handlers_only_register() -> None:
    tree = ast.parse(HANDLERS.read_text())
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert classes == [], f"classes belong in assembly.py or the adapters: {classes}"
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    loose = [f.name for f in functions if f.name not in HELPERS and not _kopf_decorated(f)]
    assert loose == [], f"not a Kopf handler: {loose}"
    long = [
        f.name
        for f in functions
        if f.end_lineno is not None and f.end_lineno - f.lineno > LONGEST_HANDLER
    ]
    assert long == [], f"a handler that does more than hand on: {long}"
    assert len(functions) > len(HELPERS)
