"""Every name the tools and studies take from kernel.reference exists there.

The bench's input builder reads the recipe's constants as ``ref.NAME`` inside functions
that only run on a GPU with torch; when kernel.reference became a package its
re-exports dropped four of them and only the H200 noticed. This reads the sources
instead, so the CPU suite notices.
"""
from __future__ import annotations

import ast
from pathlib import Path

import kernel.reference

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted((ROOT / "kernel" / "tools").rglob("*.py")) + sorted((ROOT / "kernel" / "studies").rglob("*.py"))


def _own_nodes(scope: ast.AST):
    """The nodes of one function (or module) body, not those of the functions inside it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _names_taken(tree: ast.AST) -> set[str]:
    """Names imported from kernel.reference, and attributes read from it where a scope
    imports it as a module (``from kernel import reference as ref``; ``ref`` elsewhere
    may be an array)."""
    names = set()

    def own_aliases(scope) -> set[str]:
        found = set()
        for node in _own_nodes(scope):
            if isinstance(node, ast.ImportFrom) and node.module == "kernel.reference":
                names.update(a.name for a in node.names)
            if isinstance(node, ast.ImportFrom) and node.module == "kernel":
                found |= {a.asname or a.name for a in node.names if a.name == "reference"}
        return found

    module_aliases = own_aliases(tree)
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        aliases = module_aliases | own_aliases(scope) if scope is not tree else module_aliases
        if scope is not tree:   # a parameter of that name is something else (e.g. a reference array)
            aliases -= {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}
        for node in _own_nodes(scope):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                names.add(node.attr)
    return names


def test_every_name_taken_from_the_reference_exists():
    missing = {}
    for path in SOURCES:
        for name in _names_taken(ast.parse(path.read_text())):
            if not hasattr(kernel.reference, name):
                missing.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert not missing, missing


def test_the_scan_sees_the_bench():
    inputs = ROOT / "kernel" / "tools" / "bench" / "inputs.py"
    assert {"GATE_LOGIT_MEAN", "DO_SCALE"} <= _names_taken(ast.parse(inputs.read_text()))
