"""The house's rules, checked on the code: small files, short functions, no import circle,
no class carved in two by inheritance."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "ui")
MAX_FILE_LINES = 550
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


def _classes() -> dict[tuple[str, str], tuple[ast.ClassDef, dict[str, str]]]:
    """Every class of app/ and ui/ by (module, name), with its module's imported names."""
    found: dict[tuple[str, str], tuple[ast.ClassDef, dict[str, str]]] = {}
    for p in product_files():
        module = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        tree = ast.parse(p.read_text(encoding="utf-8"))
        names = {
            (a.asname or a.name): f"{n.module}.{a.name}"
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module
            for a in n.names
        }
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                names.setdefault(node.name, f"{module}.{node.name}")
                found[(module, node.name)] = (node, names)
    return found


def _declared(cls: ast.ClassDef) -> set[str]:
    """Attributes a class declares: annotated in its body, or assigned on ``self``."""
    names = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    return names | _set_on_self(cls)


def _set_on_self(cls: ast.ClassDef) -> set[str]:
    return {
        t.attr
        for n in ast.walk(cls)
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def test_no_class_declares_attributes_that_a_subclass_in_another_module_sets() -> None:
    """A class owns its state: no base (or mixin) holds attributes that a subclass
    elsewhere fills in, which cuts one object in two files (compose instead)."""
    classes = _classes()
    by_path = {f"{module}.{name}": (module, name) for module, name in classes}
    carved = []
    for (module, name), (node, names) in classes.items():
        for base in node.bases:
            target = by_path.get(names.get(base.id, "")) if isinstance(base, ast.Name) else None
            if target is None or target[0] == module:
                continue
            shared = _declared(classes[target][0]) & _set_on_self(node)
            if shared:
                carved.append(f"{module}.{name} sets {sorted(shared)} of {'.'.join(target)}")
    assert carved == [], "classes carved by inheritance:\n" + "\n".join(carved)
