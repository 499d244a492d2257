"""A pytest plugin that keeps a ledger of test outcomes, so that a GPU test run cut off by a call's time
limit can be finished by later calls on the same tree.

A call to the GPU machine runs for at most 10 minutes. On a fresh machine the GPU tests compile every CuPy
module and autotune every FLA kernel first, and the whole ``pytest -m gpu`` then takes longer than one
call. With ``--ledger=FILE``:

* each test's outcome is appended to FILE as soon as the test has finished (``passed``, ``failed``,
  ``error`` or ``skipped``, then its node id), so that a run interrupted at a deadline still says which
  tests ran;
* tests that FILE already records as passed are deselected, so that the next call runs only the rest;
* FILE starts with the tree's fingerprint (a hash of every source and test file), and a ledger written on
  another tree is refused: a test passed on yesterday's code says nothing about today's;
* the terminal summary says how many of the selected tests have now passed on this tree, counting the
  earlier calls.

It works under pytest-xdist: the workers deselect from the same file, and only the controller writes.
Give the file as ``--ledger=FILE``. Written ``--ledger FILE`` with no test path on the command line,
xdist's workers take FILE for the test path, and their rootdir (so their node ids) is then FILE's folder;
a worker whose rootdir is not the controller's stops with an error that says so.

    python -m pytest -m gpu -p kernel.tools.pytest_ledger --ledger=FILE
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

__all__ = ["tree_fingerprint", "read_ledger", "OUTCOMES"]

OUTCOMES = ("passed", "failed", "error", "skipped")
HEADER = "# tree "
# what the fingerprint covers: the code the tests run and the tests themselves
SOURCE_DIRS = ("ptx_lab", "kernel", "experiments", "tests")
SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".toml", ".json")


def tree_fingerprint(root: Path) -> str:
    """A hash of the path and bytes of every source file under ``root``'s SOURCE_DIRS and its
    pyproject.toml (caches and compiled files left out)."""
    digest = hashlib.sha256()
    files = [root / "pyproject.toml"] if (root / "pyproject.toml").is_file() else []
    for name in SOURCE_DIRS:
        files += [p for p in (root / name).rglob("*")
                  if p.suffix in SOURCE_SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def read_ledger(path: Path) -> tuple[str | None, dict[str, str]]:
    """(the tree fingerprint in the header, node id -> its last recorded outcome)."""
    tree, outcomes = None, {}
    for line in path.read_text().splitlines():
        if line.startswith(HEADER):
            tree = line[len(HEADER):].strip()
        elif line.strip() and not line.startswith("#"):
            outcome, _, nodeid = line.partition(" ")
            if outcome not in OUTCOMES or not nodeid:
                raise ValueError(f"{path}: not a ledger line: {line!r}")
            outcomes[nodeid] = outcome
    return tree, outcomes


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ledger", metavar="FILE", default=None,
                     help="append each test's outcome to FILE as it finishes, and deselect the tests FILE "
                          "records as passed on this same tree (kernel.tools.pytest_ledger)")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")   # a pytest-xdist worker: the controller writes the ledger


class _Ledger:
    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.path = path
        self.rootpath = Path(config.rootpath)
        if _is_worker(config):
            controller = config.workerinput.get("ledger_rootpath")
            if controller is not None and Path(controller) != self.rootpath:
                raise pytest.UsageError(
                    f"--ledger: this pytest-xdist worker's rootdir is {self.rootpath} and the controller's "
                    f"{controller}, so their node ids differ. Write --ledger={path} (with '='): written "
                    "apart, with no test path given, the workers take the file for the test path.")
        # a worker takes the controller's fingerprint rather than hashing the tree again
        self.tree = (config.workerinput.get("ledger_tree") if _is_worker(config) else None) \
            or tree_fingerprint(self.rootpath)
        self.earlier: dict[str, str] = {}
        if path.exists() and path.stat().st_size:
            tree, self.earlier = read_ledger(path)
            if tree != self.tree:
                raise pytest.UsageError(
                    f"--ledger {path} records tree {tree}, and this tree is {self.tree}: the tests it lists "
                    "ran on other code. Remove it, or give another file.")
        elif not _is_worker(config):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{HEADER}{self.tree}\n")
        self.passed_before = {n for n, o in self.earlier.items() if o == "passed"}
        self.selected: list[str] = []
        self.now: dict[str, str] = {}
        self._phases: dict[str, list[str]] = {}
        self._writer = None if _is_worker(config) else path.open("a", buffering=1)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # trylast: after the -m / -k selection and conftest's GPU skips, so that "selected" is what runs
        done = [item for item in items if item.nodeid in self.passed_before]
        if done:
            config.hook.pytest_deselected(items=done)
            items[:] = [item for item in items if item.nodeid not in self.passed_before]
        self.selected = [item.nodeid for item in items]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self._writer is None:
            return
        phases = self._phases.setdefault(report.nodeid, [])
        if report.failed:
            phases.append("failed" if report.when == "call" else "error")
        elif report.skipped:
            phases.append("skipped")
        if report.when != "teardown":
            return
        found = self._phases.pop(report.nodeid)
        outcome = next((o for o in ("failed", "error", "skipped") if o in found), "passed")
        self.now[report.nodeid] = outcome
        self._writer.write(f"{outcome} {report.nodeid}\n")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        # the controller tells each worker its rootdir, which the worker's must match (see __init__), and
        # the tree's fingerprint
        node.workerinput["ledger_rootpath"] = str(self.rootpath)
        node.workerinput["ledger_tree"] = self.tree

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        # under pytest-xdist the controller collects nothing itself: each worker reports what it will run
        self.selected = list(ids)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self._writer is None:
            return
        counts = {o: sum(1 for v in self.now.values() if v == o) for o in OUTCOMES}
        ran = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "nothing"
        left = sum(1 for n in self.selected if self.now.get(n) != "passed")
        verdict = (f"{left} of the {len(self.selected)} tests this run selected have not passed"
                   if left else f"all {len(self.selected)} tests this run selected passed")
        terminalreporter.write_line(
            f"ledger {self.path} (tree {self.tree}): this run {ran}; {verdict}; "
            f"{len(self.passed_before)} more had passed in earlier runs of this tree and were not run again")

    def pytest_unconfigure(self) -> None:
        if self._writer is not None:
            self._writer.close()


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--ledger")
    if path:
        config.pluginmanager.register(_Ledger(config, Path(path)), "ptx-lab-ledger")
