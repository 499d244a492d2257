"""One kernel built from two source trees, timed in one process: does a change cost time?

    ptx-lab source-ab --kernel a --old-rev HEAD~1 --configs 1x131072:2,1x131072,32x8192
    ptx-lab source-ab --kernel s --old-rev HEAD~1 --configs 4x8192,32x8192,1x131072
    ptx-lab source-ab --kernel b --old path/to/old/cuda --configs 4x8192,32x8192
    ptx-lab source-ab --kernel f --old-rev HEAD~1 --configs 32x8192,32x8192:w4
    ptx-lab source-ab --kernel p --old-rev HEAD~1 --configs 1x131072

--kernel names a room: a (Kernel A, the dS scan, kernel/ds_scan/cuda), s (Kernel S, the
forward-state scan, kernel/forward_states/cuda), b (Kernel B, the per-token gradients,
kernel/token_gradients/cuda), f (the forward, kernel/forward/cuda, which also includes Kernel S's
shared headers, forward_states_{chain,copies,gate,walk}.cuh: a header of the room's build outside its directory travels with it, at
its place in the tree) or p (the three-pass forward's products pass, kernel/forward_products/cuda, with the
forward's forward_solve.cuh and forward_l2norm.cuh). --old-rev reads the revision from this checkout's git. Where the GPU
machine has a copy of the working tree without that history, extract the old sources beforehand
and pass the room's cuda directory: ``git archive REV kernel/shapes.cuh kernel/forward_states/cuda
| tar x -C old/`` then ``--old old/kernel/forward_states/cuda`` (for the forward: ``git archive REV
kernel/shapes.cuh kernel/forward/cuda kernel/forward_states/cuda``).

Times from two processes or two days differ by more than the few percent a change is worth, so both
builds run here, one after the other: the working tree's ("new"), the old one, then the working
tree's again. Each is timed --reps calls after one warm-up call by the bench's timer
(kernel.tools.bench.timing.time_cuda; torch), median; the table takes the faster of the two "new"
medians. Each build's outputs after its last call are hashed (sha256 of every output array's bytes;
of the forward's Aqk and Akk, the blocks it writes): the table says whether the old build gave the
new one's bits, and the two new runs each other's (a change meant to keep the arithmetic shows as
"same bits"). Only the room's own sources change (its entry file and the headers beside it, and its
shared headers beside the old tree where they are there); ptx_lab's headers are the working tree's
for both. The old build is the room's build description with its entry file moved
(:func:`use_source`), so it is compiled with the working tree's options and launched by the working
tree's code: an old kernel whose parameter list differs is refused (it would read the new arguments
with the old layout).

Kernel A runs as kernel.kda_backward launches it (FLA's tensors, bf16 dS after every tile, dht),
at the v-split given after the configuration (``1x131072:2``) or the API's choice. Kernel S runs
kernel.forward_states.forward_states at its auto configuration, Kernel B token_gradients.launch as
``kernel.chunk_kda``'s backward calls it on bf16 inputs (the l2norm's backward in its epilogue from q's
and k's rstd, dq and dk rounded to bf16 there). The forward runs kernel.forward.forward in training mode
with the final state (what the bench times as "ours raw"), at its auto configuration or at
kernel.forward.auto_config(warps) for the consumer warps given after the configuration
(``32x8192:w4``). The products pass runs kernel.forward_products.forward_products as ``kernel.chunk_kda``'s
three passes call it on the layer's inputs: each token's gate, q and k as they come (its token-gate and l2norm
build), each row's rstd written and no normalised copies, training (Aqk's and INV's diagonal blocks out). The
inputs are random (unit-norm q and k, gates in [-0.05, 0] a token);
their values do not change the work.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Container, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[2]
D = 128


@dataclasses.dataclass(frozen=True)
class Spec:
    B: int
    T: int
    vsplit: int | str = "auto"   # Kernel A's
    warps: int | str = "auto"    # the forward's consumer warps

    @property
    def name(self) -> str:
        return (f"{self.B}x{self.T}" + ("" if self.vsplit == "auto" else f":{self.vsplit}")
                + ("" if self.warps == "auto" else f":w{self.warps}"))


def parse_spec(text: str, kernel: str) -> Spec:
    """'BxT', 'BxT:vsplit' (Kernel A only) or 'BxT:w<consumer warps>' (the forward only)."""
    shape, sep, suffix = text.strip().partition(":")
    try:
        B, T = (int(x) for x in shape.split("x"))
    except ValueError:
        raise ValueError(f"a configuration is BxT, BxT:vsplit (e.g. 1x131072:2) or BxT:w<warps> (e.g. "
                         f"32x8192:w4), got {text!r}") from None
    if B < 1 or T < 1:
        raise ValueError(f"B and T must be at least 1, got {text!r}")
    if not sep:
        return Spec(B, T)
    if kernel == "f":
        from kernel.forward import WARPS

        if not (suffix[:1] == "w" and suffix[1:].isdigit() and int(suffix[1:]) in WARPS):
            raise ValueError(f"the forward takes :w<consumer warps>, warps one of {WARPS}, got {suffix!r} in {text!r}")
        return Spec(B, T, warps=int(suffix[1:]))
    if kernel != "a":
        raise ValueError(f"only Kernel A takes a v-split (and the forward :w<warps>), got {text!r} for "
                         f"{ROOMS[kernel].title}")
    from kernel.ds_scan import config

    if not suffix.isdigit() or int(suffix) not in config.VSPLITS:
        raise ValueError(f"the v-split must be one of {config.VSPLITS}, got {suffix!r} in {text!r}")
    return Spec(B, T, int(suffix))


@dataclasses.dataclass(frozen=True)
class Room:
    """Where a kernel's build lives: the modules that hold its BUILD, SOURCE_DIR and SOURCE_PATH
    (the first is where they are defined), and the per-process kernel caches to clear."""
    title: str
    holders: tuple[str, ...]
    caches: tuple[str, ...]     # "module:function" (functools.lru_cache)


ROOMS = {"a": Room("Kernel A", ("kernel.ds_scan.config",), ("kernel.ds_scan.launch:kernel",)),
         "s": Room("Kernel S", ("kernel.forward_states.config", "kernel.forward_states.launch"),
                   ("kernel.forward_states.launch:kernel",)),
         "b": Room("Kernel B", ("kernel.token_gradients.launch",), ("kernel.token_gradients.launch:kernel",)),
         "f": Room("the forward", ("kernel.forward.config", "kernel.forward.launch"),
                   ("kernel.forward.launch:kernel",)),
         "p": Room("the products pass", ("kernel.forward_products.config", "kernel.forward_products.launch"),
                   ("kernel.forward_products.launch:kernel",))}


def _holders(kernel: str) -> list:
    return [importlib.import_module(m) for m in ROOMS[kernel].holders]


def source_dir(kernel: str) -> Path:
    """The room's cuda directory in the working tree (or wherever use_source pointed it)."""
    return Path(_holders(kernel)[0].SOURCE_PATH).parent


def _entry_name(kernel: str) -> str:
    return Path(_holders(kernel)[0].SOURCE_PATH).name


def _room(kernel: str) -> Path:
    """The room's cuda directory relative to the repository (the working tree's place, wherever
    use_source points the build)."""
    return Path(_holders(kernel)[0].__file__).resolve().parent.relative_to(REPO) / "cuda"


def shared_headers(kernel: str) -> list[Path]:
    """Repository-relative paths of the files a room's sources include from outside its cuda directory:
    kernel/shapes.cuh, and the headers of its build description that lie elsewhere (the forward's
    ../../forward_states/cuda/forward_states_*.cuh). They go with a copy of the room, at their places."""
    from kernel.runtime.builds import SHAPES_HEADER

    here = source_dir(kernel).resolve()
    root = here.parents[len(_room(kernel).parts) - 1]   # the tree the room's directory sits in
    found = {SHAPES_HEADER.relative_to(REPO)}
    for path in _holders(kernel)[0].BUILD.header_paths():
        if not path.resolve().is_relative_to(here):
            found.add(path.resolve().relative_to(root))
    return sorted(found)


def copy_tree(kernel: str, into: Path) -> Path:
    """The working tree's room and its shared headers copied under `into`, each at its
    repository-relative place; returns the room's cuda directory there (a tree to patch and build)."""
    room = _room(kernel)
    shutil.copytree(REPO / room, into / room)
    for rel in shared_headers(kernel):
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, into / rel)
    return into / room


def old_tree_from_rev(rev: str, kernel: str, into: Path) -> Path:
    """The room's sources at git revision `rev` (git archive), with its shared headers (kernel/shapes.cuh,
    the forward's copy of Kernel S's chain step) where the revision has them, under `into`; returns the
    room's cuda directory there."""
    rel = _room(kernel)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, str(rel)], capture_output=True)
    if archive.returncode != 0:
        raise ValueError(f"git archive {rev} {rel} failed: {archive.stderr.decode().strip() or 'no output'}")
    subprocess.run(["tar", "x", "-C", str(into)], input=archive.stdout, check=True)
    for header in shared_headers(kernel):
        shared = subprocess.run(["git", "-C", str(REPO), "archive", rev, header.as_posix()], capture_output=True)
        if shared.returncode == 0:   # revisions before a shared header have none
            subprocess.run(["tar", "x", "-C", str(into)], input=shared.stdout, check=True)
    return into / rel


def kernel_parameters(source: str) -> list[str]:
    """The parameter list of the ``extern "C" __global__`` function in an entry file's text, each
    parameter with its whitespace collapsed; [] where there is none."""
    head = re.search(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?\w+\s*\(', source)
    if head is None:
        return []
    found = re.match(r"([^)]*)\)", source[head.end():])
    return [] if found is None else [" ".join(p.split()) for p in found.group(1).split(",") if p.strip()]


def check_old(old: Path, kernel: str) -> Path:
    """`old` if it is the room's cuda directory and its kernel takes the working tree's parameters;
    ValueError naming what differs otherwise."""
    entry = _entry_name(kernel)
    if not (old / entry).is_file():
        raise ValueError(f"{old} is not {ROOMS[kernel].title}'s source directory (no {entry} in it)")
    # both builds run under the working tree's launch code: a kernel whose arguments changed would
    # read the new argument list with the old layout (on the GPU: a bad address, or wrong numbers)
    theirs = kernel_parameters((old / entry).read_text())
    ours = kernel_parameters((source_dir(kernel) / entry).read_text())
    if theirs != ours:
        differ = [f"{i}: old {a!r}, new {b!r}" for i, (a, b) in enumerate(zip(theirs, ours)) if a != b]
        if len(theirs) != len(ours):
            differ.append(f"old {len(theirs)} parameters, new {len(ours)}")
        raise ValueError(f"the old {entry}'s kernel takes other arguments than the working tree's, whose "
                         f"launch code times both builds ({'; '.join(differ[:3])}): time the two with "
                         f"their own launch code, e.g. ptx-lab bench on each checkout")
    return old


def use_source(kernel: str, source: Path) -> None:
    """Build the kernel from the cuda directory `source` from now on in this process: its build
    description's entry file, the source directory its options pass to NVRTC, and the kernel caches."""
    holders = _holders(kernel)
    entry = source / _entry_name(kernel)
    build = dataclasses.replace(holders[0].BUILD, entry=entry)
    for mod in holders:
        for name, value in (("BUILD", build), ("SOURCE_DIR", source), ("SOURCE_PATH", entry)):
            if hasattr(mod, name):
                setattr(mod, name, value)
    for where in ROOMS[kernel].caches:
        module, _, function = where.partition(":")
        getattr(importlib.import_module(module), function).cache_clear()


def drawn_inputs(spec: Spec, H: int, seed: int = 0) -> dict:
    """Every kernel's inputs at the spec's B x T and H heads, drawn on the GPU (CuPy; bf16 as bits): q and k unit
    rows, v, do, each token's natural-log gate in [-0.05, 0] (g_token, the token-gate builds') and its 64-chunk
    cumsum in log2 (g, FLA's), beta, Aqk's and Akk's blocks and dht. The values set no branch of the kernels timed
    on them (their gates stay within every tile's span)."""
    import cupy

    from kernel.ds_scan import launch

    B, T = spec.B, spec.T
    rs = cupy.random.RandomState(seed)
    n = lambda *s: rs.standard_normal(s, dtype=np.float32)   # noqa: E731
    unit = lambda x: x / cupy.linalg.norm(x, axis=-1, keepdims=True)   # noqa: E731
    g_token = -0.05 * rs.random_sample((B, -(-T // 64) * 64, H, D), dtype=np.float32)
    g = g_token.reshape(B, -1, 64, H, D).cumsum(axis=2).reshape(B, -1, H, D)[:, :T] / np.float32(np.log(2))
    return dict(q=launch.bf16_bits(unit(n(B, T, H, D))), k=launch.bf16_bits(unit(n(B, T, H, D))),
                v=launch.bf16_bits(n(B, T, H, D)), do=launch.bf16_bits(0.1 * n(B, T, H, D)),
                g=cupy.ascontiguousarray(g), g_token=cupy.ascontiguousarray(g_token[:, :T]),
                beta=rs.random_sample((B, T, H), dtype=np.float32),
                Aqk=launch.bf16_bits(0.01 * n(B, T, H, 64)), Akk=launch.bf16_bits(0.01 * n(B, T, H, 64)),
                dht=0.01 * n(B, H, D, D))


def written_blocks(blocks, xp=np):
    """The entries of the forward's Aqk or Akk [B, T, HV, 64] that it writes, as [T, 16, B, HV]: token t's
    16 columns of its tile within its 64-token chunk. The rest of each row is never written (the memory
    the allocator handed out), so hashing the whole array would see whatever was there before."""
    from kernel.shapes import CHUNK_TOKENS, TILE_TOKENS

    t = xp.arange(blocks.shape[1])
    cols = (TILE_TOKENS * (t % CHUNK_TOKENS // TILE_TOKENS))[:, None] + xp.arange(TILE_TOKENS)[None, :]
    return blocks[:, t[:, None], :, cols]


def _call(kernel: str, spec: Spec, H: int, x: dict):
    """(a function that runs the kernel once on x, a function that returns what the last run wrote);
    Kernel S's and B's outputs are allocated once, outside the run (the forward's by each call, as the
    API does)."""
    import cupy

    if kernel == "f":
        from kernel.forward import auto_config
        from kernel.forward import launch as forward

        config = None if spec.warps == "auto" else auto_config(spec.warps)
        last = {}

        def run():
            last["out"] = forward.forward(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=D ** -0.5,
                                          output_final_state=True, training=True, config=config)

        def written():
            out = last["out"]
            return dict(o=out.o, final_state=out.final_state, states=out.states,
                        Aqk=written_blocks(out.Aqk, cupy), Akk=written_blocks(out.Akk, cupy))
        return run, written
    if kernel == "p":
        from kernel.forward_products import launch as products

        last = {}

        def run():
            last["out"] = products.forward_products(x["q"], x["k"], x["v"], x["g_token"], x["beta"], scale=D ** -0.5,
                                                    training=True, token_gate=True, l2norm=True, norm_copies=False)

        def written():
            out = last["out"]._asdict()
            return {**{n: out[n] for n in (*products.CHUNK_MAJOR, "q_rstd", "k_rstd")},
                    "Aqk": written_blocks(out["Aqk"], cupy), "Akk": written_blocks(out["Akk"], cupy)}
        return run, written
    if kernel == "a":
        scan = kernel_a_call(spec, x)
        last = {}

        def run():
            last["out"] = scan()
        return run, lambda: last["out"]
    if kernel == "s":
        from kernel.forward_states import launch as forward_states

        plan = forward_states.plan_forward_states(x["k"], x["v"], x["g"], x["beta"], x["Akk"])
        states = cupy.empty(plan.states_shape, dtype=np.uint16)
        return (lambda: forward_states.forward_states(x["k"], x["v"], x["g"], x["beta"], x["Akk"], out=states),
                lambda: states)
    return kernel_b_call(spec, H, x)


def kernel_a_call(spec: Spec, x: dict, out: dict | None = None):
    """A function that runs Kernel A once on ``x`` (:func:`drawn_inputs`) in the training step's form (bf16 dS
    after every tile, FLA's inputs, the whole sequence in one scan: no split) and returns its outputs (dS, dh0):
    allocated by each call, or ``out``'s arrays (:func:`kernel_a_outputs`, or views of them of the spec's shapes)
    written in place, so that a timed call allocates nothing."""
    from kernel.ds_scan import launch

    flat = {n: x[n].reshape(1, spec.B * spec.T, *x[n].shape[2:]) for n in ("q", "k", "g", "beta", "Aqk", "Akk", "do")}
    cu = np.arange(spec.B + 1, dtype=np.int64) * spec.T
    return lambda: launch.launch(flat["q"], flat["k"], flat["g"], flat["beta"], flat["Aqk"], flat["Akk"], flat["do"],
                                 scale=D ** -0.5, dht=x["dht"], cu_seqlens=cu, qk_l2norm=False,
                                 snapshot_dtype="bfloat16", snapshot_every=1, fla_inputs=True, vsplit=spec.vsplit,
                                 out=out)


def kernel_a_output_shapes(spec: Spec, H: int) -> dict:
    """The shapes of what :func:`kernel_a_call` writes at the spec's B x T and H heads: dS after every tile (bf16,
    [1, B x tiles a sequence, H, 128, 128]: each sequence's tiles in order) and dh0 (fp32 [B, H, 128, 128])."""
    from kernel.ds_scan import launch

    return launch.output_shapes(1, H, np.arange(spec.B + 1, dtype=np.int64) * spec.T, 1, varlen=True)


def kernel_a_outputs(spec: Spec, H: int) -> dict:
    """Kernel A's outputs (:func:`kernel_a_output_shapes`) allocated once on the GPU, on CuPy's current stream,
    for :func:`kernel_a_call`'s ``out``."""
    import cupy

    dtypes = {"snapshots": np.uint16, "dh0": np.float32}   # bf16 as its bits
    return {name: cupy.empty(shape, dtype=dtypes[name]) for name, shape in kernel_a_output_shapes(spec, H).items()}


def kernel_b_arrays(spec: Spec, H: int) -> dict:
    """What Kernel B reads besides :func:`drawn_inputs` and what it writes, at the spec's B x T and H heads, on the
    GPU: dS after every tile and the states (constants: the values do not change the work), the l2norm's rstd of
    the (already unit) q and k rows, and the outputs (dq and dk in bf16, the training step's form)."""
    import cupy

    from kernel.token_gradients import launch as token_gradients

    B, T = spec.B, spec.T
    t = token_gradients.tables(np.arange(B + 1, dtype=np.int64) * T)
    return {"ds": cupy.full((t["tiles"], H, D, D), 0x3c24, dtype=np.uint16),        # bf16 0.01
            "states": cupy.full((t["chunks"], H, D, D), 0x3ca4, dtype=np.uint16),
            "rstd": tuple(cupy.full((B, T, H), 1.0, dtype=np.float32) for _ in range(2)),
            "out": {"dq": cupy.empty((B, T, H, D), np.uint16), "dk": cupy.empty((B, T, H, D), np.uint16),
                    "dv": cupy.empty((B, T, H, D), np.uint16), "dg": cupy.empty((B, T, H, D), np.float32),
                    "dbeta": cupy.empty((B, T, H), np.float32)}}


def kernel_b_call(spec: Spec, H: int, x: dict, arrays: dict | None = None, **launch_kw):
    """(a function that runs Kernel B once on ``x`` (:func:`drawn_inputs`), a function that returns what the
    last run wrote), in the training step's form: rstd given, dq and dk in bf16; dS and the states constants (the
    values do not change the work); the outputs allocated once. ``arrays``: :func:`kernel_b_arrays`' (default:
    made here), so that calls on parts of a batch can share one set. ``launch_kw``: more keywords of
    ``kernel.token_gradients.launch`` (``timing=True``: kernel.tools.profile's build); the run function takes more
    (``run(run_chunks=4)``), so that several launches share one set of arrays (at 32x8192 dS alone is 17 GB)."""
    from kernel.token_gradients import launch as token_gradients

    a = kernel_b_arrays(spec, H) if arrays is None else arrays
    cu = np.arange(spec.B + 1, dtype=np.int64) * spec.T
    return (lambda **more: token_gradients.launch(x["q"], x["k"], x["v"], x["g"], x["beta"], x["Aqk"], x["Akk"],
                                                  x["do"], a["ds"], a["states"], cu=cu, H=H, HV=H, scale=D ** -0.5,
                                                  out=a["out"], rstd=a["rstd"], **{**launch_kw, **more}),
            lambda: a["out"])


def digest(outputs) -> str:
    """sha256 of every array's bytes in ``outputs`` (an array, or dicts / tuples / lists of them in
    order, dicts by key), with each array's dtype and shape; anything else in it is skipped."""
    import hashlib

    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, dict):
            for key in sorted(x):
                h.update(str(key).encode())
                walk(x[key])
        elif isinstance(x, (tuple, list)):
            for item in x:
                walk(item)
        elif hasattr(x, "dtype") and hasattr(x, "shape"):
            host = x.get() if hasattr(x, "get") else np.asarray(x)   # CuPy to the host; numpy as it is
            h.update(f"{host.dtype}{host.shape}".encode())
            h.update(np.ascontiguousarray(host).tobytes())

    walk(outputs)
    return h.hexdigest()


def median_ms(fn, reps: int) -> float:
    """The bench's timer (kernel.tools.bench.timing.time_cuda: GPU work queued ahead of each call, so
    the events time the GPU and not the call's Python), with CuPy on torch's stream; median ms."""
    from .bench.timing import cupy_on_torch_stream, time_cuda

    with cupy_on_torch_stream():
        return time_cuda(fn, warmup=1, reps=reps)["median_ms"]


def time_sides(kernel: str, spec: Spec, H: int, reps: int, sides: Sequence[tuple[str, Path]],
               on_side: Callable[[dict], None] | None = None, hashed: Container[str] | None = None) -> list[dict]:
    """Each (label, cuda directory) of `sides` in turn, on one set of inputs: built (use_source), run once
    (its first call: the compile, if the build is new to this process), then timed (median ms of `reps`
    calls after a warm-up) and its last outputs hashed if its label is in `hashed` (None: every side;
    the forward's outputs at 32x8192 are 8.6 GB to copy to the host and hash). Returns one row a side,
    in order: label, source, first_call_s, ms, digest (None where not hashed); `on_side` sees each row as
    it is made. The source in place before the call is put back after it."""
    import time

    import cupy

    before = source_dir(kernel)
    x = drawn_inputs(spec, H)
    run, outputs = _call(kernel, spec, H, x)
    rows = []
    try:
        for label, source in sides:
            use_source(kernel, source)
            t0 = time.perf_counter()
            run()
            cupy.cuda.Device().synchronize()
            first = time.perf_counter() - t0
            ms = median_ms(run, reps)
            bits = digest(outputs()) if hashed is None or label in hashed else None
            rows.append(dict(label=label, source=str(source), first_call_s=first, ms=ms, digest=bits))
            if on_side is not None:
                on_side(rows[-1])
    finally:
        use_source(kernel, before)
        del x, run, outputs
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def measure(kernel: str, old: Path, specs: Sequence[Spec], H: int, reps: int) -> list[dict]:
    new = source_dir(kernel)
    rows = []
    for spec in specs:
        sides = time_sides(kernel, spec, H, reps, (("new", new), ("old", old), ("new again", new)))
        ms = {r["label"]: r["ms"] for r in sides}
        bits = {r["label"]: r["digest"] for r in sides}
        after = min(ms["new"], ms["new again"])
        rows.append(dict(config=spec.name, before_ms=ms["old"], after_ms=after, ratio=after / ms["old"],
                         runs_ms=ms, same_bits=bits["old"] == bits["new"], repeats=bits["new again"] == bits["new"]))
        print(f"  {spec.name}: new {ms['new']:.3f} / old {ms['old']:.3f} / new again {ms['new again']:.3f} ms; "
              f"old {'gives the same' if rows[-1]['same_bits'] else 'differs in its'} bits", flush=True)
    return rows


def parse_args(argv: Sequence[str] | None, prog: str):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", choices=tuple(ROOMS), required=True,
                    help="a: Kernel A (the dS scan); s: Kernel S (the forward-state scan); b: Kernel B; "
                         "f: the forward; p: the three-pass forward's products pass")
    old = ap.add_mutually_exclusive_group(required=True)
    old.add_argument("--old", type=Path, help="the old source: the kernel's cuda directory")
    old.add_argument("--old-rev", help="the old source at this git revision (git archive of the kernel's sources)")
    ap.add_argument("--configs", default="4x8192,32x8192,1x131072",
                    help="comma-separated BxT, Kernel A also BxT:vsplit, the forward also BxT:w<consumer warps> "
                         "(default %(default)s)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7, help="timed calls per build and configuration (median)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    try:
        a.specs = [parse_spec(c, a.kernel) for c in a.configs.split(",") if c.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if not a.specs:
        ap.error("--configs names no configuration")
    if a.heads < 1 or a.reps < 1:
        ap.error("--heads and --reps must be at least 1")
    return a


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.source_ab") -> int:
    a = parse_args(argv, prog)
    from ptx_lab.gpu import gpu_reason

    reason = gpu_reason()
    if reason is not None:
        print(f"source-ab times kernels on a GPU: {reason}", file=sys.stderr)
        return 2
    try:
        import torch   # noqa: F401  (the bench's timer: torch's events and its GPU-ahead sleep)
    except ImportError:
        print("source-ab times with the bench's timer, which needs torch (pip install -e '.[torch]')",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="source-ab-") as tmp:
        try:
            old = check_old(old_tree_from_rev(a.old_rev, a.kernel, Path(tmp)) if a.old_rev else a.old.resolve(),
                            a.kernel)
        except ValueError as exc:
            print(f"source-ab: {exc}", file=sys.stderr)
            return 2
        label = a.old_rev or str(a.old)
        print(f"source-ab: {ROOMS[a.kernel].title}, the working tree against {label}, H = {a.heads}, "
              f"median of {a.reps} (new, old, new)", flush=True)
        rows = measure(a.kernel, old, a.specs, a.heads, a.reps)
    print(f"\n| config | before ({label}) ms | after ms | after / before | outputs |\n|---|---:|---:|---:|---|")
    for r in rows:
        bits = "same bits" if r["same_bits"] else "differ"
        if not r["repeats"]:
            bits += "; the new build's two runs differ"
        print(f"| {r['config']} | {r['before_ms']:.3f} | {r['after_ms']:.3f} | {r['ratio']:.3f} | {bits} |")
    if a.json:
        a.json.write_text(json.dumps(dict(kernel=a.kernel, old=label, heads=a.heads, reps=a.reps, rows=rows), indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
