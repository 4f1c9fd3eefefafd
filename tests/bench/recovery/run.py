#!/usr/bin/python3
"""In-place recovery against the whole-job restart, through the real binaries
(a coordinator, agents of two CPU devices each, trainers on loopback), for a
4-rank and an 8-rank data-parallel CPU job (2 and 4 nodes of 2 ranks). A
benchmark, not a test: it prints numbers and asserts none of them; the
results are kept in results.md here and docs/fault_tolerance.md,
"Measured: in place against the whole job".

Per job size, on one cluster, the same spec four times:
  * uninterrupted with snapshots (in_place, snapshot_interval 1) and without
    (in_place: false, snapshot_interval 0), --repeat times each, alternated:
    the median step time (the trainer's step_seconds) of each, so the
    snapshot's cost per step;
  * one rank SIGKILLed after step --fail_after, once in place and once with
    in_place: false: the time from the kill, and from the coordinator's
    declaration (the incident's detect phase), to the next completed step,
    and the steps computed again (the last step reported before the failure
    minus the first step after it, plus one).

usage: tests/bench/recovery/run.py [--build=DIR] [--ranks=4,8] [--steps=80]
                                   [--fail_after=25] [--ckpt=10] [--repeat=2]
"""

import argparse
import os
import re
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 128, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: {batch}, micro_batch_size: 1, seq_len: 64,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: {ranks}, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 1}}
resources: {{device: cpu, ranks: {ranks}}}
checkpoint: {{dir: checkpoints, interval: {ckpt}, keep: 2}}
fault_tolerance: {{max_restarts: 2, hang_timeout_s: 0, in_place: {in_place},
                  snapshot_interval: {snap}, abort_timeout_s: 20}}
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(HERE, "..", "..", "..", "build"))
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--fail_after", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=2,
                        help="uninterrupted runs of each kind, alternated")
    parser.add_argument("--ckpt", type=int, default=10,
                        help="disk checkpoint interval (the whole-job path restores from it)")
    args = parser.parse_args()
    os.environ["LOOM_BUILD_DIR"] = os.path.abspath(args.build)
    from loom_cluster import Cluster, wait_until  # after LOOM_BUILD_DIR
    from test_fault_tolerance import Watch, incident_lines

    def spec(name, ranks, in_place):
        return SPEC.format(name=name, steps=args.steps, batch=2 * ranks, ranks=ranks,
                           ckpt=args.ckpt, in_place="true" if in_place else "false",
                           snap=1 if in_place else 0)

    def rank_pid(cluster, rank):
        for pid in cluster.trainer_pids():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f"attempt_1/rank_{rank}/".encode() in f.read():
                    return pid
        return None

    def uninterrupted(cluster, ranks, in_place):
        name = f"plain-{ranks}-{'snap' if in_place else 'nosnap'}-{time.monotonic_ns()}"
        job = cluster.submit(spec(name, ranks, in_place), name)
        watch = Watch(cluster, job)
        if watch.wait(timeout=600) != 0:
            raise SystemExit(f"{name} failed:\n{cluster.status(job)}")
        # Past the first steps (warm-up, the first snapshot's buffers).
        return [s["step_seconds"] for s in watch.steps if s["step"] > 3]

    def failed(cluster, ranks, in_place):
        name = f"kill-{ranks}-{'inplace' if in_place else 'wholejob'}"
        job = cluster.submit(spec(name, ranks, in_place), name)
        watch = Watch(cluster, job)
        wait_until(lambda: any(s["step"] >= args.fail_after for s in watch.steps), 300,
                   f"step {args.fail_after}")
        victim = ranks // 2  # on the job's second node
        pid = rank_pid(cluster, victim)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        if watch.wait(timeout=600) != 0:
            raise SystemExit(f"{name} failed:\n{cluster.status(job)}")
        status = cluster.status(job)
        incidents = incident_lines(status)
        # Reports of attempt 1 still in flight at the kill count too.
        first = [s for s in watch.steps if s["attempt"] == 1]
        later = [s for s in watch.steps if s["attempt"] > 1]
        detect = float(re.search(r"detect (\d+\.\d+)s", incidents[0]).group(1))
        to_step = later[0]["time_unix_ms"] / 1000.0 - killed_at
        return {
            "path": "in place" if in_place else "whole job",
            "failure_to_step_s": round(to_step, 2),
            "detection_to_step_s": round(to_step - detect, 2),
            "steps_recomputed": max(s["step"] for s in first) - later[0]["step"] + 1,
            "last_step_before": max(s["step"] for s in first),
            "first_step_after": later[0]["step"],
            "incident": incidents[0],
        }

    for ranks in [int(r) for r in args.ranks.split(",")]:
        cluster = Cluster(f"bench-recovery-{ranks}")
        try:
            cluster.start_coordinator()
            nodes = ranks // 2
            for i in range(nodes):
                cluster.start_agent(f"node-{chr(ord('a') + i)}", "cpu:2")
            wait_until(lambda: cluster.metric_value("loom_nodes_live") == nodes, 60, "the nodes")
            snap_steps, plain_steps = [], []
            for _ in range(args.repeat):
                plain_steps += uninterrupted(cluster, ranks, False)
                snap_steps += uninterrupted(cluster, ranks, True)
            snap = statistics.median(snap_steps)
            plain = statistics.median(plain_steps)
            print(f"ranks {ranks}: median step {plain * 1000:.1f} ms without snapshots, "
                  f"{snap * 1000:.1f} ms with snapshot_interval 1 "
                  f"({(snap / plain - 1) * 100:+.1f}%; {len(plain_steps)} and {len(snap_steps)} steps "
                  f"of {args.repeat} runs each)", flush=True)
            for in_place in (True, False):
                r = failed(cluster, ranks, in_place)
                print(f"ranks {ranks}: {r['path']}: failure -> next step {r['failure_to_step_s']} s, "
                      f"detection -> next step {r['detection_to_step_s']} s, "
                      f"{r['steps_recomputed']} steps recomputed (last step {r['last_step_before']} "
                      f"before, first {r['first_step_after']} after)\n  {r['incident']}",
                      flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
