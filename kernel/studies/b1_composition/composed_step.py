"""The serial step of the composed scan on the GPU: the floor of a B = 1 redesign's serial path.

Why
---
Kernel A misses its B = 1 target (0.5x FLA at 1 x 131072) because it walks 8,192 tiles of 16
tokens per head in sequence, each with a dependent chain of MMAs; with all of its math knocked
out, its loads and hand-offs alone take 0.65-0.85x FLA (docs/log/25-b1-taken-apart.md and
docs/log/26-b1-redesign-in-parts.md).
:mod:`.compose` shows, in numpy, that 4 tiles compose into one 64-token step
``dS <- D * dS - U (W dS) + B`` (diagonal plus rank 64). A kernel built on it would pay
2,048 such steps per head on its serial path and build D, U, W, B beside them. This module
runs that serial step alone on the GPU (``composed_step.cu``, beside this file; two kernels,
mma.sync on 4 warps and wgmma on one warpgroup), so the redesign's serial floor is measured
before it is built:

* **check**: one random sequence (T tokens, a multiple of 64, ``heads`` heads, 4 CTAs of 32 v
  columns per head as Kernel A's vsplit 4), the steps' operands from
  :func:`.compose.lowrank_steps` (bf16 roundings of ``compose.emulate(mode="lowrank")``),
  streamed to the kernels step by step. The GPU's snapshots and dh0 are compared with that
  emulation and with the float64 reference (:func:`kernel.reference.dstate_scan_reference`).
* **timing**: ``steps`` steps (2,048 = one 1 x 131072 head) on ``ctas`` CTAs (128 = 32 heads x
  vsplit 4), the operands resident in shared memory (2 blocks used alternately), as if built by
  the off-path warps of the redesign; with and without the bf16 snapshot per step (bf16-every-64's
  bytes), (wgmma) with the A fragments loaded once (a bound, wrong results), and (mma.sync)
  beside companion warps that run mma.sync or wgmma work flat out, as the redesign's off-path
  composition would share the SM, counting the HMMAs they manage per step against the
  OFF_PATH_HMMA_PER_STEP the composition needs.

``python -m kernel.studies.b1_composition.composed_step`` from a checkout (needs an sm_90 GPU;
without one it says so and exits 2). The question, method and answer: README.md beside this file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from kernel.reference import prepare_tiles, random_inputs

from . import compose

SOURCE_PATH = Path(__file__).resolve().parent / "composed_step.cu"
K, R, V_CTA, GROUP = 128, 64, 32, 4          # k, rank of a 4-tile step, v columns per CTA, tiles per step
VSPLIT = 128 // V_CTA
NBUF = 2                                     # resident operand blocks in the timing runs
STEP_SNAPSHOT, STEP_STREAM, STEP_A_ONCE, STEP_WGMMA_COMPANIONS = 1, 2, 4, 8
KERNELS = ("composed_step_mma", "composed_step_wgmma")
# composed_step.cu's StepOperands, field by field: (name, dtype, shape incl. row padding)
OPERAND_FIELDS = (("w_rk", np.uint16, (R, K + 8)), ("negu_kr", np.uint16, (K, R + 8)), ("d", np.float32, (K,)),
                  ("bt_vk", np.float32, (V_CTA, K + 8)), ("b_kv", np.float32, (K, V_CTA + 8)))
OPERAND_BYTES = sum(np.dtype(t).itemsize * int(np.prod(s)) for _, t, s in OPERAND_FIELDS)
EXCHANGE_BYTES = {"composed_step_mma": 2 * 2 * 2 * 8 * 32 * 16 + 16,  # X's partial sums ([parity][kh][mv][8][32]
                                                                     # float4) and the chain-done counter
                  "composed_step_wgmma": 2 * 8192 + 4096}            # bf16 dS tiles (2) and the X^T tile
MAX_COMPANIONS = 8
# The off-path work a step of the redesign needs per CTA, in m16n8k16 HMMAs (2,048 multiply-adds
# each): compose.macs_per_tile's low-rank off-path count for 4 tiles of a head, shared by its 4 CTAs
OFF_PATH_HMMA_PER_STEP = compose.macs_per_tile(group=GROUP)["lowrank_off_path"] * GROUP / VSPLIT / 2048


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def pack_step(D: np.ndarray, U: np.ndarray, W: np.ndarray, B: np.ndarray, vs: int) -> np.ndarray:
    """One step's operands for the CTA holding v columns 32 vs .. 32 vs + 31, as the kernels'
    StepOperands (uint8 [OPERAND_BYTES]). D [K], U [K, 64], W [64, K], B [K, V] float32."""
    if U.shape != (K, R) or W.shape != (R, K) or D.shape != (K,) or B.shape[0] != K:
        raise ValueError(f"a full 4-tile step needs D [{K}], U [{K}, {R}], W [{R}, {K}], B [{K}, V]; got "
                         f"{D.shape}, {U.shape}, {W.shape}, {B.shape}")
    cols = B[:, V_CTA * vs:V_CTA * (vs + 1)]
    values = {"w_rk": _bf16_bits(W), "negu_kr": _bf16_bits(-U), "d": D, "bt_vk": cols.T, "b_kv": cols}
    out = []
    for name, dtype, shape in OPERAND_FIELDS:
        field = np.zeros(shape, dtype)
        v = np.asarray(values[name], dtype)
        field[tuple(slice(0, n) for n in v.shape)] = v
        out.append(field.view(np.uint8).ravel())
    return np.concatenate(out)


def unpack_step(block: np.ndarray) -> dict:
    """The fields of one packed block, padding dropped (bf16 fields as float32)."""
    out, o = {}, 0
    for name, dtype, shape in OPERAND_FIELDS:
        n = np.dtype(dtype).itemsize * int(np.prod(shape))
        field = block[o:o + n].view(dtype).reshape(shape)
        o += n
        if dtype == np.uint16:
            field = field.view(ml_dtypes.bfloat16).astype(np.float32)
        out[name] = field[:, :shape[1] - 8] if len(shape) == 2 else field
    return out


def snapshot_index(kernel: str) -> np.ndarray:
    """For one CTA and step, the (v, k) each bf16 of the kernel's 4,096-element snapshot holds:
    int [4096, 2] (see composed_step.cu for either order)."""
    idx = np.zeros((4096, 2), np.int64)
    if kernel == "composed_step_mma":   # u32 [warp][kk][e][lane], two bf16 along k
        for warp in range(4):
            mv, kh = warp & 1, warp >> 1
            for kk in range(4):
                for e in range(4):
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        v = 16 * mv + g + 8 * (e & 1)
                        k = 64 * kh + 16 * kk + 8 * (e >> 1) + 2 * t
                        word = ((warp * 4 + kk) * 4 + e) * 32 + lane
                        idx[2 * word] = (v, k)
                        idx[2 * word + 1] = (v, k + 1)
    elif kernel == "composed_step_wgmma":   # core matrices: byte of (k, v) = (v/8) 2048 + (k/8) 128 + (k%8) 16 + (v%8) 2
        for k in range(K):
            for v in range(V_CTA):
                idx[((v // 8) * 2048 + (k // 8) * 128 + (k % 8) * 16 + (v % 8) * 2) // 2] = (v, k)
    else:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return idx


def decode_snapshots(raw: np.ndarray, kernel: str, ctas: int, nsteps: int) -> np.ndarray:
    """The kernels' snapshot buffer (uint32) as float32 dS^T [ctas, nsteps, 32 v, 128 k]."""
    bf = np.asarray(raw).view(np.uint16)[:ctas * nsteps * 4096].view(ml_dtypes.bfloat16).astype(np.float32)
    bf = bf.reshape(ctas, nsteps, 4096)
    idx = snapshot_index(kernel)
    out = np.zeros((ctas, nsteps, V_CTA, K), np.float32)
    out[:, :, idx[:, 0], idx[:, 1]] = bf
    return out


def _module():
    from ptx_lab.gpu import load_module

    return load_module(SOURCE_PATH.read_text(), (f"-DNBUF={NBUF}", "-ftz=true"))


def _launch(kernel: str, steps, nsteps: int, flags: int, dsT_in, dsT_out, snapshots, cycles, ctas: int,
            companions: int = 0, companion_hmma=None) -> None:
    """One launch; `companions` extra warps (composed_step_mma only) count their HMMAs into
    companion_hmma [ctas * MAX_COMPANIONS] (uint64)."""
    import cupy

    fn = _module().get_function(kernel)
    smem = NBUF * OPERAND_BYTES + EXCHANGE_BYTES[kernel]   # the ring of NBUF operand blocks, streamed or not
    fn.max_dynamic_shared_size_bytes = smem
    args = (steps, np.int32(nsteps), np.int32(flags), dsT_in, dsT_out, snapshots, cycles)
    if kernel == "composed_step_mma":
        if companion_hmma is None:
            companion_hmma = cupy.zeros(ctas * MAX_COMPANIONS, cupy.uint64)
        args += (companion_hmma,)
    elif companions:
        raise ValueError("companion warps run beside composed_step_mma only")
    if not 0 <= companions <= MAX_COMPANIONS or (companions and flags & STEP_STREAM):
        raise ValueError(f"companions must be 0..{MAX_COMPANIONS}, and 0 when streaming; got {companions}")
    if flags & STEP_WGMMA_COMPANIONS and companions != 4:
        raise ValueError(f"wgmma companions are one warpgroup: 4 warps, got {companions}")
    fn((ctas,), (128 + 32 * companions,), args, shared_mem=smem)


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def check(T: int = 4096, heads: int = 2, seed: int = 0) -> list[dict]:
    """Both kernels against compose.emulate("lowrank") and the float64 reference (see the module
    docstring). Returns a row per kernel: errors and whether they pass."""
    if T < 16 * GROUP or T % (16 * GROUP):
        raise ValueError(f"T must be a positive multiple of {16 * GROUP} (whole 64-token steps), got {T}")
    import cupy

    case = compose.study_inputs(T, heads, GROUP, seed)
    nsteps, ctas = T // (16 * GROUP), heads * VSPLIT
    blocks = np.zeros((ctas, nsteps, OPERAND_BYTES), np.uint8)
    emu_snaps, emu_dh0, dsT0 = [], [], np.zeros((ctas, V_CTA, K), np.float32)
    for h in range(heads):
        tiles, dS0 = case["tiles"][h], case["dS0"][h]
        s, d = compose.emulate(tiles, dS0, GROUP, mode="lowrank")
        emu_snaps.append(s); emu_dh0.append(d)
        for s_i, (D, U, W, B) in enumerate(compose.lowrank_steps(tiles, GROUP)):
            for vs in range(VSPLIT):
                blocks[h * VSPLIT + vs, s_i] = pack_step(D, U, W, B, vs)
        for vs in range(VSPLIT):
            dsT0[h * VSPLIT + vs] = dS0[:, V_CTA * vs:V_CTA * (vs + 1)].T
    steps_d, dsT_in = cupy.asarray(blocks), cupy.asarray(dsT0)
    rows = []
    for kernel in KERNELS:
        dsT_out = cupy.zeros((ctas, V_CTA, K), cupy.float32)
        snaps_d = cupy.zeros(ctas * nsteps * 2048, cupy.uint32)
        cycles = cupy.zeros(9 * ctas, cupy.int64)
        _launch(kernel, steps_d, nsteps, STEP_STREAM | STEP_SNAPSHOT, dsT_in, dsT_out, snaps_d, cycles, ctas)
        first = (dsT_out.get(), snaps_d.get())
        _launch(kernel, steps_d, nsteps, STEP_STREAM | STEP_SNAPSHOT, dsT_in, dsT_out, snaps_d, cycles, ctas)
        deterministic = bool(np.array_equal(first[0], dsT_out.get()) and np.array_equal(first[1], snaps_d.get()))
        got = decode_snapshots(first[1], kernel, ctas, nsteps)
        row = {"kernel": kernel, "T": T, "heads": heads, "deterministic": deterministic}
        err = {key: [] for key in ("dh0_vs_emulation", "dh0", "dh0_emulation", "snapshots_vs_emulation",
                                   "snapshots", "snapshots_emulation")}
        for h in range(heads):
            # per head: dS [K, V] from the 4 CTAs' dS^T, snapshots in the reference's order (m = 0 first)
            dh0 = np.concatenate([first[0][h * VSPLIT + vs].T for vs in range(VSPLIT)], axis=1)
            snaps = np.concatenate([got[h * VSPLIT + vs].transpose(0, 2, 1) for vs in range(VSPLIT)], axis=2)[::-1]
            emu_s_bf16 = compose.bf16(emu_snaps[h])     # what a bf16 snapshot of the emulation would hold
            err["dh0_vs_emulation"].append(_rel(dh0, emu_dh0[h]))
            err["dh0"].append(_rel(dh0, case["dh0"][h]))
            err["dh0_emulation"].append(_rel(emu_dh0[h], case["dh0"][h]))
            err["snapshots_vs_emulation"].append(_rel(snaps, emu_s_bf16))
            err["snapshots"].append(_rel(snaps, case["snapshots"][:, h]))
            err["snapshots_emulation"].append(_rel(emu_s_bf16, case["snapshots"][:, h]))
        row.update({key: max(v) for key, v in err.items()})
        # the GPU differs from the emulation only in fp32 summation order (and the bf16 roundings
        # that order flips): its errors against float64 may exceed the emulation's by 25% at most
        row["passed"] = (deterministic and row["dh0"] <= 1.25 * row["dh0_emulation"] + 1e-4
                         and row["snapshots"] <= 1.25 * row["snapshots_emulation"] + 1e-4)
        rows.append(row)
    return rows


def resident_operands(ctas: int, seed: int = 0):
    """The timing runs' inputs on the GPU: NBUF operand blocks (a random sequence's first NBUF
    steps, v columns 0-31) and every CTA's dS^T (that sequence's dht)."""
    import cupy

    raw = random_inputs(1, 16 * GROUP * NBUF, 1, seed=seed)
    gc, mqk, inv = prepare_tiles(raw["q"], raw["k"], raw["g"], raw["beta"])
    tiles = compose.tile_operands(raw["q"][0, :, 0], raw["k"][0, :, 0], gc[0, :, 0], raw["beta"][0, :, 0],
                                  mqk[0, :, 0], inv[0, :, 0], raw["do"][0, :, 0])
    blocks = np.stack([pack_step(*step, vs=0) for step in compose.lowrank_steps(tiles, GROUP)])
    dsT = np.broadcast_to(np.asarray(raw["dht"][0, 0], np.float32)[:, :V_CTA].T, (ctas, V_CTA, K))
    return cupy.asarray(blocks), cupy.asarray(np.ascontiguousarray(dsT))


def timing(nsteps: int = 2048, ctas: int = 128, reps: int = 10, seed: int = 0) -> list[dict]:
    """Each kernel's time for `nsteps` steps on `ctas` CTAs, operands resident (NBUF blocks of a
    real sequence's first steps, the same for every CTA), and the mma.sync chain's beside 4 or 8
    companion warps of mma.sync work or a companion warpgroup of wgmma work running flat out (the
    off-path composition's stand-in; its HMMAs per chain step counted). Rows: kernel, variant, ms,
    ns and clock64 cycles a step (slowest chain warp), companion HMMAs a step, wgmma's phase split."""
    import cupy

    steps_d, dsT_in = resident_operands(ctas, seed)
    dsT_out = cupy.zeros((ctas, V_CTA, K), cupy.float32)
    snaps_d = cupy.zeros(ctas * nsteps * 2048, cupy.uint32)
    cycles = cupy.zeros(9 * ctas, cupy.int64)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    hmma = cupy.zeros(ctas * MAX_COMPANIONS, cupy.uint64)
    variants = [("composed_step_mma", "chain", 0, 0), ("composed_step_mma", "chain + bf16 snapshot", STEP_SNAPSHOT, 0),
                ("composed_step_mma", "chain + snapshot, 4 companions", STEP_SNAPSHOT, 4),
                ("composed_step_mma", "chain + snapshot, 8 companions", STEP_SNAPSHOT, 8),
                ("composed_step_mma", "chain + snapshot, wgmma companions", STEP_SNAPSHOT | STEP_WGMMA_COMPANIONS, 4),
                ("composed_step_wgmma", "chain", 0, 0), ("composed_step_wgmma", "chain + bf16 snapshot", STEP_SNAPSHOT, 0),
                ("composed_step_wgmma", "chain, A loaded once (bound)", STEP_A_ONCE, 0)]
    rows = []
    for kernel, label, flags, companions in variants:
        times = []
        for r in range(reps + 2):
            e0.record()
            _launch(kernel, steps_d, nsteps, flags, dsT_in, dsT_out, snaps_d, cycles, ctas, companions, hmma)
            e1.record(); e1.synchronize()
            times.append(cupy.cuda.get_elapsed_time(e0, e1))
        ms = float(np.median(times[2:]))
        cyc = cycles.get()
        row = {"kernel": kernel, "variant": label, "ms": ms, "ns_per_step": ms * 1e6 / nsteps,
               "cycles_per_step": float(cyc[:4 * ctas].max()) / nsteps,
               "finite": bool(np.isfinite(dsT_out.get()).all())}
        if companions:   # the last launch's counts: HMMAs the companions did per chain step and CTA
            row["companion_hmma_per_step"] = float(hmma.get().sum()) / ctas / nsteps
        if kernel == "composed_step_wgmma":
            ph = cyc[4 * ctas:].reshape(ctas, 5).mean(0) / nsteps
            row["phases"] = dict(zip(("A + pack + stmatrix + diag(D) + B", "barrier 1", "GEMM1",
                                      "X^T stmatrix + barrier 2", "GEMM2"), map(float, ph)))
        rows.append(row)
        print(f"  {kernel:20s} {label:32s} {ms:7.3f} ms {row['ns_per_step']:7.1f} ns/step "
              f"{row['cycles_per_step']:7.0f} cycles/step"
              + (f", companions {row['companion_hmma_per_step']:.0f} HMMA/step" if companions else ""), flush=True)
    return rows


def fla_ms(T: int = 131072, H: int = 32, reps: int = 5, seed: int = 0) -> tuple[float, dict]:
    """FLA's dAv+dhu at 1 x T with H heads, timed in this process as ptx-lab bench times it
    (median ms), and its autotuner's choices: the time a B = 1 target is a fraction of."""
    import torch

    from kernel.tools import fla_adapter as fla
    from kernel.tools.bench import configs, inputs, timing

    ok, why = fla.available()
    if not ok:
        raise RuntimeError(f"--fla: flash-linear-attention is not available: {why}")
    raw = inputs.make_inputs(configs.parse_config(f"1x{T}"), H, seed=seed, gate_strength=1.0)
    fla.reset_autotune()
    state = fla.prepare(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"],
                        cu_seqlens=inputs.cu_for_fla(raw["cu_seqlens"]))
    fn = fla.callables(state, raw["do"], raw["dht"])["dAv+dhu"]
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    ms = timing.time_cuda(fn, warmup=2, reps=reps, flush=flush)["median_ms"]
    choices = fla.autotune_choices()
    del state, raw, flush
    timing.free_memory()
    return ms, choices


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.b1_composition.composed_step", description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=4096, help="check: tokens of the sequence, a multiple of 64")
    ap.add_argument("--heads", type=int, default=2, help="check: heads (4 CTAs each)")
    ap.add_argument("--steps", type=int, default=2048, help="timing: 64-token steps (2048 = one 1x131072 head)")
    ap.add_argument("--ctas", type=int, default=128, help="timing: CTAs (128 = 32 heads x vsplit 4)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--fla", action="store_true",
                    help="also time FLA's dAv+dhu at 1 x (64 x steps), 32 heads, in this process, and print the "
                         "ratios (needs torch and fla-core)")
    args = ap.parse_args(argv)
    if args.T < 64 or args.T % 64 or args.heads < 1 or args.steps < 1 or args.ctas < 1 or args.reps < 1:
        ap.error("--T must be a positive multiple of 64; --heads, --steps, --ctas and --reps >= 1")
    from ptx_lab.gpu import gpu_reason

    if gpu_reason():
        print(f"{ap.prog} needs an sm_90 GPU: {gpu_reason()} "
              f"(the numpy side of the composed scan: python -m {__package__}.compose)")
        return 2
    print(f"check: T = {args.T}, {args.heads} heads x {VSPLIT} CTAs, operands from compose.lowrank_steps; "
          "errors: relative Frobenius norm, worst head", flush=True)
    rows = check(args.T, args.heads)
    for r in rows:
        print(f"  {r['kernel']:20s} dh0 {r['dh0']:.2e} (emulation {r['dh0_emulation']:.2e}, GPU vs emulation "
              f"{r['dh0_vs_emulation']:.1e})  snapshots {r['snapshots']:.2e} (emulation {r['snapshots_emulation']:.2e}, "
              f"GPU vs emulation {r['snapshots_vs_emulation']:.1e})  det {r['deterministic']}  "
              f"{'PASS' if r['passed'] else 'FAIL'}", flush=True)
    if not all(r["passed"] for r in rows):
        print("check FAILED: no timing")
        return 1
    print(f"timing: {args.steps} steps on {args.ctas} CTAs (128 threads), operands resident, median of {args.reps}",
          flush=True)
    rows = timing(args.steps, args.ctas, args.reps)
    print(f"\n{'kernel':20s} {'variant':32s} {'ms':>7s} {'ns/step':>8s} {'cycles/step':>11s} {'companion HMMA/step':>19s}")
    for r in rows:
        print(f"{r['kernel']:20s} {r['variant']:32s} {r['ms']:7.3f} {r['ns_per_step']:8.1f} {r['cycles_per_step']:11.0f} "
              f"{r.get('companion_hmma_per_step', float('nan')):19.0f}" + ("" if r["finite"] else "  (dS not finite)"))
    print(f"(the redesign's off-path work per step and CTA: {OFF_PATH_HMMA_PER_STEP:.0f} HMMAs, "
          "compose.macs_per_tile)")
    if args.fla:
        print(f"\nFLA's dAv+dhu at 1x{64 * args.steps}, 32 heads, this process ...", flush=True)
        ms, choices = fla_ms(T=64 * args.steps)
        dhu = {name: sorted(set(v.values())) for name, v in choices.items() if "dhu" in name}
        print(f"FLA {ms:.3f} ms (its dhu kernel's autotune choice: {dhu}); each variant's time / FLA's:")
        for r in rows:
            print(f"  {r['kernel']:20s} {r['variant']:32s} {r['ms'] / ms:.3f}")
    for r in rows:
        if "phases" in r:
            print(f"wgmma {r['variant']}: cycles a step (thread 0, mean over CTAs): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in r["phases"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
