#!/usr/bin/env python3
"""Compares the per-step training losses of two loom-trainer runs of the same
job (scripts/device/jobs/small_*.yaml: same model, data, seed and batches;
only resources.device and train.precision differ), read from their
--progress_format=jsonl output. Prints one row per step and PASS or FAIL with
the numbers; exit status 0 only on PASS.

  compare_losses.py REF.jsonl TEST.jsonl [--step-tol 0.02] [--mean-tol 0.01] [--last 5]

PASS needs: the same steps in both runs, every loss finite, |test - ref| /
ref <= --step-tol at every step and <= --mean-tol on the mean of the last
--last steps, and both losses falling by at least --min-drop (relative) from
the first step to the mean of the last steps (the runs trained).

Default tolerances are for bf16 against fp32 (docs/gpu.md, "Left to run on a
device"): bf16 keeps 8 significant bits (relative rounding up to 2^-9), so each
GEMM input and stored activation moves by up to 0.2%, unbiased. Measured on the
small job (20 steps, lr 1e-3) with the CPU's bf16 emulation against fp32: at
most 0.11% at any step, 0.02% on the last-5 mean. 2% per step and 1% on the
last-5 mean (about 20x and 50x that) leave room for the GPU's other summation
order, bf16 attention and bf16 storage, and still catch a wrong kernel: this
loss falls from 5.5 to 1.9 in 20 steps, and a wrong gradient bends that
curve by far more than 2% within a few steps.
"""
import argparse
import json
import math
import sys


def read_losses(path):
    losses = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if "step" in row and "loss" in row:
                losses[int(row["step"])] = float(row["loss"])
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("test")
    ap.add_argument("--step-tol", type=float, default=0.02)
    ap.add_argument("--mean-tol", type=float, default=0.01)
    ap.add_argument("--last", type=int, default=5)
    ap.add_argument("--min-drop", type=float, default=0.10)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    ref, test = read_losses(a.ref), read_losses(a.test)
    label = a.label or f"{a.test} vs {a.ref}"
    problems = []
    if not ref or not test:
        problems.append(f"no progress rows (ref {len(ref)}, test {len(test)})")
    if sorted(ref) != sorted(test):
        problems.append(f"steps differ: ref {sorted(ref)[:3]}..{len(ref)}, test "
                        f"{sorted(test)[:3]}..{len(test)}")
    steps = sorted(set(ref) & set(test))
    worst = (0.0, None)
    print(f"{'step':>4} {'ref':>9} {'test':>9} {'rel diff':>9}")
    for s in steps:
        r, t = ref[s], test[s]
        if not (math.isfinite(r) and math.isfinite(t)):
            problems.append(f"step {s}: loss not finite (ref {r}, test {t})")
            print(f"{s:>4} {r:>9.4f} {t:>9.4f} {'nan':>9}")
            continue
        rel = abs(t - r) / abs(r)
        if rel > worst[0]:
            worst = (rel, s)
        print(f"{s:>4} {r:>9.4f} {t:>9.4f} {rel:>9.2%}")
    mean_rel = float("nan")
    if steps and not problems:
        tail = steps[-a.last:]
        mr = sum(ref[s] for s in tail) / len(tail)
        mt = sum(test[s] for s in tail) / len(tail)
        mean_rel = abs(mt - mr) / mr
        if worst[0] > a.step_tol:
            problems.append(f"step {worst[1]}: {worst[0]:.2%} > {a.step_tol:.2%} per step")
        if mean_rel > a.mean_tol:
            problems.append(f"last-{len(tail)} mean {mt:.4f} vs {mr:.4f}: {mean_rel:.2%} > "
                            f"{a.mean_tol:.2%}")
        for name, losses, m in (("ref", ref, mr), ("test", test, mt)):
            drop = 1 - m / losses[steps[0]]
            if drop < a.min_drop:
                problems.append(f"{name} loss fell only {drop:.1%} ({losses[steps[0]]:.4f} -> "
                                f"{m:.4f}), less than {a.min_drop:.0%}")
    verdict = "PASS" if not problems else "FAIL"
    print(f"{verdict} {label}: {len(steps)} steps, worst step diff {worst[0]:.2%} (step {worst[1]}; "
          f"tol {a.step_tol:.1%}), last-{a.last} mean diff {mean_rel:.2%} (tol {a.mean_tol:.1%})"
          + ("" if not problems else "; " + "; ".join(problems)))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
