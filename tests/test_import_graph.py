"""Who may import whom: the product imports none of its tools, studies or experiments, and
ptx_lab (the library) imports none of the packages that use it.

Read from the source with `ast` (every import, also those inside functions), and checked
once more in a fresh interpreter through sys.modules.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT_OUTSIDE = ("tools", "studies")   # kernel/ subpackages that are not the product


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _product_files() -> list[Path]:
    out = []
    for path in sorted((REPO / "kernel").rglob("*.py")):
        rel = path.relative_to(REPO / "kernel").parts
        if rel[0] in PRODUCT_OUTSIDE:
            continue
        out.append(path)
    return out


def _parsed(path: Path) -> tuple[ast.Module, list[str]]:
    """The file's syntax tree and the package its relative imports start from."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    return ast.parse(path.read_text(), str(path)), package


def _from_module(node: ast.ImportFrom, package: list[str]) -> str:
    """The absolute module of a ``from ... import`` (a relative one resolved against `package`)."""
    base = package[:len(package) - node.level + 1] if node.level else []
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved against its package)."""
    tree, package = _parsed(path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            out.add(mod)
            out |= {f"{mod}.{alias.name}" for alias in node.names}   # `from kernel import tools`
    return out


def _reaches(mods: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == b or m.startswith(b + ".") for b in banned))


def test_the_product_files_are_found():
    names = {_module_name(p) for p in _product_files()}
    assert {"kernel", "kernel.ds_scan", "kernel.ds_scan.launch", "kernel.ds_scan.config", "kernel.forward_states",
            "kernel.forward_states.config", "kernel.forward_states.launch", "kernel.token_gradients",
            "kernel.token_gradients.launch", "kernel.cp", "kernel.cp.exchange", "kernel.cp.scan",
            "kernel.cp.backward", "kernel.reference", "kernel.reference.dstate_scan"} <= names
    assert not any(n.startswith(("kernel.tools", "kernel.studies")) for n in names)


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_product_imports_no_tool_study_or_experiment(path):
    bad = _reaches(imports(path), ("kernel.tools", "kernel.studies", "experiments"))
    assert not bad, f"{path.relative_to(REPO)} imports {bad}"


@pytest.mark.parametrize("path", sorted((REPO / "ptx_lab").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_ptx_lab_imports_none_of_its_users(path):
    bad = _reaches(imports(path), ("experiments", "kernel"))
    assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_the_study_uses_no_private_name_of_the_tools():
    for path in sorted((REPO / "kernel" / "studies").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernel.tools"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.relative_to(REPO)} imports {private} from {node.module}"
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.value, ast.Name) and node.value.id in {"bench", "inputs", "timing",
                                                                                 "configs", "fla"}:
                raise AssertionError(f"{path.relative_to(REPO)}:{node.lineno} uses {node.value.id}.{node.attr}")


@pytest.mark.parametrize("imported, banned", [
    ("kernel, kernel.ds_scan.launch, kernel.ds_scan.config, kernel.reference", ("kernel.tools", "kernel.studies", "experiments")),
    ("ptx_lab, ptx_lab.cli, ptx_lab.commands, ptx_lab.fragments, ptx_lab.pictures, ptx_lab.model",
     ("kernel", "experiments")),
])
def test_in_a_fresh_interpreter(imported, banned):
    code = (f"import sys\nimport {imported}\n"
            f"print(sorted(m for m in sys.modules if m.startswith({banned!r})))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"import {imported} loaded {proc.stdout.strip()}"


# ----------------------------------------------------------------------------
# the product's own oracle, circles, private names
# ----------------------------------------------------------------------------

PACKAGES = ("kernel", "ptx_lab", "experiments")


def _all_files(with_tests: bool = False) -> list[Path]:
    roots = [*PACKAGES, *(("tests",) if with_tests else ())]
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py"))


KNOWN = {_module_name(p) for p in _all_files(with_tests=True)}


def module_edges(path: Path) -> set[str]:
    """The project modules `path` imports: ``from kernel.ds_scan import launch`` is an edge to kernel.ds_scan.launch (a
    module), ``from kernel.ds_scan.launch import launch`` one to kernel.ds_scan.launch; outside modules are left out."""
    tree, package = _parsed(path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in KNOWN}
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            for alias in node.names:
                if f"{mod}.{alias.name}" in KNOWN:
                    out.add(f"{mod}.{alias.name}")
                elif mod in KNOWN:
                    out.add(mod)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph = {_module_name(p): module_edges(p) for p in _all_files()}
    assert _circles(graph) == []


def test_circles_are_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


# The product imports its float64 oracle nowhere. kernel.cp's three modules still do: their
# float64 pairs (the reference standing in for the kernel on every rank) and the segment layout
# come from kernel.reference (the exchange's array_module and segment_bounds too). They are the one
# listed exception until the reference pairs live beside the reference; the test fails once any stops.
STILL_IMPORTING_THE_REFERENCE = ("kernel/cp/exchange.py", "kernel/cp/scan.py", "kernel/cp/backward.py")


def _product_not_reference() -> list[Path]:
    return [p for p in _product_files() if p.relative_to(REPO).parts[:2] != ("kernel", "reference")]


@pytest.mark.parametrize("path", _product_not_reference(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_product_imports_not_its_reference(path):
    bad = _reaches(module_edges(path), ("kernel.reference",))
    if str(path.relative_to(REPO)) in STILL_IMPORTING_THE_REFERENCE:
        assert bad, f"{path.relative_to(REPO)} no longer imports kernel.reference: take it off the list"
    else:
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def private_uses(path: Path) -> list[str]:
    """Where `path` takes a private name (one leading underscore) from another project module:
    ``from m import _x`` and ``m._x`` with m an imported project module. Private modules
    (``experiments._common``) may be imported; their names are public to their package."""
    tree, package = _parsed(path)
    private = lambda name: name.startswith("_") and not name.startswith("__")
    aliases, out = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name in KNOWN}
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            for a in node.names:
                if f"{mod}.{a.name}" in KNOWN:
                    aliases.add(a.asname or a.name)
                elif mod in KNOWN and private(a.name):
                    out.append(f"{path.relative_to(REPO)}:{node.lineno} imports {a.name} from {mod}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            out.append(f"{path.relative_to(REPO)}:{node.lineno} uses {node.value.id}.{node.attr}")
    return out


def test_no_private_name_is_used_across_modules():
    # tests are left out: a test may reach into the module it tests (a monkeypatched driver call)
    uses = [line for p in _all_files() for line in private_uses(p)]
    assert uses == [], "\n".join(uses)
