"""The bench package's modules import each other without a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

from kernel.tools.bench import cli

BENCH = Path(cli.__file__).resolve().parent


def _bench_imports(path: Path) -> set[str]:
    """The bench modules `path` imports (every import, also those inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
            elif (node.module or "").startswith("kernel.tools.bench."):
                names = [node.module.split(".")[3]]
            else:
                names = []
            out |= {n.split(".")[0] for n in names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[3] for a in node.names if a.name.startswith("kernel.tools.bench.")}
    return out


def test_the_bench_package_has_no_import_cycle():
    graph = {p.stem: _bench_imports(p) - {p.stem} for p in BENCH.glob("*.py") if p.stem != "__main__"}
    assert "cli" in graph and "backward_run" in graph["cli"]
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done or name not in graph:
            return
        path.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
