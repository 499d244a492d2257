"""The kernels' resource report, offline: no GPU needed.

    ptx-lab resources            # one row per variant
    ptx-lab resources --check    # ... and exit 1 on a spill or a missing instruction
    ptx-lab resources --sass-digest after.json --against before.json
                                 # ... and exit 1 where any variant's SASS changed

(also ``python -m kernel.tools.resources``.)

Every variant the API can launch, of every kernel in `kernel.registry.KERNELS` (Kernel A's
rows by their knobs, Kernel S's named ``states-...``, Kernel B's ``token-gradients``), is compiled
with nvcc for sm_90a from the same source and -D options the API uses. For each:
registers and spill bytes (ptxas -v), dynamic shared memory per CTA (the
kernel's own `<prefix>_smem_bytes` constant, read from the PTX), CTAs per SM that
registers, shared memory and threads allow on an H100/H200 (64K registers,
228 KB shared memory with 1 KB reserved per CTA, 2048 threads), and SASS
instruction counts (cuobjdump; the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels, ``pip install -e '.[sass]'``, provide it where the
CUDA toolkit lacks it; --check needs it, the plain report leaves the counts out).

What the design relies on, checked with --check: the instructions each kernel's entry says a
variant must hold (``KernelBuild.required_sass``: HMMA, LDSM, LDGSTS in every kernel with GEMMs, STSM
where snapshots or states are staged by stmatrix, HGMMA in Kernel A's warpgroup-MMA builds; LDG in the rstd
pass, which has no GEMM and loads its rows into registers). MOVM is
counted in the table but never required or refused: the transposed formulation turns
accumulators into A operands by packing alone, and the count shows that it stayed so.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Sequence

from kernel.registry import KERNELS
from kernel.runtime.builds import KernelBuild
from ptx_lab import CUDA_INCLUDE_DIR

SASS_OPS = ("HMMA", "HGMMA", "LDSM", "STSM", "MOVM", "LDGSTS", "SYNCS", "UTMALDG", "UTMASTG", "LDG")   # SYNCS:
# mbarrier arrivals and waits; UTMALDG, UTMASTG: tensor copies in and out; LDG: loads from global memory into
# registers (the rstd pass's; the word alone, so LDGSTS and LDGDEPBAR do not count)
REGS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_CTA, THREADS_PER_SM = 65536, 228 * 1024, 1024, 2048


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    # the pip wheels (nvidia-cuda-cuobjdump / -nvdisasm / -nvcc) install under site-packages/nvidia/cu13/bin
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        cand = Path(base) / "nvidia" / "cu13" / "bin" / name
        if cand.exists():
            return str(cand)
    return None


def _nvcc_cmd(source: Path, options, out: Path, kind: str) -> list[str]:
    """nvcc for sm_90a with ptx_lab's headers on the path: `source` with `options` to `out` (`kind` -ptx / -cubin)."""
    return [_tool("nvcc") or "nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", f"-I{CUDA_INCLUDE_DIR}",
            *options, kind, str(source), "-o", str(out)]


def ptx_constant(ptx: str, name: str) -> int:
    """An ``extern "C" __constant__`` integer of a PTX text (a zero one is written without "= 0")."""
    m = re.search(rf"\.u32 {name}(?:\s*=\s*(\d+))?;", ptx)
    if m is None:
        raise ValueError(f"{name} is not in the PTX")
    return int(m.group(1) or 0)


def _sass(cubin: Path) -> subprocess.CompletedProcess:
    """`cuobjdump -sass` of a cubin (cuobjdump found by _tool; nvdisasm, which it runs, beside it)."""
    cuobjdump = _tool("cuobjdump")
    env = dict(os.environ, PATH=str(Path(cuobjdump).parent) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)


def compile_variant(kernel: KernelBuild, cfg, workdir: Path) -> dict:
    """One variant's row: registers, spills, stack, shared memory, threads, CTAs per SM, SASS counts."""
    stem = workdir / kernel.label(cfg)
    prefix = kernel.constants
    options = kernel.options(cfg)
    ptx = subprocess.run(_nvcc_cmd(kernel.entry, options, stem.with_suffix(".ptx"), "-ptx"), capture_output=True,
                         text=True)
    if ptx.returncode:
        return {"kernel": kernel, "cfg": cfg, "error": ptx.stderr.strip()}
    ptx_text = stem.with_suffix(".ptx").read_text()
    smem = ptx_constant(ptx_text, f"{prefix}_smem_bytes")
    threads = ptx_constant(ptx_text, f"{prefix}_threads")
    cub = subprocess.run(_nvcc_cmd(kernel.entry, options, stem.with_suffix(".cubin"), "-cubin") + ["-Xptxas", "-v"],
                         capture_output=True, text=True)
    if cub.returncode:
        return {"kernel": kernel, "cfg": cfg, "error": cub.stderr.strip()}
    log = cub.stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill_st = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    spill_ld = int(re.search(r"(\d+) bytes spill loads", log).group(1))
    stack = int(re.search(r"(\d+) bytes stack frame", log).group(1))
    static_smem = int(m.group(1)) if (m := re.search(r"(\d+) bytes smem", log)) else 0
    row = {"kernel": kernel, "cfg": cfg, "regs": regs, "spill": spill_st + spill_ld, "stack": stack,
           "smem": static_smem + smem, "threads": threads, "log": log}
    warps = threads // 32
    regs_per_warp = -(-regs * 32 // 256) * 256
    row["ctas_per_sm"] = min(REGS_PER_SM // (regs_per_warp * warps),
                             SMEM_PER_SM // (row["smem"] + SMEM_RESERVED_PER_CTA),
                             THREADS_PER_SM // threads)
    if _tool("cuobjdump") is None:
        row["sass"] = None
    else:
        sass = _sass(stem.with_suffix(".cubin"))
        if sass.returncode:
            row["sass"] = None
            row["sass_error"] = sass.stderr.strip()
        else:
            row["sass"] = {op: len(re.findall(rf"\b{op}\b", sass.stdout)) for op in SASS_OPS}
            row["sass_sha256"] = hashlib.sha256(sass.stdout.encode()).hexdigest()
    return row


SASS_INSTALL = "pip install -e '.[sass]'"   # the cuobjdump and nvdisasm wheels (pyproject's sass extra)


def problems(row: dict) -> list[str]:
    """What --check fails a variant for; SASS is judged only where it was read."""
    if "error" in row:
        return [f"compile error:\n{row['error']}"]
    out = []
    if row["spill"] or row["stack"]:
        out.append(f"spills {row['spill']} bytes, stack frame {row['stack']} bytes")
    if row["ctas_per_sm"] < 1:
        out.append("does not fit on an SM")
    if row.get("sass_error"):
        out.append(f"no SASS (cuobjdump failed: {row['sass_error']})")
    elif row["sass"] is not None:
        need = row["kernel"].required_sass(row["cfg"])
        out += [f"SASS has no {op}" for op in need if row["sass"][op] == 0]
    return out


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of parallel nvcc jobs, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (parallel nvcc jobs), got {n}")
    return n


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.resources") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 on any spill, compile error or missing instruction "
                                                        "(needs cuobjdump: " + SASS_INSTALL + ")")
    ap.add_argument("--sass-digest", metavar="JSON", type=Path,
                    help="write each variant's sha256 of its `cuobjdump -sass` text to JSON (needs cuobjdump); "
                         "two such files show which variants a source change recompiled differently")
    ap.add_argument("--against", metavar="JSON", type=Path,
                    help="with --sass-digest: compare with an earlier digest and exit 1 where any variant's "
                         "SASS differs, appeared or disappeared")
    ap.add_argument("--jobs", type=_jobs, default=os.cpu_count() or 1, help="parallel nvcc runs (default: one per CPU)")
    args = ap.parse_args(argv)
    if _tool("nvcc") is None:
        print(f"{prog}: nvcc not found on PATH (a CUDA 13 toolkit)", file=sys.stderr)
        return 2
    has_sass = _tool("cuobjdump") is not None
    if args.against is not None and args.sass_digest is None:
        print(f"{prog}: --against compares two digests and needs --sass-digest", file=sys.stderr)
        return 2
    if args.against is not None and not args.against.is_file():
        print(f"{prog}: --against {args.against}: no such file", file=sys.stderr)
        return 2
    if (args.check or args.sass_digest) and not has_sass:
        flag = "--check" if args.check else "--sass-digest"
        print(f"{prog} {flag}: cuobjdump not found, so the SASS cannot be checked: {SASS_INSTALL}", file=sys.stderr)
        return 2
    variants = [(kernel, cfg) for kernel in KERNELS for cfg in kernel.variants()]
    print(f"compiling {len(variants)} variants of {', '.join(k.entry.name for k in KERNELS)} "
          f"for sm_90a ({args.jobs} jobs)", flush=True)
    with tempfile.TemporaryDirectory() as tmp, cf.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda kc: compile_variant(*kc, Path(tmp)), variants))
    head = f"{'variant':34s} {'regs':>4s} {'spill':>5s} {'smem B':>7s} {'thr':>4s} {'CTA/SM':>6s}  " + \
           " ".join(f"{op:>6s}" for op in SASS_OPS)
    print(head)
    bad = 0
    for r in rows:
        if "error" in r:
            print(f"{r['kernel'].label(r['cfg']):34s} COMPILE ERROR")
        else:
            sass = " ".join(f"{(r['sass'] or {}).get(op, '-'):>6}" for op in SASS_OPS)
            print(f"{r['kernel'].label(r['cfg']):34s} {r['regs']:4d} {r['spill']:5d} {r['smem']:7d} {r['threads']:4d} "
                  f"{r['ctas_per_sm']:6d}  {sass}")
        for p in problems(r):
            bad += 1
            print(f"  ! {r['kernel'].label(r['cfg'])}: {p}")
    print(f"{len(rows)} variants, {bad} problems")
    if not has_sass:
        print(f"SASS counts left out: cuobjdump not found ({SASS_INSTALL})")
    failed = bool(args.check and bad)
    if args.sass_digest is not None:
        digest = {r["kernel"].label(r["cfg"]): r.get("sass_sha256") for r in rows}
        units = other_units({k.entry.resolve() for k in KERNELS})
        print(f"compiling the {len(units)} other translation units (probes, studies) for their SASS", flush=True)
        with tempfile.TemporaryDirectory() as tmp, cf.ThreadPoolExecutor(args.jobs) as pool:
            digest.update(zip((str(u.relative_to(REPO)) for u in units),
                              pool.map(lambda u: unit_sass_sha256(u, Path(tmp)), units)))
        args.sass_digest.write_text(json.dumps(digest, indent=1, sort_keys=True) + "\n")
        print(f"SASS digest of {len(digest)} variants written to {args.sass_digest}")
        if args.against is not None:
            changed = compare_digests(json.loads(args.against.read_text()), digest)
            for line in changed:
                print(f"  ! {line}")
            print(f"against {args.against}: {len(changed)} variants differ")
            failed = failed or bool(changed)
    return 1 if failed else 0


REPO = Path(__file__).resolve().parents[2]


def other_units(kernel_sources: set[Path]) -> list[Path]:
    """Every .cu under kernel/ and ptx_lab/ that is not a kernel's entry file: built without options."""
    return sorted(p for base in ("kernel", "ptx_lab") for p in (REPO / base).rglob("*.cu")
                  if p.resolve() not in kernel_sources)


def unit_sass_sha256(unit: Path, workdir: Path) -> str | None:
    """sha256 of one translation unit's `cuobjdump -sass` text (None where it does not compile)."""
    cubin = workdir / (str(unit.relative_to(REPO)).replace("/", "_") + ".cubin")
    if subprocess.run(_nvcc_cmd(unit, (), cubin, "-cubin"), capture_output=True, text=True).returncode:
        return None
    sass = _sass(cubin)
    return hashlib.sha256(sass.stdout.encode()).hexdigest() if sass.returncode == 0 else None


def compare_digests(before: dict, after: dict) -> list[str]:
    """One line per variant whose SASS digest differs between two --sass-digest files (or that only one has)."""
    lines = []
    for name in sorted(set(before) | set(after)):
        if name not in after:
            lines.append(f"{name}: gone")
        elif name not in before:
            lines.append(f"{name}: new")
        elif before[name] != after[name] or before[name] is None:
            lines.append(f"{name}: SASS differs")
    return lines


if __name__ == "__main__":
    sys.exit(main())
