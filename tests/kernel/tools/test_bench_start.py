"""ptx-lab bench on a machine where it cannot run: exit status 2 and one line saying why, as every
GPU tool of ptx-lab; and the bench package's modules import each other without a cycle."""
from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from kernel.tools.bench import cli
from kernel.tools.bench.device import CANNOT_RUN_EXIT

from .blocked_imports import run_blocked

BENCH = Path(cli.__file__).resolve().parent


def test_the_status_is_the_other_gpu_tools():
    assert CANNOT_RUN_EXIT == 2


@pytest.mark.parametrize("argv", [["--quick"], ["--configs", "2x256", "--no-fla"]])
def test_without_torch_exits_2_naming_it(argv):
    out = run_blocked(f"from kernel.tools.bench import cli\nsys.exit(cli.main({argv!r}, prog='ptx-lab bench'))\n")
    assert out.returncode == 2, out.stderr
    assert out.stdout == "ptx-lab bench needs torch and a CUDA GPU: torch is not installed (blocked: torch)\n"


def test_without_a_cuda_device_exits_2_naming_it(monkeypatch, capsys):
    no_device = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", no_device)
    assert cli.main(["--quick"], prog="ptx-lab bench") == 2
    assert capsys.readouterr().out == "ptx-lab bench needs torch and a CUDA GPU: torch sees no CUDA device\n"


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
