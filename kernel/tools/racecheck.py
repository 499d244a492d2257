"""compute-sanitizer racecheck on Kernel A, with probes that calibrate the tool.

    ptx-lab racecheck        # needs a GPU and compute-sanitizer on PATH

(also ``python -m kernel.tools.racecheck``.)

Kernel A hands shared-memory stages between warps with named barriers:
the writer does `bar.arrive`, the reader `bar.sync` on the same id (PTX: the
barrier orders the arriving threads' earlier memory accesses before the
accesses that follow the waiting threads' bar.sync). Whether racecheck models
that hand-off decides how to read its report, so this tool runs three one-CTA
probes with known answers before the kernel:

    ring-arrive     a 2-stage producer/consumer ring exactly like Kernel A's
                    (FULL: producer arrives, consumer syncs; EMPTY: the other
                    way round). Race-free by construction.
    ring-arrive-exit  the same ring, but the consumer spins ~1 ms before its
                    last bar.sync, so the producer has exited by then (what a
                    short sequence does in Kernel A). Race-free by PTX rules.
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
    ring-syncthreads  the same data flow ordered by __syncthreads. Race-free.
    no-empty        one buffer, a FULL hand-off per iteration (its own barrier
                    id) and no EMPTY: the producer really overwrites words the
                    consumer may not have read yet. A race.

then Kernel A on a small varlen case (lengths 1, 17, 200; H 2; v-split 2;
KDA_RACECHECK_LENGTHS / _VSPLIT / _TUNING change it): the 200-token sequence walks 13
tiles, so every stage of the ring (at most 4) is refilled after an EMPTY hand-off, which
kernel.tools.check's 40 tokens (3 tiles) never reach. Built with
-lineinfo so each hazard names its source line. Each run is a child
process under `compute-sanitizer --tool racecheck`; the table at the end gives
the hazards per run.

The runs forward-states and kernel-b check the whole backward's other two kernels on lengths
1, 17, 200 and 700 (H 2): kernel-b runs one kda_backward with compute-sanitizer told to check
only Kernel B; forward-states runs the forward-state scan alone, built with -lineinfo, in
kda_backward's configuration for that case (KDA_RACECHECK_TUNING sets its Config fields, e.g.
{"producers": 1}). .ci/gpu-checks' memcheck step runs these two workloads under memcheck.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

PROBE_SOURCE = r"""
#include "barrier.cuh"
#include "bulk.cuh"
#include "cp_async.cuh"
#include "ldmatrix.cuh"
#include "wgmma.cuh"
using namespace ptx_lab;

// One producer warp (warp 1) and one consumer warp (warp 0); 2-stage ring of 32 floats.
// The consumer reads lane 31 - l's word so that every read crosses lanes.
constexpr int ITERS = 8, STAGES = 2, THREADS = 64;
__device__ __forceinline__ unsigned full_bar(int s) { return 1 + s; }
template <int N = STAGES>   // N: the ring's stages
__device__ __forceinline__ unsigned empty_bar(int s) { return 1 + N + s; }

template <bool LATE_LAST_SYNC>
__device__ void ring(float* out) {
    __shared__ float buf[STAGES][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 1) {
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) named_barrier_sync(empty_bar(s), THREADS);
            buf[s][lane] = float(i * 32 + lane);
            named_barrier_arrive(full_bar(s), THREADS);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            if (LATE_LAST_SYNC && i == ITERS - 1) {
                const long long t0 = clock64();
                while (clock64() - t0 < 2000000) {}
            }
            named_barrier_sync(full_bar(s), THREADS);
            acc += buf[s][31 - lane];
            if (i + STAGES < ITERS) named_barrier_arrive(empty_bar(s), THREADS);
        }
        out[lane] = acc;
    }
}

extern "C" __global__ void ring_arrive(float* out) { ring<false>(out); }
extern "C" __global__ void ring_arrive_exit(float* out) { ring<true>(out); }

// Two producer warps (1, 2) that first meet on a producers-only barrier (as Kernel A's
// producers do before R1), then write and arrive on FULL; one consumer warp (0).
template <bool PRODUCER_BARRIER>
__device__ void ring2(float* out) {
    constexpr int T = 96, PBAR = 1 + 2 * STAGES;
    __shared__ float buf[STAGES][64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= 1) {
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) named_barrier_sync(empty_bar(s), T);
            if (PRODUCER_BARRIER) named_barrier_sync(PBAR, 64);
            buf[s][threadIdx.x - 32] = float(i * 32 + lane);
            named_barrier_arrive(full_bar(s), T);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            named_barrier_sync(full_bar(s), T);
            acc += buf[s][63 - lane];
            if (i + STAGES < ITERS) named_barrier_arrive(empty_bar(s), T);
        }
        out[lane] = acc;
    }
}
extern "C" __global__ void ring2_arrive(float* out) { ring2<false>(out); }
extern "C" __global__ void ring2_producer_bar(float* out) { ring2<true>(out); }

// The ring of ring_arrive with the stages filled by cp.async, in Kernel A's order: the copy of
// tile i + 1 is issued after tile i's FULL arrive, into the stage the consumer left (EMPTY),
// and each tile's group is waited for before its FULL arrive. Race-free by construction: a
// report here means racecheck does not order cp.async writes by the barrier hand-off.
__device__ float ring_cp_async_src[ITERS][32];
extern "C" __global__ void ring_cp_async(float* out) {
    __shared__ __align__(16) float buf[STAGES][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 1) {
        cp_async_ca<4>(smem_addr(&buf[0][lane]), &ring_cp_async_src[0][lane]);
        cp_async_commit();
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            cp_async_wait<0>();
            named_barrier_arrive(full_bar(s), THREADS);
            const int j = i + 1;
            if (j < ITERS) {
                if (j >= STAGES) named_barrier_sync(empty_bar(j % STAGES), THREADS);
                cp_async_ca<4>(smem_addr(&buf[j % STAGES][lane]), &ring_cp_async_src[j][lane]);
            }
            cp_async_commit();
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            named_barrier_sync(full_bar(s), THREADS);
            acc += buf[s][31 - lane];
            if (i + STAGES < ITERS) named_barrier_arrive(empty_bar(s), THREADS);
        }
        out[lane] = acc;
    }
}

// Stages of 64 words filled by cp.async (as ring_cp_async) and read whole by ldmatrix: lane l gets
// words l and 32 + l. CONSUMER_PAIR false: producer warps 1 and 2 copy a half each, consumer warp 0
// reads (Kernel A's consumers read words several producer warps copied). true: producer warp 2
// copies it all, consumer warps 0 and 1 meet on a consumers-only barrier and then read (as Kernel
// A's two warps of a band do before G3). Race-free by construction either way.
__device__ float ring2_cp_async_src[ITERS][64];
template <bool CONSUMER_PAIR>
__device__ void ring2_cp_async(float* out) {
    constexpr int T = 96, PAIR = 1 + 2 * STAGES;
    __shared__ __align__(16) float buf[STAGES][64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (CONSUMER_PAIR ? warp == 2 : warp >= 1) {
        // this thread's words of a stage: lane and 32 + lane (one producer warp) or its half's one
        const int e0 = CONSUMER_PAIR ? lane : threadIdx.x - 32, step = CONSUMER_PAIR ? 32 : 64;
        for (int e = e0; e < 64; e += step) cp_async_ca<4>(smem_addr(&buf[0][e]), &ring2_cp_async_src[0][e]);
        cp_async_commit();
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            cp_async_wait<0>();
            named_barrier_arrive(full_bar(s), T);
            const int j = i + 1;
            if (j < ITERS) {
                if (j >= STAGES) named_barrier_sync(empty_bar(j % STAGES), T);
                for (int e = e0; e < 64; e += step)
                    cp_async_ca<4>(smem_addr(&buf[j % STAGES][e]), &ring2_cp_async_src[j][e]);
            }
            cp_async_commit();
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            named_barrier_sync(full_bar(s), T);
            if (CONSUMER_PAIR) named_barrier_sync(PAIR, 64);
            u32 r0, r1;   // two 8 x 16-byte matrices: the stage's 64 words, row r at byte 16 r
            ldmatrix_x2(r0, r1, smem_addr(&buf[s][0]) + 16u * (lane & 15));
            acc += __uint_as_float(r0) + __uint_as_float(r1);
            if (i + STAGES < ITERS) named_barrier_arrive(empty_bar(s), T);
        }
        if (warp == 0) out[lane] = acc;
    }
}
extern "C" __global__ void ring2_cp_async_ldmatrix(float* out) { ring2_cp_async<false>(out); }
extern "C" __global__ void ring2_consumer_bar(float* out) { ring2_cp_async<true>(out); }

// Kernel A's ring without its math: 4 stages, each tile's copies issued 3 tiles ahead (PREFETCH =
// NSTAGE - 1) after an EMPTY sync, as 16-byte cp.async.cg with a src-size (Kernel A's zero-fill
// form), by 4 producer warps (4-7) a quarter of a stage each; 4 consumer warps (0-3) each read the
// whole 512-byte stage by ldmatrix .trans and arrive on EMPTY; FULL and EMPTY count all 256
// threads. Race-free by construction: a report here is racecheck's reading of that shape.
// FENCE: the producers' fence.proxy.async before each FULL arrive, as Kernel A's R1 ends in its
// warpgroup-MMA builds. WGMMA: the consumers (one warpgroup) also read the stage through the async
// proxy, an m64n16k16 whose B is the stage's 512 bytes, and wait for it before EMPTY, as Kernel A's
// G4/G5 read qd and kd.
constexpr int KA_ITERS = 13, KA_WORDS = 128;
__device__ float kernel_a_ring_src[KA_ITERS][KA_WORDS];
// KA_STAGES: the ring's depth (FULL and EMPTY take barrier ids 1 .. 2 KA_STAGES).
// OWN_A: the warpgroup MMA takes A from registers of its own instead of the ldmatrix result.
// RELEASE_FENCE: a fence.proxy.async after the MMA's wait, before the EMPTY arrive.
// CONSUMERS: consumer warps (warps 0 .. CONSUMERS - 1; the 4 producer warps follow).
template <bool FENCE, bool WGMMA, bool OWN_A = false, bool RELEASE_FENCE = false, int KA_STAGES = 4,
          int CONSUMERS = 4>
__device__ void kernel_a_ring_t(float* out) {
    constexpr int KA_PREFETCH = KA_STAGES - 1, KA_THREADS = 32 * (CONSUMERS + 4);
    static_assert(!WGMMA || CONSUMERS == 4, "the warpgroup MMA needs four consumer warps");
    __shared__ __align__(16) float buf[KA_STAGES][KA_WORDS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= CONSUMERS) {
        const int chunk = (warp - CONSUMERS) * 8 + (lane & 7);   // 32 chunks of 16 bytes: lanes 0-7 of each warp
        auto issue = [&](int j) {
            if (j < KA_ITERS && lane < 8)
                cp_async_cg16_zfill(smem_addr(&buf[j % KA_STAGES][4 * chunk]), &kernel_a_ring_src[j][4 * chunk], 16u);
            cp_async_commit();   // one group per tile slot, possibly empty: uniform wait counts
        };
        for (int j = 0; j < KA_PREFETCH; ++j) issue(j);
        for (int i = 0; i < KA_ITERS; ++i) {
            cp_async_wait<KA_PREFETCH - 1>();   // this thread's copies of tile i landed
            __syncwarp();
            if (FENCE) fence_proxy_async_shared();
            named_barrier_arrive(full_bar(i % KA_STAGES), KA_THREADS);
            const int j = i + KA_PREFETCH;
            if (j < KA_ITERS && j >= KA_STAGES) named_barrier_sync(empty_bar<KA_STAGES>(j % KA_STAGES), KA_THREADS);
            issue(j);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < KA_ITERS; ++i) {
            const int s = i % KA_STAGES;
            named_barrier_sync(full_bar(s), KA_THREADS);
            u32 r[4];   // four 8 x 16-byte matrices: the stage's 32 rows of 16 bytes, row l at byte 16 l
            ldmatrix_x4_trans(r, smem_addr(&buf[s][0]) + 16u * lane);
            acc += __uint_as_float(r[0]) + __uint_as_float(r[1]) + __uint_as_float(r[2]) + __uint_as_float(r[3]);
            if constexpr (WGMMA) {   // B [16 x 16] bf16 = the stage: core matrices 128 B apart (lbo), 256 B (sbo)
                float d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                u32 own[4] = {0x3f803f80u * (lane & 1), 0u, 0u, 0u};   // bf16 ones in half the lanes
                wgmma_fence();
                wgmma_m64n16k16_bf16_rs<1>(d, OWN_A ? own : r, wgmma_desc(smem_addr(&buf[s][0]), 128, 256, 0), 0);
                wgmma_commit_group();
                wgmma_wait_group<0>();
                if (RELEASE_FENCE) fence_proxy_async_shared();
                acc += d[0];
            }
            if (i + KA_STAGES < KA_ITERS) named_barrier_arrive(empty_bar<KA_STAGES>(s), KA_THREADS);
        }
        if (warp == 0) out[lane] = acc;
    }
}
extern "C" __global__ void kernel_a_ring(float* out) { kernel_a_ring_t<false, false>(out); }
extern "C" __global__ void kernel_a_ring_6(float* out) { kernel_a_ring_t<false, false, false, false, 6>(out); }
extern "C" __global__ void kernel_a_ring_1c(float* out) { kernel_a_ring_t<false, false, false, false, 4, 1>(out); }
extern "C" __global__ void kernel_a_ring_fence(float* out) { kernel_a_ring_t<true, false>(out); }
extern "C" __global__ void kernel_a_ring_wgmma(float* out) { kernel_a_ring_t<true, true>(out); }
extern "C" __global__ void kernel_a_ring_wgmma_own_a(float* out) { kernel_a_ring_t<true, true, true>(out); }
extern "C" __global__ void kernel_a_ring_wgmma_release_fence(float* out) {
    kernel_a_ring_t<true, true, false, true>(out);
}

// Barrier ids 1..ITERS, each used once, so nothing waits on a reused id.
extern "C" __global__ void no_empty(float* out) {
    __shared__ float buf[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int i = 0; i < ITERS; ++i) {
        if (warp == 1) {
            buf[lane] = float(i * 32 + lane);
            named_barrier_arrive(1 + i, THREADS);
        } else {
            named_barrier_sync(1 + i, THREADS);
            acc += buf[31 - lane];
        }
    }
    if (warp == 0) out[lane] = acc;
}

extern "C" __global__ void ring_syncthreads(float* out) {
    __shared__ float buf[STAGES][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int i = 0; i < ITERS; ++i) {
        const int s = i % STAGES;
        if (warp == 1) buf[s][lane] = float(i * 32 + lane);
        __syncthreads();
        if (warp == 0) acc += buf[s][31 - lane];
    }
    if (warp == 0) out[lane] = acc;
}
"""

EXPECTED = {"ring-arrive": "race-free", "ring-arrive-exit": "race-free", "ring2-arrive": "race-free",
            "ring2-producer-bar": "race-free", "ring-cp-async": "race-free",
            "ring2-cp-async-ldmatrix": "race-free", "ring2-consumer-bar": "race-free", "kernel-a-ring": "race-free",
            "kernel-a-ring-6": "race-free", "kernel-a-ring-1c": "race-free",
            "kernel-a-ring-fence": "race-free", "kernel-a-ring-wgmma": "race-free",
            "kernel-a-ring-wgmma-own-a": "race-free", "kernel-a-ring-wgmma-release-fence": "race-free",
            "ring-syncthreads": "race-free",
            "no-empty": "a real race",
            "kernel-a": "?", "forward-states": "?", "kernel-b": "?"}
RUNS = tuple(EXPECTED)   # in the order they run

# the whole backward's other two kernels: kda_backward runs all three, and compute-sanitizer checks
# only the one named (its --kernel-name filter)
BACKWARD_RUNS = {"forward-states": "kda_forward_states", "kernel-b": "kda_token_gradients"}
# their case: ragged sequences, the longest 11 chunks of 64 tokens, so each kernel's ring of stages
# turns over several times
BACKWARD_LENGTHS = (1, 17, 200, 700)

# the probes whose stages cp.async fills: their source array in global memory, words a stage
COPIED_FROM = {"ring-cp-async": ("ring_cp_async_src", 32), "ring2-cp-async-ldmatrix": ("ring2_cp_async_src", 64),
               "ring2-consumer-bar": ("ring2_cp_async_src", 64)}


def _child(run: str) -> None:
    import cupy as cp

    if run in BACKWARD_RUNS:
        _backward_child(run)
        return
    if run != "kernel-a":
        from ptx_lab.gpu import load_module

        mod = load_module(PROBE_SOURCE)
        out = cp.zeros(32, dtype=cp.float32)
        if run.startswith("kernel-a-ring"):   # 13 tiles of 128 words; the .trans read moves halves: no exact value
            src = cp.ndarray((13, 128), dtype=cp.float32, memptr=mod.get_global("kernel_a_ring_src"))
            src[...] = cp.arange(13, dtype=cp.float32)[:, None] * 128 + cp.arange(128)
            threads = 160 if run == "kernel-a-ring-1c" else 256
            mod.get_function(run.replace("-", "_"))((1,), (threads,), (out,))
            cp.cuda.Device().synchronize()
            print(f"{run}: lane 0 sum {float(out[0].get()):.3g} (finite: {bool(cp.isfinite(out).all())})")
            return
        threads = 96 if run.startswith("ring2") else 64
        # what tile i's stage holds: word w (of 32 or 64) is i * 32 + w % 32, as the other rings write it
        want = sum(i * 32 + 31 for i in range(8))   # lane 0 reads lane 31's words
        if run in COPIED_FROM:   # the stages are copied from global memory
            name, words = COPIED_FROM[run]
            src = cp.ndarray((8, words), dtype=cp.float32, memptr=mod.get_global(name))
            src[...] = cp.arange(8, dtype=cp.float32)[:, None] * 32 + cp.arange(words) % 32
            if words == 64:
                want = sum(2 * i * 32 for i in range(8))   # lane 0 reads words 0 and 32
        mod.get_function(run.replace("-", "_"))((1,), (threads,), (out,))
        cp.cuda.Device().synchronize()
        print(f"{run}: lane 0 sum {float(out[0].get()):.0f} (race-free value {want:.0f})")
        return
    import dataclasses
    import json
    import os

    from kernel.ds_scan.launch import dstate_scan

    from . import check

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
    print(f"kernel-a: dh0 finite {bool(cp.isfinite(dh0).all())}")


def _backward_child(run: str) -> None:
    """One kda_backward (kernel-b) or its forward-state scan alone (forward-states, with -lineinfo) on
    FLA-layout tensors from the float64 emulation of FLA's forward (H = 2)."""
    import cupy as cp
    import numpy as np

    from kernel.ds_scan.launch import bf16_bits
    from kernel.kda_backward import kda_backward
    from kernel.reference import random_inputs
    from kernel.reference.fla_layout import fla_forward_tensors

    raw = random_inputs(1, sum(BACKWARD_LENGTHS), 2, lengths=list(BACKWARD_LENGTHS), seed=0, with_dht=True)
    cu = raw["cu_seqlens"]
    f = fla_forward_tensors(raw["q"], raw["k"], raw["g"], raw["beta"], cu_seqlens=cu)
    if run == "forward-states":   # the scan alone, in kda_backward's configuration, built with -lineinfo
        import dataclasses
        import json
        import os

        from kernel.runtime import builds
        from kernel.forward_states import auto_config, choose_warps, forward_states

        # KDA_RACECHECK_TUNING (JSON) overrides Config fields, e.g. {"nstage": 4, "warps": 8}
        cfg = dataclasses.replace(auto_config(choose_warps((cu.size - 1) * raw["q"].shape[2], builds.sm_count())), lineinfo=True,
                                  **json.loads(os.environ.get("KDA_RACECHECK_TUNING", "{}")))
        states = forward_states(cp.asarray(bf16_bits(f.k)), cp.asarray(bf16_bits(raw["v"])),
                                cp.asarray(f.g64.astype(np.float32)), cp.asarray(raw["beta"].astype(np.float32)),
                                cp.asarray(bf16_bits(f.Akk)), cu_seqlens=cu, config=cfg)
        cp.cuda.Device().synchronize()
        print(f"{run}: configuration {cfg.name()}, {states.shape[1]} state entries")
        return
    out = kda_backward(cp.asarray(bf16_bits(f.q)), cp.asarray(bf16_bits(f.k)), cp.asarray(bf16_bits(raw["v"])),
                       cp.asarray(f.g64.astype(np.float32)), cp.asarray(raw["beta"].astype(np.float32)),
                       cp.asarray(bf16_bits(f.Aqk)), cp.asarray(bf16_bits(f.Akk)), cp.asarray(bf16_bits(raw["do"])),
                       dht=cp.asarray(raw["dht"].astype(np.float32)), cu_seqlens=cu)
    cp.cuda.Device().synchronize()
    print(f"{run}: dq finite {bool(cp.isfinite(out['dq']).all())}")


# Kernel A's case: a short, a partial and a long sequence; the long one walks more tiles than the
# ring has stages, so that racecheck sees the EMPTY hand-offs (a sequence of at most nstage tiles has none)
KERNEL_A_LENGTHS = (1, 17, 200)


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


def _parent(runs: Sequence[str], log_dir: Path) -> int:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        print("compute-sanitizer is not on PATH: nothing measured", file=sys.stderr)
        return 2
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in runs:
        print(f"[racecheck] {run} ...", flush=True)
        cmd = [sanitizer, "--tool", "racecheck", "--racecheck-report", "all", "--print-limit", "200"]
        if run in BACKWARD_RUNS:
            cmd += ["--kernel-name", f"kns={BACKWARD_RUNS[run]}"]
        cmd += [sys.executable, "-m", "kernel.tools.racecheck", "--child", run]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            (log_dir / f"racecheck-{run}.log").write_text(out)
            rows.append((run, EXPECTED[run], "timeout", "-", "-", -1, []))
            print("  timed out after 240 s")
            continue
        text = proc.stdout + proc.stderr
        (log_dir / f"racecheck-{run}.log").write_text(text)
        m = SUMMARY.search(text)
        if m:
            hazards, errors, warnings = m.groups()
        elif "ERROR SUMMARY: 0 errors" in text:
            hazards, errors, warnings = "0", "0", "0"
        else:
            hazards = errors = warnings = "?"
        shapes = hazard_shapes(text)
        rows.append((run, EXPECTED[run], hazards, errors, warnings, proc.returncode, shapes))
        print(text[-1500:] if hazards == "?" else f"  {hazards} hazards ({errors} errors, {warnings} warnings)")
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
    print(f"logs: {log_dir}")
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.racecheck") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    ap.add_argument("--logs", type=Path, default=Path("racecheck-logs"))
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    return _parent(args.runs, args.logs)


if __name__ == "__main__":
    sys.exit(main())
