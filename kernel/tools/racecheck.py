"""compute-sanitizer racecheck on every kernel of kernel.registry, with probes that calibrate the tool.

    ptx-lab racecheck                    # needs a GPU and compute-sanitizer on PATH
    ptx-lab racecheck --tool memcheck    # the kernels' workloads under memcheck

(also ``python -m kernel.tools.racecheck``.)

Kernel A hands shared-memory stages between warps with named barriers:
the writer does `bar.arrive`, the reader `bar.sync` on the same id (PTX: the
barrier orders the arriving threads' earlier memory accesses before the
accesses that follow the waiting threads' bar.sync). Whether racecheck models
that hand-off decides how to read its report, so this tool runs one-CTA probes
with known answers before the kernels. They are racecheck_probes.cu's (beside this
file; PROBES lists each with its threads and answer), and their rings are ptx_lab's
own: ring.cuh's BarrierRing, cp_async.cuh's copies, ldmatrix.cuh's and wgmma.cuh's reads:

    ring-arrive     a 2-stage producer/consumer ring exactly like Kernel A's
                    (FULL: producer arrives, consumer syncs; EMPTY: the other
                    way round). Race-free by construction.
    ring-arrive-exit  the same ring, but the consumer spins ~1 ms before its
                    last bar.sync, so the producer has exited by then (what a
                    short sequence does in Kernel A). Race-free by PTX rules.
    ring2-arrive    the ring with two producer warps, each writing half of a stage, and one
                    consumer warp reading the whole stage. Race-free.
    ring2-producer-bar  the same, the producer warps first meeting on a producers-only barrier
                    every tile (as Kernel A's producers do before R1). Race-free.
    ring-cp-async   the ring with its stages filled by cp.async in Kernel A's order
                    (a tile's copy issued after the previous FULL arrive, waited for
                    before its own). Race-free: a report means racecheck does not order
                    cp.async writes by the hand-off (Kernel A, its FLA-input build and
                    the forward-state scan report such hazards once a sequence is longer
                    than their rings, log 28).
    ring2-cp-async-ldmatrix  the same with two producer warps, each copying half of a stage,
                    and the consumer reading the whole stage with ldmatrix (as Kernel A's
                    consumers read the words several producer warps copied). Race-free.
    ring2-consumer-bar  one cp.async producer warp and two consumer warps that meet on a
                    consumers-only barrier before they read the stage with ldmatrix (as
                    Kernel A's two warps of a band do before G3's INV read). Race-free: a
                    report here, beside ring2-producer-bar's, says racecheck misorders a
                    hand-off whenever a barrier of a subset of the threads lies between.
    kernel-a-ring   Kernel A's ring without its math: 4 stages, copies 3 tiles ahead, 16-byte
                    cp.async.cg in the zero-fill form by 4 producer warps, 4 consumer warps
                    reading by ldmatrix .trans, FULL/EMPTY counting all 256 threads, 13 tiles.
                    Race-free: hazards here, and none in the probes above, would put Kernel A's
                    reports on this shape.
    kernel-a-ring-6  the same ring 6 stages deep (FULL and EMPTY take barrier ids 1-12, as the
                    forward-state scan's 6-stage ring does). Race-free.
    kernel-a-ring-1c  the 4-stage ring with one consumer warp against the four producer warps
                    (32 threads arrive on EMPTY and sync on FULL, 128 do the other), as in the
                    forward-state scan's one-consumer-warp build. Race-free: it differs from
                    kernel-a-ring only in the consumer count, so hazards here and none there are
                    racecheck's reading of that hand-off, not a race.
    kernel-a-ring-fence  the same with the producers' fence.proxy.async before each FULL arrive
                    (Kernel A's R1 ends with one in its warpgroup-MMA builds). Race-free.
    kernel-a-ring-wgmma  the fence, and the consumers also reading each stage through the async
                    proxy (an m64n16k16 whose B is the stage), waited for before EMPTY, as Kernel
                    A's G4/G5 read qd and kd. Race-free. kernel-a-ring is clean where Kernel A is
                    not (log 31): these two are what it lacks.
    kernel-a-ring-wgmma-own-a  the same, the MMA's A from registers of its own, not from the
                    ldmatrix that read the stage. Race-free.
    kernel-a-ring-wgmma-release-fence  kernel-a-ring-wgmma with a fence.proxy.async after the MMA's
                    wait, before EMPTY. Race-free. Which of the three reports hazards says whether
                    racecheck ties them to the async read of the stage, and whether the fence ends them.
    mbarrier-ring   kernel-a-ring's copies and reads handed over by ring.cuh's MbarrierRing (the
                    forward-state scan's shape on mbarriers): every producer thread arrives on FULL, every consumer
                    thread on EMPTY, waits by parity. Race-free: a clean run here, beside the
                    named-barrier probes' reports, says racecheck follows mbarrier hand-offs.
    mbarrier-ring-6-1c  the same, 6 stages and one consumer warp (the scan's one-warp build).
                    Race-free.
    mbarrier-ring-early-release  mbarrier-ring with the consumers releasing a stage before they
                    read it: the producers may refill it under the read. A real race, which the
                    tool must report for a clean mbarrier-ring to mean anything.
    ring-syncthreads  the same data flow ordered by __syncthreads. Race-free.
    no-empty        one buffer, a FULL hand-off per iteration (its own barrier
                    id) and no EMPTY: the producer really overwrites words the
                    consumer may not have read yet. A race.

then each kernel of kernel.registry.KERNELS by its workload (WORKLOADS, keyed by the
kernel's function name; a registry kernel without one is reported, and the exit status
is 1). Each run is a child process under `compute-sanitizer --tool racecheck`; the table
at the end gives the hazards per run.

The run kernel-a checks Kernel A alone on a small varlen case (lengths 1, 17, 200; H 2; v-split 2;
KDA_RACECHECK_LENGTHS / _VSPLIT / _TUNING change it): the 200-token sequence walks 13
tiles, so every stage of the ring (at most 4) is refilled after an EMPTY hand-off, which
kernel.tools.check's 40 tokens (3 tiles) never reach. Built with
-lineinfo so each hazard names its source line.

The runs forward-states and kernel-b check the whole backward's other two kernels on lengths
1, 17, 200 and 700 (H 2), two of whose tiles decay channels past fp32's range (Kernel B's
pairwise path): kernel-b runs one kda_backward with compute-sanitizer told to check
only Kernel B; forward-states runs the forward-state scan alone, built with -lineinfo, in
kda_backward's configuration for that case (KDA_RACECHECK_TUNING sets its Config fields, e.g.
{"producers": 1}).

The run forward checks the one-pass forward on the same case in its checking build, every hand-off on an
mbarrier (KDA_RACECHECK_TUNING='{"mbarrier_ring": false}' for the named-barrier build, on which racecheck
misorders the product warps' hand-offs as the probes above show). The runs forward-products, forward-chain and
forward-output each launch all three passes and check their own kernel.

The run row-rstd checks the rstd pass on q and k of 2 x 77 tokens of 3 heads: a step of its rows holds rows of
both tensors, and its last one reaches past their end.

With --tool memcheck the same workloads run under `compute-sanitizer --tool memcheck` instead: each
distinct workload once (memcheck_runs: the three passes' three runs are one launch) and every kernel its
child launches checked, not only the run's own (kernel-b's child is a whole kda_backward: Kernel S, Kernel A
and Kernel B). Host API return codes are not reported: torch and CuPy probe the driver with
cuGetProcAddress calls that fail by design. The exit status is 1 on any memory error.

KDA_RACECHECK_TOKEN_GATE=1 runs the token-gate builds instead (each token's gate summed in R1 across a
producers' barrier, kernel.shapes.tile_gate_sums): the forward's, Kernel A's on FLA's tensors (the
backward's case), Kernel B's (its kda_backward on the states of the forward-state scan) and the products
pass's (each channel's sums over its chunk).

KDA_RACECHECK_QK_RAW=1 runs kernel-b's qk_rstd build instead: the backward (kernel.kda_backward.run with
qk_raw) on the raw q and k rows with their rstd and the forward-state scan's states, so that Kernel B stages
each tile's rstd rows and R1 writes the normalised rows back over the stage (with KDA_RACECHECK_TOKEN_GATE=1,
on each token's gate); and the forward's qk_rstd build (each producer warp copies its rows' rstd with the tile,
the pairwise products read them across warps).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable, Sequence

from ptx_lab.processes import run_tree

from kernel.registry import KERNELS
from kernel.runtime.builds import KernelBuild

PROBES_CU = Path(__file__).with_name("racecheck_probes.cu")
PROBE_TILES = 8   # the tiles of the small rings (racecheck_probes.cu's ITERS)


@dataclasses.dataclass(frozen=True)
class Source:
    """A ``__device__ float [tiles][words]`` array of racecheck_probes.cu that a probe's cp.async
    copies its stages from; the tool fills word w of tile i with i * period + w % period."""
    array: str
    tiles: int
    words: int
    period: int = 32


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe: the ``extern "C" __global__ void <name with _ for ->(float* out)`` of
    racecheck_probes.cu, launched as one CTA of ``threads``."""
    name: str
    threads: int
    lane0: int | None                  # out[0] when the hand-off works; None: the read has no exact value
    expected: str = "race-free"        # the answer by construction
    source: Source | None = None       # where its stages are copied from, if they are

    @property
    def function(self) -> str:
        return self.name.replace("-", "_")


RING_SRC = Source("ring_cp_async_src", PROBE_TILES, 32)
RING2_SRC = Source("ring2_cp_async_src", PROBE_TILES, 64)
KERNEL_A_RING_SRC = Source("kernel_a_ring_src", 13, 128, period=128)
# lane 0 reads lane 31's word of every tile, or words 0 and 32 in the 64-word rings read by ldmatrix
ONE_WORD = sum(i * 32 + 31 for i in range(PROBE_TILES))
TWO_WORDS = sum(2 * i * 32 for i in range(PROBE_TILES))

PROBES: tuple[Probe, ...] = (   # in the order they run
    Probe("ring-arrive", 64, ONE_WORD),
    Probe("ring-arrive-exit", 64, ONE_WORD),
    Probe("ring2-arrive", 96, ONE_WORD),
    Probe("ring2-producer-bar", 96, ONE_WORD),
    Probe("ring-cp-async", 64, ONE_WORD, source=RING_SRC),
    Probe("ring2-cp-async-ldmatrix", 96, TWO_WORDS, source=RING2_SRC),
    Probe("ring2-consumer-bar", 96, TWO_WORDS, source=RING2_SRC),
    # the .trans read moves halves of words: no exact value
    Probe("kernel-a-ring", 256, None, source=KERNEL_A_RING_SRC),
    Probe("kernel-a-ring-6", 256, None, source=KERNEL_A_RING_SRC),
    Probe("kernel-a-ring-1c", 160, None, source=KERNEL_A_RING_SRC),
    Probe("kernel-a-ring-fence", 256, None, source=KERNEL_A_RING_SRC),
    Probe("kernel-a-ring-wgmma", 256, None, source=KERNEL_A_RING_SRC),
    Probe("kernel-a-ring-wgmma-own-a", 256, None, source=KERNEL_A_RING_SRC),
    Probe("kernel-a-ring-wgmma-release-fence", 256, None, source=KERNEL_A_RING_SRC),
    Probe("mbarrier-ring", 256, None, source=KERNEL_A_RING_SRC),
    Probe("mbarrier-ring-6-1c", 160, None, source=KERNEL_A_RING_SRC),
    Probe("mbarrier-ring-early-release", 256, None, expected="a real race", source=KERNEL_A_RING_SRC),
    Probe("ring-syncthreads", 64, ONE_WORD),
    Probe("no-empty", 64, ONE_WORD, expected="a real race"),
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """How racecheck runs one kernel of kernel.registry.KERNELS."""
    run: str                      # the run's name: its table row, --runs and --child
    launch: Callable[[], str]     # runs the kernel once in the child process; returns the line to print
    only_this_kernel: bool = True   # compute-sanitizer checks only this kernel's launches (--kernel-name)


# Kernel A's case: a short, a partial and a long sequence; the long one walks more tiles than the
# ring has stages, so that racecheck sees the EMPTY hand-offs (a sequence of at most nstage tiles has none)
KERNEL_A_LENGTHS = (1, 17, 200)
# the whole backward's other two kernels' case: ragged sequences, the longest 11 chunks of 64 tokens,
# so each kernel's ring of stages turns over several times
BACKWARD_LENGTHS = (1, 17, 200, 700)


def _token_gate() -> bool:
    """Whether the runs take the token-gate builds (KDA_RACECHECK_TOKEN_GATE=1)."""
    import os

    return os.environ.get("KDA_RACECHECK_TOKEN_GATE", "0") == "1"


def _qk_raw() -> bool:
    """Whether kernel-b takes Kernel B's qk_rstd build on the raw q and k, and the forward its qk_rstd build
    (KDA_RACECHECK_QK_RAW=1)."""
    import os

    return os.environ.get("KDA_RACECHECK_QK_RAW", "0") == "1"


def _kernel_a() -> str:
    """Kernel A on kernel.tools.check's small case with KERNEL_A_LENGTHS, built with -lineinfo; the token-gate
    build on the backward's case (FLA's tensors, each token's gate)."""
    import json
    import os

    import cupy as cp

    from kernel.ds_scan.launch import dstate_scan

    from . import check

    if _token_gate():
        import numpy as np

        from kernel.ds_scan.launch import bf16_bits, launch

        raw, f = _fla_case()
        dev = cp.asarray
        snaps, dh0 = launch(dev(bf16_bits(f.q)), dev(bf16_bits(f.k)), dev(raw["g"].astype(np.float32)),
                            dev(raw["beta"].astype(np.float32)), dev(bf16_bits(f.Aqk)), dev(bf16_bits(f.Akk)),
                            dev(bf16_bits(raw["do"])), dht=dev(raw["dht"].astype(np.float32)),
                            cu_seqlens=raw["cu_seqlens"], qk_l2norm=False, snapshot_dtype="bfloat16",
                            snapshot_every=1, tuning={"lineinfo": True}, fla_inputs=True, token_gate=True)
        cp.cuda.Device().synchronize()
        return f"token gate: dh0 finite {bool(cp.isfinite(dh0).all())}"

    # kernel.tools.check's small case with KERNEL_A_LENGTHS, its inputs and all; the environment
    # can change the lengths, the v-split and config.Config knobs.
    case = dataclasses.replace(
        check.SMALL,
        lengths=tuple(json.loads(os.environ.get("KDA_RACECHECK_LENGTHS", json.dumps(KERNEL_A_LENGTHS)))),
        vsplit=int(os.environ.get("KDA_RACECHECK_VSPLIT", check.SMALL.vsplit)))
    tuning = {"lineinfo": True, **json.loads(os.environ.get("KDA_RACECHECK_TUNING", "{}"))}
    x, _ = check.inputs(case)
    snaps, dh0 = dstate_scan(x["q"], x["k"], x["gc"], x["beta"], x["mqk"], x["inv"], x["do"], dht=x["dht"],
                             cu_seqlens=x["cu_seqlens"], vsplit=case.vsplit, tuning=tuning)
    cp.cuda.Device().synchronize()
    return f"dh0 finite {bool(cp.isfinite(dh0).all())}"


def _fla_case():
    """(random inputs, their FLA forward tensors) of BACKWARD_LENGTHS, H = 2, from the float64
    emulation of FLA's forward."""
    import numpy as np

    from kernel.reference import random_inputs
    from kernel.reference.fla_layout import fla_forward_tensors

    raw = random_inputs(1, sum(BACKWARD_LENGTHS), 2, lengths=list(BACKWARD_LENGTHS), seed=0, with_dht=True)
    # two tiles whose gates decay channels past fp32's range, so that Kernel B's pairwise path runs too:
    # one channel of the 200-token sequence's tile 2, every channel of the 700-token one's tile 5
    bos = np.concatenate([[0], np.cumsum(BACKWARD_LENGTHS)])
    raw["g"][0, bos[2] + 32:bos[2] + 48, 1, 3] = -9.0
    raw["g"][0, bos[3] + 80:bos[3] + 96, 0, :] = -9.0
    return raw, fla_forward_tensors(raw["q"], raw["k"], raw["g"], raw["beta"], cu_seqlens=raw["cu_seqlens"])


def _forward_states() -> str:
    """The forward-state scan alone, in kda_backward's configuration for the case, built with -lineinfo."""
    import json
    import os

    import cupy as cp
    import numpy as np

    from kernel.ds_scan.launch import bf16_bits
    from kernel.forward_states import auto_config, choose_warps, forward_states
    from kernel.runtime import builds

    raw, f = _fla_case()
    cu = raw["cu_seqlens"]
    # KDA_RACECHECK_TUNING (JSON) overrides Config fields, e.g. {"nstage": 4, "warps": 8}
    cfg = dataclasses.replace(auto_config(choose_warps((cu.size - 1) * raw["q"].shape[2], builds.sm_count())),
                              lineinfo=True, **json.loads(os.environ.get("KDA_RACECHECK_TUNING", "{}")))
    states = forward_states(cp.asarray(bf16_bits(f.k)), cp.asarray(bf16_bits(raw["v"])),
                            cp.asarray(f.g64.astype(np.float32)), cp.asarray(raw["beta"].astype(np.float32)),
                            cp.asarray(bf16_bits(f.Akk)), cu_seqlens=cu, config=cfg)
    cp.cuda.Device().synchronize()
    return f"configuration {cfg.name()}, {states.shape[1]} state entries"


def _kernel_b() -> str:
    """One whole kda_backward: compute-sanitizer is told to check only Kernel B. With KDA_RACECHECK_QK_RAW=1, its
    run(qk_raw=True) on the raw q and k rows with their rstd (Kernel B's qk_rstd build)."""
    import cupy as cp
    import numpy as np

    from kernel.ds_scan.launch import bf16_bits
    from kernel.kda_backward import checked_batch, kda_backward, run

    raw, f = _fla_case()
    dev = cp.asarray
    beta = dev(raw["beta"].astype(np.float32))
    g, states, token_gate, qk_raw = dev(f.g64.astype(np.float32)), None, _token_gate(), _qk_raw()
    if token_gate or qk_raw:   # the states from the forward-state scan (which reads the cumsum and normalised k)
        from kernel.forward_states import forward_states

        states = forward_states(dev(bf16_bits(f.k)), dev(bf16_bits(raw["v"])), g, beta, dev(bf16_bits(f.Akk)),
                                cu_seqlens=raw["cu_seqlens"])
    if token_gate:   # each token's gate
        g = dev(raw["g"].astype(np.float32))
    rest = (dev(bf16_bits(raw["v"])), g, beta, dev(bf16_bits(f.Aqk)), dev(bf16_bits(f.Akk)), dev(bf16_bits(raw["do"])))
    dht = dev(raw["dht"].astype(np.float32))
    if qk_raw:   # the rows before the l2norm, and their rstd as FLA's l2norm_fwd forms it (fp32)
        from kernel.ds_scan.launch import bits_to_f32
        from kernel.reference.checks import l2norm_rstd

        q, k = (bf16_bits(raw[n]) for n in ("q", "k"))
        rows = (bits_to_f32(x) for x in (q, k))
        rstd = tuple(dev(l2norm_rstd(np, x)) for x in rows)   # fp32 rows: fp32 arithmetic
        B, T, H = q.shape[:3]
        batch = checked_batch(B, T, H, raw["cu_seqlens"], scale=128 ** -0.5, torch_out=False)
        out = run(batch, dev(q), dev(k), *rest, dht=dht, states=states, rstd=rstd, token_gate=token_gate, qk_raw=True)
    else:
        out = kda_backward(dev(bf16_bits(f.q)), dev(bf16_bits(f.k)), *rest, dht=dht, cu_seqlens=raw["cu_seqlens"],
                           states=states, token_gate=token_gate)
    cp.cuda.Device().synchronize()
    return (f"{'token gate: ' if token_gate else ''}{'raw q and k: ' if qk_raw else ''}"
            f"dq finite {bool(cp.isfinite(out['dq']).all())}")


def _forward() -> str:
    """The forward in training mode (every output written) on the backward's case, with its two tiles
    past fp32's range (the pairwise Mqk and Akk), in its auto configuration's checking build (every hand-off
    on an mbarrier) built with -lineinfo."""
    import json
    import os

    import cupy as cp
    import numpy as np

    from kernel.ds_scan.launch import bf16_bits
    from kernel.forward import auto_config, forward
    from kernel.reference.checks import l2norm_rstd
    from kernel.forward_states import choose_warps
    from kernel.runtime import builds

    raw, f = _fla_case()
    cu = raw["cu_seqlens"]
    # The checking build (mbarrier_ring) by default: its hand-offs are all on mbarriers, which racecheck follows.
    # This case's configuration has product warps, and on their named barriers racecheck reports their INV against
    # the consumers' reads of it (200 reports of that one shape, and a run past SANITIZER_TIMEOUT_S, docs/log/61 and
    # 68): named-barrier hand-offs are what the probes above show racecheck misorders, so the checking build is the
    # one whose answer counts. KDA_RACECHECK_TUNING (JSON) overrides Config fields, e.g. {"nstage": 3, "warps": 4},
    # {"mbarrier_ring": false} for the named-barrier build, or {"l2norm": true} (q and k normalised again in R1,
    # which leaves them as they are but for rounding, and written out).
    # KDA_RACECHECK_QK_RAW=1: the qk_rstd build, given each (already unit) row's rstd, which each producer warp
    # copies for its own rows and the pairwise products read across warps
    token_gate, qk_raw = _token_gate(), _qk_raw()
    tuning = {"mbarrier_ring": True, **json.loads(os.environ.get("KDA_RACECHECK_TUNING", "{}"))}
    cfg = dataclasses.replace(auto_config(choose_warps((cu.size - 1) * raw["q"].shape[2], builds.sm_count())),
                              lineinfo=True, token_gate=token_gate, qk_rstd=qk_raw, **tuning)
    g = raw["g"] if token_gate else f.g64   # each token's gate, or FLA's cumsum
    q, k = (cp.asarray(bf16_bits(x)) for x in (f.q, f.k))
    rstd = None
    if cfg.qk_rstd:
        rstd = tuple(cp.asarray(l2norm_rstd(np, x.astype(np.float64)).astype(np.float32)) for x in (f.q, f.k))
    out = forward(q, k, cp.asarray(bf16_bits(raw["v"])), cp.asarray(g.astype(np.float32)),
                  cp.asarray(raw["beta"].astype(np.float32)), cu_seqlens=cu, output_final_state=True, training=True,
                  token_gate=token_gate, l2norm=cfg.l2norm, rstd=rstd, config=cfg)
    cp.cuda.Device().synchronize()
    return f"configuration {cfg.name()}, final state finite {bool(cp.isfinite(out.final_state).all())}"


def _three_passes() -> str:
    """The three-pass forward on the backward's case, its two tiles past fp32's range included (the
    products pass's pairwise blocks): the products pass, the chain on its outputs, the o pass on the
    chain's, each built with -lineinfo. Each pass's run checks only its own kernel. The products pass takes
    its token-gate build with KDA_RACECHECK_TOKEN_GATE=1 and its l2norm build where KDA_RACECHECK_TUNING
    says {"l2norm": true} (q and k normalised again, and written out)."""
    import json
    import os

    import cupy as cp
    import numpy as np

    from kernel import forward_chain, forward_output, forward_products
    from kernel.ds_scan.launch import bf16_bits
    from kernel.runtime.arrays import bits_to_f32

    raw, f = _fla_case()
    cu = raw["cu_seqlens"]
    token_gate = _token_gate()
    l2norm = bool(json.loads(os.environ.get("KDA_RACECHECK_TUNING", "{}")).get("l2norm", False))
    g = raw["g"] if token_gate else f.g64   # each token's gate, or FLA's cumsum
    p = forward_products.forward_products(cp.asarray(bf16_bits(f.q)), cp.asarray(bf16_bits(f.k)),
                                          cp.asarray(bf16_bits(raw["v"])), cp.asarray(g.astype(np.float32)),
                                          cp.asarray(raw["beta"].astype(np.float32)), cu_seqlens=cu, training=True,
                                          token_gate=token_gate, l2norm=l2norm,
                                          config=forward_products.Config(token_gate=token_gate, l2norm=l2norm,
                                                                         lineinfo=True))
    walked = forward_chain.forward_chain(p.w, p.u, p.kg, p.decay, p.u_scale, cu_chunks=p.cu_chunks,
                                         config=forward_chain.Config(lineinfo=True))
    o = forward_output.forward_output(p.qg, walked.states, p.aqk, p.aqk_lo, walked.v_new, cu_seqlens=cu,
                                      config=forward_output.Config(lineinfo=True))
    cp.cuda.Device().synchronize()
    return f"o finite {bool(cp.isfinite(bits_to_f32(o)).all())}, final state finite " \
           f"{bool(cp.isfinite(walked.final_state).all())}"


def _row_rstd() -> str:
    """The rstd pass, built with -lineinfo, on q and k of 2 x 77 rows of 3 heads, which no step of the pass
    divides: one step holds rows of both tensors, the last rows past their end. It shares nothing between
    threads (no shared memory; each row's sum meets in shuffles), and racecheck is to say so."""
    import cupy as cp
    import numpy as np

    from kernel import row_rstd
    from kernel.runtime.arrays import bf16_bits

    rng = np.random.default_rng(0)
    q, k = (cp.asarray(bf16_bits(rng.standard_normal((2, 77, 3, 128)))) for _ in range(2))
    q_rstd, k_rstd = row_rstd.row_rstd(q, k, config=row_rstd.Config(lineinfo=True))
    cp.cuda.Device().synchronize()
    finite = bool(cp.isfinite(q_rstd).all() and cp.isfinite(k_rstd).all())
    return f"{q_rstd.size} rows of q and of k, rstd finite {finite}"


# Each kernel of kernel.registry.KERNELS by its function's name (KernelBuild.function): its run.
# A registry kernel missing here is reported by every run of the tool and fails
# tests/kernel/tools/test_racecheck.py. Kernel A's run checks every kernel its child launches.
WORKLOADS: dict[str, Workload] = {
    "kda_dstate_scan": Workload("kernel-a", _kernel_a, only_this_kernel=False),
    "kda_forward_states": Workload("forward-states", _forward_states),
    "kda_token_gradients": Workload("kernel-b", _kernel_b),
    "kda_forward": Workload("forward", _forward),
    "kda_forward_products": Workload("forward-products", _three_passes),
    "kda_forward_chain": Workload("forward-chain", _three_passes),
    "kda_forward_output": Workload("forward-output", _three_passes),
    "kda_row_rstd": Workload("row-rstd", _row_rstd),
}


def kernel_runs() -> list[tuple[KernelBuild, Workload]]:
    """The registry's kernels that have a workload, in the registry's order, each with it."""
    return [(k, WORKLOADS[k.function]) for k in KERNELS if k.function in WORKLOADS]


def without_workload() -> list[KernelBuild]:
    """The registry's kernels that racecheck has no workload for."""
    return [k for k in KERNELS if k.function not in WORKLOADS]


def runs() -> tuple[str, ...]:
    """Every run's name, in the order they run: the probes, then the registry's kernels."""
    return tuple(p.name for p in PROBES) + tuple(w.run for _, w in kernel_runs())


def expected(run: str) -> str:
    """A run's answer by construction: a probe's, or "?" for a kernel."""
    return next((p.expected for p in PROBES if p.name == run), "?")


def sanitizer_command(sanitizer: str, run: str, tool: str = "racecheck") -> list[str]:
    """compute-sanitizer's ``tool`` over this module's child process for one run. racecheck: every hazard
    reported, only the run's own kernel where its child launches others; memcheck: every kernel the child
    launches, exit status 1 on an error, host API return codes not reported (module docstring)."""
    if tool == "memcheck":
        cmd = [sanitizer, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "1"]
    else:
        cmd = [sanitizer, "--tool", "racecheck", "--racecheck-report", "all", "--print-limit", "200"]
        kernel = next((k for k, w in kernel_runs() if w.run == run and w.only_this_kernel), None)
        if kernel is not None:
            cmd += ["--kernel-name", f"kns={kernel.function}"]
    return cmd + [sys.executable, "-m", "kernel.tools.racecheck", "--child", run]


def memcheck_runs() -> tuple[str, ...]:
    """The kernels' runs for memcheck, in the registry's order: one a distinct workload (a run whose launch an
    earlier run already makes is left out), since memcheck checks every kernel a child launches."""
    seen, names = set(), []
    for _, workload in kernel_runs():
        if workload.launch not in seen:
            seen.add(workload.launch)
            names.append(workload.run)
    return tuple(names)


def checked_by(run: str) -> list[str]:
    """The registry's kernels whose workload is the run's: what memcheck checks in it at least (a child may
    launch more, as kernel-b's whole backward does)."""
    launch = next(w.launch for _, w in kernel_runs() if w.run == run)
    return [k.function for k, w in kernel_runs() if w.launch is launch]


def _child(run: str) -> None:
    probe = next((p for p in PROBES if p.name == run), None)
    if probe is None:
        workload = next(w for _, w in kernel_runs() if w.run == run)
        print(f"{run}: {workload.launch()}")
        return
    import cupy as cp

    from ptx_lab.gpu import load_module

    mod = load_module(PROBES_CU.read_text())
    if probe.source is not None:
        src = probe.source
        tiles = cp.ndarray((src.tiles, src.words), dtype=cp.float32, memptr=mod.get_global(src.array))
        tiles[...] = cp.arange(src.tiles, dtype=cp.float32)[:, None] * src.period + cp.arange(src.words) % src.period
    out = cp.zeros(32, dtype=cp.float32)
    mod.get_function(probe.function)((1,), (probe.threads,), (out,))
    cp.cuda.Device().synchronize()
    lane0 = float(out[0].get())
    if probe.lane0 is None:
        print(f"{run}: lane 0 sum {lane0:.3g} (finite: {bool(cp.isfinite(out).all())})")
    else:
        print(f"{run}: lane 0 sum {lane0:.0f} (race-free value {probe.lane0:.0f})")


SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
# one displayed hazard: its kind, then its two accesses, each "<Read|Write> Thread (x,y,z) at FUNCTION+0xOFFSET"
# and, in a -lineinfo build, " in FILE:LINE". NVRTC names the entry file by a hash (HASH.cubin.cu), and
# its text is the .cu file after one line of header digest (each kernel module's source()): that LINE is
# shown as "entry .cu:LINE - 1". An inlined function's access names the function's own line.
HAZARD = re.compile(r"Potential (\w+) hazard detected at __shared__ 0x[0-9a-f]+ in block[^\n]*\n"
                    r"(?:=+\s+(?:Read|Write) Thread[^\n]*\n?){2}")
ACCESS = re.compile(r"(Read|Write) Thread \((\d+),(\d+),(\d+)\) at (.+?)\+0x[0-9a-f]+(?: in (\S+))?\s*$", re.M)


def hazard_shapes(text: str) -> list[tuple[str, int, str]]:
    """The displayed hazards grouped by shape, most frequent first: (shape, count, warps). A shape
    is the kind and the two accesses' direction, function (without its argument list) and source
    line where the build has one; warps lists the warps (threadIdx.x / 32) on each side."""
    shapes: dict[str, list] = {}
    for m in HAZARD.finditer(text):
        accesses = ACCESS.findall(m.group(0))
        if len(accesses) != 2:
            continue
        sides = []
        for direction, x, _, _, function, where in accesses:
            name = function.split("(")[0]
            sides.append((f"{direction} {name}" + (f" {_where(where)}" if where else ""), int(x) // 32))
        shape = f"{m.group(1)}: {sides[0][0]} -> {sides[1][0]}"
        entry = shapes.setdefault(shape, [0, set(), set()])
        entry[0] += 1
        entry[1].add(sides[0][1])
        entry[2].add(sides[1][1])
    ranked = sorted(shapes.items(), key=lambda kv: -kv[1][0])
    return [(shape, n, f"warps {_span(a)} -> {_span(b)}") for shape, (n, a, b) in ranked]


def _where(where: str) -> str:
    entry = re.fullmatch(r"(?:.*/)?[0-9a-f]{40}\.cubin\.cu:(\d+)", where)
    return f"entry .cu:{int(entry.group(1)) - 1}" if entry else where.split("/")[-1]


def _span(warps: set) -> str:
    w = sorted(warps)
    return str(w[0]) if len(w) == 1 else ",".join(map(str, w)) if len(w) <= 4 else f"{w[0]}..{w[-1]} ({len(w)})"


MAX_SHAPES = 6   # hazard shapes printed per run (the log has them all)


SANITIZER_TIMEOUT_S = 240   # a run's limit; past it the workload compute-sanitizer started dies with it
MEMCHECK_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")


def _run_each(tool: str, runs: Sequence[str], log_dir: Path, row: Callable[[str, str, int, bool], tuple]):
    """Each run under compute-sanitizer's ``tool``, its output in log_dir/TOOL-RUN.log (a run past
    SANITIZER_TIMEOUT_S says so there); ``row(run, output, exit status, timed out)`` makes the run's table row
    and prints its line as it finishes. Returns (the rows, the lines naming each registry kernel without a
    workload: printed before the runs, and again by :func:`_finish`), or None where the sanitizer is not on PATH."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        print("compute-sanitizer is not on PATH: nothing measured", file=sys.stderr)
        return None
    missing = [f"no workload for {k.title} ({k.function}): {tool} does not check it; add one to "
               "kernel.tools.racecheck.WORKLOADS" for k in without_workload()]
    for line in missing:
        print(line, file=sys.stderr)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in runs:
        print(f"[{tool}] {run} ...", flush=True)
        try:
            proc = run_tree(sanitizer_command(sanitizer, run, tool), timeout=SANITIZER_TIMEOUT_S)
            text, rc, timed_out = proc.stdout + proc.stderr, proc.returncode, False
        except subprocess.TimeoutExpired as exc:
            text, rc, timed_out = (exc.output or "") + (exc.stderr or ""), -1, True
        (log_dir / f"{tool}-{run}.log").write_text(
            text + (f"\ntimed out after {SANITIZER_TIMEOUT_S} s\n" if timed_out else ""))
        rows.append(row(run, text, rc, timed_out))
    return rows, missing


def _finish(log_dir: Path, missing: list[str]) -> None:
    print(f"logs: {log_dir}")
    for line in missing:   # again, where the table cannot hide it
        print(line, file=sys.stderr)


def _memcheck_row(run: str, text: str, rc: int, timed_out: bool) -> tuple:
    m = MEMCHECK_SUMMARY.search(text)
    errors = m.group(1) if m else "timeout" if timed_out else "?"
    print(f"  {errors} errors, exit status {rc}" if m else
          f"  timed out after {SANITIZER_TIMEOUT_S} s" if timed_out else text[-1500:])
    return run, ", ".join(checked_by(run)), errors, rc


def _memcheck(runs: Sequence[str], log_dir: Path) -> int:
    done = _run_each("memcheck", runs, log_dir, _memcheck_row)
    if done is None:
        return 2
    rows, missing = done
    print(f"\n{'run':18s} {'errors':>6s} {'rc':>3s}  kernels of the registry it launches")
    for run, kernels, errors, rc in rows:
        print(f"{run:18s} {errors:>6s} {rc:>3d}  {kernels}")
    _finish(log_dir, missing)
    clean = all(errors == "0" and rc == 0 for _, _, errors, rc in rows)
    return 0 if clean and not missing else 1


def _racecheck_row(run: str, text: str, rc: int, timed_out: bool) -> tuple:
    if timed_out:
        print(f"  timed out after {SANITIZER_TIMEOUT_S} s")
        return run, expected(run), "timeout", "-", "-", -1, []
    m = SUMMARY.search(text)
    if m:
        hazards, errors, warnings = m.groups()
    elif "ERROR SUMMARY: 0 errors" in text:
        hazards, errors, warnings = "0", "0", "0"
    else:
        hazards = errors = warnings = "?"
    print(text[-1500:] if hazards == "?" else f"  {hazards} hazards ({errors} errors, {warnings} warnings)")
    return run, expected(run), hazards, errors, warnings, rc, hazard_shapes(text)


def _parent(runs: Sequence[str], log_dir: Path) -> int:
    done = _run_each("racecheck", runs, log_dir, _racecheck_row)
    if done is None:
        return 2
    rows, missing = done
    print(f"\n{'run':34s} {'by construction':16s} {'hazards':>7s} {'errors':>7s} {'warn':>5s} {'rc':>3s}")
    for r in rows:
        print(f"{r[0]:34s} {r[1]:16s} {r[2]:>7s} {r[3]:>7s} {r[4]:>5s} {r[5]:>3d}")
    for r in rows:
        if r[6]:
            print(f"\n{r[0]}: the displayed hazards by shape (count, shape, warps first -> second access)")
            for shape, n, warps in r[6][:MAX_SHAPES]:
                print(f"  {n:4d}  {shape}  [{warps}]")
            if len(r[6]) > MAX_SHAPES:
                print(f"  ... {len(r[6]) - MAX_SHAPES} more shapes in the log")
    _finish(log_dir, missing)
    return 1 if missing else 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.racecheck") -> int:
    names = runs()
    # the run names unbroken (argparse's own wrapping splits them at their hyphens)
    epilog = "runs, in the order they run:\n" + textwrap.fill(", ".join(names), 88, initial_indent="  ",
                                                              subsequent_indent="  ", break_on_hyphens=False)
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=names, help=argparse.SUPPRESS)
    ap.add_argument("--runs", nargs="+", choices=names, metavar="RUN",
                    help="the probes and kernels to check, in the order given (default: all of them; with "
                         "--tool memcheck: each distinct kernel workload once)")
    ap.add_argument("--tool", choices=("racecheck", "memcheck"), default="racecheck",
                    help="compute-sanitizer's tool (default: %(default)s); memcheck runs the kernels' workloads only")
    ap.add_argument("--logs", type=Path, default=Path("racecheck-logs"),
                    help="where each run's log goes (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    if args.tool == "racecheck":
        return _parent(args.runs or list(names), args.logs)
    kernel_run_names = {w.run for _, w in kernel_runs()}
    probes = [r for r in args.runs or () if r not in kernel_run_names]
    if probes:
        ap.error(f"--tool memcheck runs the kernels' workloads only, not the probes: {' '.join(probes)}")
    return _memcheck(args.runs or list(memcheck_runs()), args.logs)


if __name__ == "__main__":
    sys.exit(main())
