"""Shipped code, the development package and the benchmarks never load ``tests``.

import-linter's contract sees ``import`` statements; this also reads the calls that
load a module by name or path at run time (``importlib.import_module``,
``__import__``, ``runpy``, ``spec_from_file_location``), which a static import graph
does not see. The demo once loaded ``tests.cluster.localcluster`` that way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("operator/sdcguard", "operator/sdcdev", "jobs/sdcprobe", "jobs/sdctrain", "bench")
LOADERS = {
    "import_module",
    "__import__",
    "run_module",
    "run_path",
    "spec_from_file_location",
    "find_spec",
    "SourceFileLoader",
}


def _names_tests(text: str) -> bool:
    return text == "tests" or text.startswith(("tests.", "tests/")) or "/tests/" in text


def loads_of_tests(source: str) -> list[str]:
    """``line: what`` for each import or by-name load of the tests package in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _names_tests(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _names_tests(node.module):
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in LOADERS:
                continue
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                found += [
                    f"{node.lineno}: {name}({const.value!r})"
                    for const in ast.walk(arg)
                    if isinstance(const, ast.Constant)
                    and isinstance(const.value, str)
                    and _names_tests(const.value)
                ]
    return found


def test_the_scanner_sees_every_kind_of_load() -> None:
    source = """
import importlib, runpy
import tests.promql
from tests.cluster import thing
importlib.import_module("tests.cluster.localcluster")
__import__("tests")
runpy.run_path(f"{REPO}/tests/cluster/helper.py")
importlib.util.spec_from_file_location("x", "tests/cluster/helper.py")
importlib.import_module("sdcdev.cluster.localcluster")
"""
    assert [line.split(":")[0] for line in loads_of_tests(source)] == [
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
    ]


@pytest.mark.parametrize("root", ROOTS)
def test_no_module_loads_the_tests(root: str) -> None:
    files = sorted((REPO / root).rglob("*.py"))
    assert files, f"no Python files under {root}"
    found = [
        f"{path.relative_to(REPO)}:{hit}"
        for path in files
        for hit in loads_of_tests(path.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)
