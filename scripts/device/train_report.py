#!/usr/bin/env python3
"""Throughput and MFU of loom-trainer runs, and the final table of
scripts/device/gpu_train_check.sh beside PyTorch's step.

  train_report.py throughput PROGRESS.jsonl --label loom-bf16 --precision bf16 \
      --peak 989.5e12 [--bf16-peak 989.5e12] [--skip 3] >> results.jsonl
      one JSON object: steady-state (median over the steps after the first
      --skip) step seconds and tokens/s, the trainer's own flops_per_token,
      MFU = flops_per_token * tokens/s / peak (the run's dtype peak, from
      loom-device-peaks), and MFU against the bf16 peak for comparing fp8
      with bf16 runs
  train_report.py table results.jsonl
      one row per result (loom-trainer runs and torch_llama_step.py's RESULT
      object), with the ratio of each run's tokens/s to PyTorch's
"""
import argparse
import json
import statistics
import sys


def progress_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                if "step" in row:
                    rows.append(row)
    return rows


def throughput(a):
    try:
        rows = progress_rows(a.progress)
    except OSError:
        rows = []
    if not rows:
        print(json.dumps({"impl": "loom", "label": a.label, "precision": a.precision,
                          "error": f"no progress rows in {a.progress}"}))
        return 1
    steady = rows[a.skip:] if len(rows) > a.skip else rows[-1:]
    step_s = statistics.median(r["step_seconds"] for r in steady)
    tok_s = statistics.median(r["tokens_per_second"] for r in steady)
    fpt = rows[-1].get("flops_per_token", 0.0)
    out = {
        "impl": "loom", "label": a.label, "precision": a.precision, "steps": len(rows),
        "timed_steps": len(steady), "step_seconds_median": step_s, "tokens_per_second": tok_s,
        "flops_per_token": fpt, "peak_flops": a.peak or None,
        "mfu": fpt * tok_s / a.peak if a.peak > 0 and fpt > 0 else None,
        "mfu_vs_bf16_peak": fpt * tok_s / a.bf16_peak if a.bf16_peak > 0 and fpt > 0 else None,
        "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
        "peak_rss_bytes": rows[-1].get("peak_rss_bytes"),
        # The device allocator's peak over the steps (docs/planner.md compares
        # it with the planner's memory estimate for this job).
        "max_memory_bytes": max((r.get("peak_device_bytes", 0) for r in rows), default=0) or None,
    }
    print(json.dumps(out))
    return 0


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def table(a):
    results = []
    with open(a.results) as f:
        for line in f:
            line = line.strip()
            if line.startswith("RESULT "):
                line = line[len("RESULT "):]
            if line.startswith("{"):
                results.append(json.loads(line))
    torch_tps = next((r["tokens_per_second"] for r in results
                      if r.get("impl") == "pytorch" and r.get("tokens_per_second")), None)
    print(f"{'run':<16} {'dtype':<5} {'step_s':>8} {'tokens/s':>10} {'MFU':>6} {'MFU@bf16':>8} "
          f"{'vs torch':>8} {'loss first->last':>17} {'FLOP/token':>10} {'mem GiB':>7}")
    for r in results:
        if r.get("error"):
            print(f"{r.get('label', r.get('impl')):<16} {r.get('precision', ''):<5} ERROR {r['error']}")
            continue
        label = r.get("label") or ("pytorch" + ("-compiled" if r.get("compiled") else ""))
        dtype = r.get("precision") or ("bf16" if r.get("autocast") == "bf16" else "fp32")
        mfu_bf16 = r.get("mfu_vs_bf16_peak", r.get("mfu"))
        losses = r.get("losses")
        first = r.get("first_loss", losses[0] if losses else None)
        last = r.get("last_loss", losses[-1] if losses else None)
        ratio = r["tokens_per_second"] / torch_tps if torch_tps else None
        print(f"{label:<16} {dtype:<5} {fmt(r.get('step_seconds_median'), '8.3f'):>8} "
              f"{fmt(r.get('tokens_per_second'), '10.0f'):>10} {fmt(r.get('mfu'), '6.1%'):>6} "
              f"{fmt(mfu_bf16, '8.1%'):>8} {fmt(ratio, '7.2f') + ('x' if ratio else ''):>8} "
              f"{fmt(first, '.3f'):>8}->{fmt(last, '.3f'):<8} {fmt(r.get('flops_per_token'), '10.3g'):>10} "
              f"{fmt(r['max_memory_bytes'] / 2**30 if r.get('max_memory_bytes') else None, '7.1f'):>7}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("progress")
    t.add_argument("--label", required=True)
    t.add_argument("--precision", required=True)
    t.add_argument("--peak", type=float, default=0.0)
    t.add_argument("--bf16-peak", type=float, default=0.0)
    t.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    g = sub.add_parser("table")
    g.add_argument("results")
    a = ap.parse_args()
    return throughput(a) if a.cmd == "throughput" else table(a)


if __name__ == "__main__":
    sys.exit(main())
