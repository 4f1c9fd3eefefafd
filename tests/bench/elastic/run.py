#!/usr/bin/python3
"""Elastic jobs against in-place recovery onto a spare, through the real
binaries (a coordinator, agents of two CPU devices each, trainers on
loopback), for a dp4 job (2 nodes of 2 ranks). A benchmark, not a test: it
prints numbers and asserts none of them; the results are kept in results.md
here and in docs/fault_tolerance.md, "Elastic jobs".

In one run, the same spec (checkpoints every --ckpt steps):
  * spare: a third node started as a cluster spare (loom-worker --spare); the
    job's second node (agent and ranks) is SIGKILLed after step --fail_after:
    the time from the kill to the first step on the spare (in place);
  * shrink and grow back: no spare, fault_tolerance.min_ranks 2; the same
    loss: the time from the kill to the first step on 2 ranks (the survivors
    write their in-memory snapshots of the restore step as a checkpoint step
    first, and the 2 ranks start from it); then the node
    is started again: the time from its start to the first step on 4 ranks
    (min_resize_interval_s 0 here, so the interval does not count), and the
    steps computed again at each resize.

usage: tests/bench/elastic/run.py [--build=DIR] [--steps=300] [--fail_after=25] [--ckpt=10]
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 128, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: 8, micro_batch_size: 1, seq_len: 64,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: 4, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 1}}
resources: {{device: cpu, ranks: 4}}
checkpoint: {{dir: checkpoints, interval: {ckpt}, keep: 2}}
fault_tolerance: {{max_restarts: 3, hang_timeout_s: 10, abort_timeout_s: 20, restart_backoff_s: 0,
                  min_ranks: {min_ranks}, min_resize_interval_s: 0}}
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(HERE, "..", "..", "..", "build"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--fail_after", type=int, default=25)
    parser.add_argument("--ckpt", type=int, default=10)
    args = parser.parse_args()
    os.environ["LOOM_BUILD_DIR"] = os.path.abspath(args.build)
    from loom_cluster import Cluster, placement, wait_until  # after LOOM_BUILD_DIR
    from test_fault_tolerance import Watch

    def cluster(name, spare):
        c = Cluster(name)
        c.start_coordinator(["--hang_floor_s=1"])
        for node in ("node-a", "node-b"):
            c.start_agent(node, "cpu:2")
        if spare:
            c.start_agent("node-s", "cpu:2", extra=["--spare"])
        wait_until(lambda: c.metric_value("loom_nodes_live") == (3 if spare else 2), 30, "nodes")
        return c

    def lose_second_node(c, job, watch):
        wait_until(lambda: any(s["step"] >= args.fail_after for s in watch.steps), 300, "steps")
        where = placement(c.status(job))
        lost = where[2]
        pids = {rank: pid for (attempt, rank), pid in c.rank_pids().items() if attempt == 1}
        last = max(s["step"] for s in watch.steps)
        at = time.time()
        c.kill(c.agents[lost], signal.SIGKILL)
        for r, n in where.items():
            if n == lost:
                try:
                    os.kill(pids[r], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return lost, at, last

    def first_step(watch, attempt_above):
        wait_until(lambda: any(s["attempt"] > attempt_above for s in watch.steps), 300, "a step")
        first = min((s for s in watch.steps if s["attempt"] > attempt_above),
                    key=lambda s: s["time_unix_ms"])
        return first["time_unix_ms"] / 1000.0, first["step"], first["attempt"]

    def recomputed(watch, attempt):
        """Steps the attempt after `attempt` computed again: the last step
        `attempt` reported minus the first the next one did, plus one."""
        last = max(s["step"] for s in watch.steps if s["attempt"] == attempt)
        first = min(s["step"] for s in watch.steps if s["attempt"] > attempt)
        return last - first + 1

    print(f"dp4 job, 2 nodes x 2 CPU ranks, checkpoints every {args.ckpt} steps, "
          f"node lost after step {args.fail_after}")
    c = cluster("bench-elastic-spare", spare=True)
    try:
        job = c.submit(SPEC.format(name="spare", steps=args.steps, ckpt=args.ckpt, min_ranks=0),
                       "spare")
        watch = Watch(c, job)
        _, at, _ = lose_second_node(c, job, watch)
        t, _, _ = first_step(watch, 1)
        watch.wait(timeout=600)
        print(f"  spare (in place):       node lost -> first step on the spare  {t - at:6.2f} s"
              f"  ({recomputed(watch, 1)} steps computed again)")
    finally:
        c.stop()

    c = cluster("bench-elastic-shrink", spare=False)
    try:
        job = c.submit(SPEC.format(name="shrink", steps=args.steps, ckpt=args.ckpt, min_ranks=2),
                       "shrink")
        watch = Watch(c, job)
        lost, at, _ = lose_second_node(c, job, watch)
        shrunk, _, attempt = first_step(watch, 1)
        back = time.time()
        c.start_agent(lost, "cpu:2")
        grown, _, _ = first_step(watch, attempt)
        watch.wait(timeout=600)
        print(f"  shrink (dp4 -> 2 ranks): node lost -> first step on 2 ranks  {shrunk - at:6.2f} s"
              f"  ({recomputed(watch, attempt - 1)} steps computed again)")
        print(f"  grow back (-> 4 ranks):  node started -> first step on 4 ranks {grown - back:6.2f} s"
              f"  ({recomputed(watch, attempt)} steps computed again)")
        print(c.status(job).split("history:\n", 1)[-1])
    finally:
        c.stop()


if __name__ == "__main__":
    main()
