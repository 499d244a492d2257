"""Run a command under Nsight Compute (``ncu``) and read its metrics back.

One job: ``profile(command, metrics, kernel_regex)`` runs
``ncu --clock-control none --target-processes all --csv --metrics ...`` on the
command and returns one :class:`Launch` per profiled kernel launch, in launch
order, each with its metric values (None where ncu printed "n/a").

Metric names differ between GPUs and ncu versions, and ncu refuses the whole
run when one requested name does not exist. So an unknown name is dropped and
the run repeated (up to once per name), and the caller is told which names
were dropped; :func:`query_metrics` lists what the GPU offers.

``--clock-control none`` leaves the GPU's clocks as they are (ncu locks them
to base clocks by default). Counts of instructions and wavefronts do not depend
on the clock; it is set so that a profiled run behaves like an unprofiled one.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import re
import shutil
import subprocess
from typing import Sequence

from .processes import run_tree

NCU = "ncu"
# --print-units base: counts as plain numbers ("1152", not "1.15 K"), so divisions are exact
BASE_OPTIONS = ("--clock-control", "none", "--target-processes", "all", "--csv",
                "--print-units", "base")
_UNKNOWN_METRIC = re.compile(
    r"(?:failed to find|unknown|invalid|not found)[^\n]*?metric[s]?[\s:\"']+([A-Za-z0-9_.]+)",
    re.IGNORECASE)
_NA = {"", "n/a", "N/A", "nan"}


@dataclasses.dataclass
class Launch:
    """One profiled kernel launch: its ncu ID, kernel name and metric values."""
    id: int
    kernel: str
    metrics: dict[str, float | None]


@dataclasses.dataclass
class Profile:
    launches: list[Launch]
    dropped: list[str]          # requested names ncu did not know (removed, run repeated)
    error: str | None = None    # set when no launch could be read at all
    command: tuple[str, ...] = ()


def ncu_path() -> str | None:
    return shutil.which(NCU)


def query_metrics(chip: str | None = None) -> str:
    """`ncu --query-metrics` output (for fixing a metric table on a new GPU)."""
    exe = ncu_path()
    if exe is None:
        raise RuntimeError("ncu is not on PATH")
    args = [exe, "--query-metrics"] + (["--chip", chip] if chip else [])
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout


def profile(command: Sequence[str], metrics: Sequence[str], kernel_regex: str | None = None,
            *, timeout: float = 540.0, env: dict[str, str] | None = None) -> Profile:
    """Run `command` under ncu collecting `metrics`; never raises for ncu's own failures."""
    exe = ncu_path()
    if exe is None:
        return Profile([], [], "ncu is not on PATH")
    wanted, dropped = list(dict.fromkeys(metrics)), []
    while wanted:
        args = [exe, *BASE_OPTIONS, "--metrics", ",".join(wanted)]
        if kernel_regex:
            args += ["--kernel-name", f"regex:{kernel_regex}"]
        args += list(command)
        try:
            done = run_tree(args, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return Profile([], dropped, f"ncu ran past {timeout:.0f} s (it and the program it profiled were "
                                        f"killed)", tuple(args))
        out = done.stdout + "\n" + done.stderr
        unknown = [m for m in _UNKNOWN_METRIC.findall(out) if m in wanted]
        launches = parse_csv(done.stdout)
        if unknown and not launches:
            dropped += unknown
            wanted = [m for m in wanted if m not in unknown]
            continue
        if not launches:
            tail = "\n".join(line for line in out.strip().splitlines()[-6:])
            return Profile([], dropped, f"ncu exited {done.returncode} with no metrics: {tail}",
                           tuple(args))
        for launch in launches:   # names ncu silently left out read as missing
            for m in wanted:
                launch.metrics.setdefault(m, None)
        return Profile(launches, dropped, None, tuple(args))
    return Profile([], dropped, "ncu knew none of the requested metrics")


def _number(text: str) -> float | None:
    text = text.strip().strip('"')
    if text in _NA:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_csv(stdout: str) -> list[Launch]:
    """ncu --csv output (details page, one row per metric, or raw page, one row per launch).

    Lines before the CSV header (the application's output, ==PROF== lines) are skipped.
    """
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    body = [line for line in lines[start:] if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    header, rows = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kernel_col = col.get("Kernel Name", col.get("Function Name"))
    launches: dict[int, Launch] = {}
    if "Metric Name" in col:           # details page
        for row in rows:
            if len(row) < len(header) or not row[col["ID"]].strip().isdigit():
                continue
            lid = int(row[col["ID"]])
            launch = launches.setdefault(lid, Launch(lid, row[kernel_col] if kernel_col is not None else "", {}))
            launch.metrics[row[col["Metric Name"]]] = _number(row[col["Metric Value"]])
    else:                              # raw page: metric names are columns, a units row follows
        for row in rows:
            if len(row) < len(header) or not row[col["ID"]].strip().isdigit():
                continue
            lid = int(row[col["ID"]])
            values = {name: _number(row[i]) for name, i in col.items() if "__" in name}
            launches[lid] = Launch(lid, row[kernel_col] if kernel_col is not None else "", values)
    return [launches[k] for k in sorted(launches)]


__all__ = ["Launch", "Profile", "ncu_path", "query_metrics", "profile", "parse_csv"]
