"""Does a KDA model train the same with kernel.chunk_kda (our forward and backward) as with FLA's chunk_kda?

    python -m kernel.studies.training.compare --steps 300 --out docs/bench/training.png --json OUT.json

(from a checkout; needs one CUDA GPU, torch, fla-core 0.6.0, CuPy and kernel.kda_backward.)
    python -m kernel.studies.training.compare --our-forward fla ...   # run 2 on FLA's forward: the backward alone

Three runs of the same small KDA language model on the same synthetic task
(:mod:`.model`: repeated random segments, learnt by induction), each
``--steps`` AdamW steps under bf16 autocast:

1. FLA's ``chunk_kda`` (its forward and its backward), seed ``--seed``;
2. ``kernel.chunk_kda`` (our backward, and the forward ``--our-forward`` names through
   ``kernel.using_forward``: ours by default, FLA's with ``fla``), the same seed: the same initial
   weights and the same batches, so the two differ only in the op's implementation (with
   ``--our-forward fla``, only in the backward);
3. FLA's ``chunk_kda`` again with seed ``--noise-seed``: how far two runs that
   should learn equally well drift apart anyway.

``--model fla`` trains FLA's own model instead: ``fla.models.KDAForCausalLM`` (needs
flash-linear-attention and transformers) of ``--layers`` layers and ``--heads`` heads of 128,
its ``KimiDeltaAttention`` at its defaults (the gate and beta in the op, unbounded gates), its
loss its own. Run 2 is then the same model trained inside ``kernel.patched_fla()``: FLA's
model, unchanged, through the switch (``kernel.chunk_kda``, its forward ``--our-forward``'s).

Printed: progress every ``--log-every`` steps with the elapsed time, then a
table of each run's final loss (the mean of its last ``--smooth`` steps) and
the largest absolute difference between the smoothed curves of runs 2 and 1 and
of runs 3 and 1. ``--out`` gets both curves and their differences in one PNG,
``--json`` every step's loss and the summary.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Sequence

PROG = "python -m kernel.studies.training.compare"
MODELS = ("study", "fla")
# --our-forward: the forward kernel.chunk_kda runs in run 2 (kernel.using_forward), as the labels word it;
# a record without it (docs/bench/training.json) was made when kernel.chunk_kda ran FLA's forward
OUR_FORWARDS = {"ours": "our forward", "fla": "FLA's forward"}
OUR_FORWARD_BEFORE = "fla"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    ap.add_argument("--model", choices=MODELS, default=MODELS[0],
                    help="study: this study's small KDA LM (model.py); fla: FLA's KDAForCausalLM at its "
                         "layer defaults, run 2 through kernel.patched_fla() (default study)")
    ap.add_argument("--out", type=Path, default=Path("docs/bench/training.png"), help="the PNG to write")
    ap.add_argument("--json", type=Path, default=None, help="also write every loss and the summary here")
    ap.add_argument("--batch", type=int, default=8, help="rows per step (default 8)")
    ap.add_argument("--T", type=int, default=1024, help="tokens per row (default 1024)")
    ap.add_argument("--vocab", type=int, default=32, help="vocabulary size (default 32)")
    ap.add_argument("--min-period", type=int, default=16, help="shortest repeated segment (default 16)")
    ap.add_argument("--max-period", type=int, default=128, help="longest repeated segment (default 128)")
    ap.add_argument("--layers", type=int, default=2, help="KDA blocks (default 2)")
    ap.add_argument("--heads", type=int, default=4, help="KDA heads of 128 (d_model = 128 heads; default 4)")
    ap.add_argument("--lr", type=float, default=5e-3, help="peak AdamW learning rate (default 5e-3)")
    ap.add_argument("--warmup", type=int, default=30, help="linear warm-up steps, then cosine to 10%% (default 30)")
    ap.add_argument("--our-forward", choices=tuple(OUR_FORWARDS), default="ours",
                    help="the forward kernel.chunk_kda runs in run 2 (kernel.using_forward): ours (default) or fla "
                         "(FLA's forward: then only the backward differs from run 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed of runs 1 and 2 (weights and batches)")
    ap.add_argument("--noise-seed", type=int, default=1, help="seed of run 3 (default 1)")
    ap.add_argument("--smooth", type=int, default=25, help="trailing-mean window of the curves (default 25)")
    ap.add_argument("--replot", type=Path, default=None,
                    help="draw --out again from the --json file of an earlier run (no training, no GPU)")
    ap.add_argument("--log-every", type=int, default=50, help="progress line every this many steps (default 50)")
    a = ap.parse_args(argv)
    for name in ("steps", "batch", "T", "vocab", "layers", "heads", "smooth", "log_every"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not 1 <= a.min_period <= a.max_period <= a.T:
        ap.error(f"need 1 <= --min-period <= --max-period <= --T, got {a.min_period}, {a.max_period}, {a.T}")
    if a.warmup < 0 or not a.lr > 0:
        ap.error(f"need --warmup >= 0 and --lr > 0, got {a.warmup}, {a.lr}")
    if a.seed == a.noise_seed:
        ap.error("--noise-seed must differ from --seed (run 3 measures run-to-run noise)")
    return a


# ----------------------------------------------------------------------------
# one run
# ----------------------------------------------------------------------------

def build_model(a: argparse.Namespace):
    if a.model == "fla":
        from fla.models import KDAConfig, KDAForCausalLM

        # its layer at the defaults, the study's shape; the loss in plain torch (FLA's fused one is
        # another kernel to compare, not what this study asks)
        config = KDAConfig(hidden_size=128 * a.heads, num_heads=a.heads, head_dim=128, num_hidden_layers=a.layers,
                           vocab_size=a.vocab, fuse_cross_entropy=False, bos_token_id=0, eos_token_id=0,
                           pad_token_id=None, use_cache=False)
        return KDAForCausalLM(config)
    from .model import KDALanguageModel

    return KDALanguageModel(a.vocab, a.layers, a.heads)


def model_loss(model, rows, kda: Callable | None, a: argparse.Namespace):
    """The next-token loss of a batch of rows [B, T + 1]: the study's model with `kda` as its KDA, or
    FLA's model on its own (labels shifted inside, as Hugging Face's causal LMs do)."""
    if a.model == "fla":
        return model(input_ids=rows[:, :-1], labels=rows[:, :-1]).loss
    return model.loss(rows, kda)


def train(kda: Callable | None, a: argparse.Namespace, seed: int, *, device: str, label: str = "",
          log: Callable[[str], None] = print, route=None) -> dict[str, Any]:
    """`a.steps` AdamW steps with `kda` as every layer's KDA (the study's model) -> {"losses": [...],
    "seconds": s}. ``route``: a context manager each step runs inside (``kernel.patched_fla()`` for
    FLA's model through our backward).

    The seed fixes the initial weights and the batches; bf16 autocast on CUDA."""
    import torch

    from .model import repeated_segments

    torch.manual_seed(seed)
    model = build_model(a).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def schedule(step: int) -> float:
        if step < a.warmup:
            return (step + 1) / a.warmup
        done = (step - a.warmup) / max(1, a.steps - a.warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    batches = torch.Generator().manual_seed(seed)
    use_autocast = device.startswith("cuda")
    losses = []
    start = time.perf_counter()
    for step in range(a.steps):
        rows = repeated_segments(a.batch, a.T, a.vocab, a.min_period, a.max_period, batches).to(device)
        with route() if route is not None else contextlib.nullcontext():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
                loss = model_loss(model, rows, kda, a)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach())
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            log(f"[{label}] step {step + 1}/{a.steps}  loss {losses[-1].item():.4f}  "
                f"{time.perf_counter() - start:.1f} s")
    losses = torch.stack(losses).float().cpu().tolist()
    return {"losses": losses, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------
# the comparison
# ----------------------------------------------------------------------------

def smoothed(losses: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` steps (fewer at the start)."""
    out, total = [], 0.0
    for i, x in enumerate(losses):
        total += x
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def summarize(runs: dict[str, dict], window: int, *, reference: str, same_seed: str, other_seed: str) -> dict:
    """Final losses and the largest |difference| of the smoothed curves against `reference`."""
    curves = {name: smoothed(run["losses"], window) for name, run in runs.items()}
    gap = lambda name: max(abs(x - y) for x, y in zip(curves[name], curves[reference]))
    return {"final_loss": {name: c[-1] for name, c in curves.items()},
            "max_abs_smoothed_difference": {"ours vs FLA, same seed": gap(same_seed),
                                            "noise (FLA vs FLA, other seed)": gap(other_seed)},
            "smooth_window": window}


def table(runs: dict[str, dict], summary: dict) -> str:
    rows = [("run", f"final loss (mean of last {summary['smooth_window']})", "seconds")]
    rows += [(name, f"{summary['final_loss'][name]:.4f}", f"{run['seconds']:.1f}") for name, run in runs.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    out = [line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows[1:]), ""]
    out += [f"max |smoothed difference|, {k}: {v:.4f}" for k, v in summary["max_abs_smoothed_difference"].items()]
    return "\n".join(out)


def plot(runs: dict[str, dict], summary: dict, path: Path, title: str, *, reference: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = summary["smooth_window"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(3, 1.4))
    base = smoothed(runs[reference]["losses"], window)
    for (name, run), colour in zip(runs.items(), ("tab:blue", "tab:orange", "tab:gray")):
        steps = range(1, len(run["losses"]) + 1)
        curve = smoothed(run["losses"], window)
        top.plot(steps, run["losses"], color=colour, alpha=0.2, linewidth=0.8)
        top.plot(steps, curve, color=colour, linewidth=1.8, label=f"{name} (final {curve[-1]:.3f})")
        if name != reference:
            bottom.plot(steps, [x - y for x, y in zip(curve, base)], color=colour, linewidth=1.5,
                        label=f"{name} minus {reference}")
    top.set_ylabel("training loss (next-token cross entropy)")
    top.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    top.legend()
    bottom.axhline(0.0, color="black", linewidth=0.6)
    bottom.set_xlabel("step")
    bottom.set_ylabel(f"difference\n(mean of {window} steps)")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def describe(a) -> str:
    """The run's shape, for the table's heading and the picture's title."""
    which = "FLA's KDAForCausalLM, " if getattr(a, "model", "study") == "fla" else ""
    return (f"{which}{a.layers} KDA layers x {a.heads} heads of 128, batch {a.batch} x T {a.T}, vocab {a.vocab}, "
            f"segments of {a.min_period}-{a.max_period} tokens, {a.steps} steps")


def ours_text(our_forward: str) -> str:
    """What run 2 ran, in words: "kernel.chunk_kda (our forward, our backward)" or FLA's forward."""
    return f"kernel.chunk_kda ({OUR_FORWARDS[our_forward]}, our backward)"


def title(our_forward: str, shape: str) -> str:
    return f"KDA LM, FLA's chunk_kda vs {ours_text(our_forward)}: {shape}"


def replot(a) -> int:
    record = json.loads(a.replot.read_text())
    cfg = argparse.Namespace(**record["config"])
    # run 1 comes first in every record; one made before --our-forward ran FLA's forward in run 2
    plot(record["runs"], record["summary"], a.out,
         title(getattr(cfg, "our_forward", OUR_FORWARD_BEFORE), describe(cfg)), reference=next(iter(record["runs"])))
    print(f"wrote {a.out} from {a.replot} ({record['device']}, torch {record['torch']}, fla {record['fla']})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.replot is not None:
        return replot(a)
    try:
        import torch
    except ImportError as exc:
        print(f"{PROG} needs torch ({exc})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{PROG} needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    try:
        import fla
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except ImportError as exc:
        print(f"{PROG} needs fla-core 0.6.0 ({exc})", file=sys.stderr)
        return 2
    import kernel
    from kernel import chunk_kda as our_chunk_kda

    if a.model == "fla":
        try:
            build_model(argparse.Namespace(**{**vars(a), "layers": 1, "heads": 1}))
        except ImportError as exc:
            print(f"{PROG} --model fla needs flash-linear-attention 0.6.0 and transformers ({exc})", file=sys.stderr)
            return 2
    fla_run, our_run, noise_run = (f"FLA's chunk_kda, seed {a.seed}", f"{ours_text(a.our_forward)}, seed {a.seed}",
                                   f"FLA's chunk_kda, seed {a.noise_seed}")
    plan = ((fla_run, fla_chunk_kda, a.seed), (our_run, our_chunk_kda, a.seed), (noise_run, fla_chunk_kda, a.noise_seed))
    shape = describe(a)
    print(f"{shape}, on {torch.cuda.get_device_name()}; FLA's first call compiles and autotunes its kernels",
          flush=True)
    runs = {}
    for label, kda, seed in plan:
        ours = kda is not fla_chunk_kda
        route = kernel.patched_fla if (ours and a.model == "fla") else None
        with kernel.using_forward(a.our_forward) if ours else contextlib.nullcontext():
            runs[label] = {"implementation": ("kernel.patch_fla()" if route else "kernel.chunk_kda") if ours else "fla",
                           **({"forward": a.our_forward} if ours else {}),
                           "seed": seed, **train(kda, a, seed, device="cuda", label=label, route=route,
                                                 log=lambda s: print(s, flush=True))}
    summary = summarize(runs, a.smooth, reference=fla_run, same_seed=our_run, other_seed=noise_run)
    print("\n" + table(runs, summary))
    plot(runs, summary, a.out, title(a.our_forward, shape), reference=fla_run)
    print(f"\nwrote {a.out}")
    if a.json is not None:
        record = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                  "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "fla": getattr(fla, "__version__", "unknown"), "runs": runs, "summary": summary}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(record, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
