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


def imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out.add(mod)
            out |= {f"{mod}.{alias.name}" for alias in node.names}   # `from kernel import tools`
    return out


def _reaches(mods: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == b or m.startswith(b + ".") for b in banned))


def test_the_product_files_are_found():
    names = {_module_name(p) for p in _product_files()}
    assert {"kernel", "kernel.api", "kernel.build", "kernel.reference", "kernel.reference.dstate_scan"} <= names
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
    ("kernel, kernel.api, kernel.build, kernel.reference", ("kernel.tools", "kernel.studies", "experiments")),
    ("ptx_lab, ptx_lab.cli, ptx_lab.commands, ptx_lab.fragments, ptx_lab.pictures, ptx_lab.model",
     ("kernel", "experiments")),
])
def test_in_a_fresh_interpreter(imported, banned):
    code = (f"import sys\nimport {imported}\n"
            f"print(sorted(m for m in sys.modules if m.startswith({banned!r})))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"import {imported} loaded {proc.stdout.strip()}"
