"""The house's size rules, checked on the code: small files, short functions, no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "ui")
MAX_FILE_LINES = 650
MAX_FUNCTION_LINES = 80


def product_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_product_file_is_over_the_line_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in product_files()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert long == {}, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_the_line_limit() -> None:
    long = []
    for p in product_files():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_import_circle_in_app_or_ui() -> None:
    """Any import counts, also one made inside a function or only for type checking."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    circles = set()
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            path = graph.find_shortest_chain(importer=imported, imported=module)
            if path:
                circles.add(" -> ".join((module, *path)))
    assert sorted(circles) == [], "import circles:\n" + "\n".join(sorted(circles))
