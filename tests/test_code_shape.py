"""The shape of the code a reader inherits: no module of the project over 1,000 lines, no
function or method over 80. Each offender is named, with its length, so that the fix starts
where the message points."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "reconciliation", "sagas", "tests", "scripts", "clients/python/src")
SKIPPED_PARTS = {"migrations", ".venv", "node_modules", "__pycache__"}
MAX_MODULE_LINES = 1_000
MAX_FUNCTION_LINES = 80


def modules() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not SKIPPED_PARTS.intersection(path.relative_to(ROOT).parts):
                yield path


def functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, by its dotted name inside the module."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    for name, node in walk(tree, ""):
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        yield name, node


def length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first decorator (or ``def``) to the last line of the body."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    assert node.end_lineno is not None
    return node.end_lineno - first + 1


def offenders() -> tuple[list[str], list[str]]:
    long_modules, long_functions = [], []
    for path in modules():
        source = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        lines = source.count("\n") + (not source.endswith("\n") and bool(source))
        if lines > MAX_MODULE_LINES:
            long_modules.append(f"{where}: {lines} lines")
        for name, node in functions(ast.parse(source, filename=str(where))):
            if (n := length(node)) > MAX_FUNCTION_LINES:
                long_functions.append(f"{where}:{node.lineno} {name}: {n} lines")
    return long_modules, long_functions


def test_the_check_sees_the_project():
    paths = [str(path.relative_to(ROOT)) for path in modules()]
    assert "gateway/services.py" in paths and "tests/test_code_shape.py" in paths
    assert not any("migrations" in path for path in paths)


def test_the_check_measures_a_function_from_its_decorators_to_its_last_line():
    source = "class A:\n    @staticmethod\n    def f():\n        x = 1\n\n        return x\n"
    tree = ast.parse(source)
    [(name, node)] = list(functions(tree))
    assert (name, length(node)) == ("A.f", 5)


@pytest.mark.parametrize("kind", ["modules", "functions"])
def test_no_module_over_1000_lines_and_no_function_over_80(kind):
    long_modules, long_functions = offenders()
    found = long_modules if kind == "modules" else long_functions
    limit = MAX_MODULE_LINES if kind == "modules" else MAX_FUNCTION_LINES
    assert not found, f"over {limit} lines:\n" + "\n".join(found)
