"""Elastic jobs through the real binaries (docs/fault_tolerance.md, "Elastic
jobs"): a coordinator, two agents of two CPU devices each and a third started
as a cluster spare (loom-worker --spare), real trainers on loopback.

Hot spare: a dp4 job is placed on the two ordinary nodes, never on the spare;
a second job that would need the spare's devices waits PENDING (a spare is no
job's first placement). Once step 10 is reported the job's second node is
lost (its agent and ranks killed together): its two ranks move to the spare
through the in-place path, the layout is unchanged, and every loss equals the
uninterrupted run's bit for bit. `loomctl nodes` names the spare."""

import os
import signal
import time
import unittest

from loom_cluster import Cluster, placement, wait_until
from test_fault_tolerance import Watch, incident_lines

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2,
        ffn_hidden_size: 64, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: 8, micro_batch_size: 1, seq_len: 32,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: {ranks}, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 1, schedule: 1f1b}}
resources: {{device: cpu, ranks: {ranks}}}
fault_tolerance: {{max_restarts: 2, hang_timeout_s: 4, abort_timeout_s: 20}}
"""
STEPS = 80
FAIL_AFTER = 10


def spec(name, ranks=4, steps=STEPS):
    return SPEC.format(name=name, ranks=ranks, steps=steps)


class HotSpare(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        c = self.cluster
        c.start_coordinator(["--hang_floor_s=1"])
        for name in ("node-a", "node-b"):
            c.start_agent(name, "cpu:2")
        c.start_agent("node-s", "cpu:2", extra=["--spare"])
        wait_until(lambda: c.metric_value("loom_nodes_live") == 3, 30, "three nodes")

    def test_a_lost_node_moves_to_the_spare(self):
        c = self.cluster
        nodes = c.loomctl("nodes")
        spare_line = [line for line in nodes.splitlines() if line.startswith("node-s")]
        self.assertEqual(len(spare_line), 1, nodes)
        self.assertIn("spare", spare_line[0])

        reference = c.submit(spec("spare-reference"), "spare-reference")
        watch = Watch(c, reference)
        wait_until(lambda: watch.steps, 120, "the reference's first step")
        self.assertNotIn("node-s", set(placement(c.status(reference)).values()))
        # Every ordinary device is taken: a second job waits, the spare is not given to it.
        other = c.submit(spec("waits", ranks=2, steps=2), "waits")
        time.sleep(3)
        self.assertEqual(c.state(other), "PENDING", c.status(other))
        self.assertEqual(watch.wait(), 0, c.status(reference))
        expected = watch.losses(1)
        self.assertEqual(sorted(expected), list(range(1, STEPS + 1)))
        self.assertEqual(c.wait_state(other, ("SUCCEEDED", "FAILED")), "SUCCEEDED", c.status(other))

        job = c.submit(spec("spare-moved"), "spare-moved")
        watch = Watch(c, job)
        wait_until(lambda: any(s["step"] >= FAIL_AFTER for s in watch.steps), 120,
                   f"step {FAIL_AFTER}")
        before = placement(c.status(job))
        self.assertNotIn("node-s", set(before.values()))
        lost = before[2]
        failed = sorted(r for r, n in before.items() if n == lost)
        pids = {rank: pid for (attempt, rank), pid in c.rank_pids().items() if attempt == 1}
        failed_at = time.time()
        c.kill(c.agents[lost], signal.SIGKILL)
        for r in failed:
            try:
                os.kill(pids[r], signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: any(s["attempt"] == 2 for s in watch.steps), 120, "attempt 2 steps")
        moved_at = min(s["time_unix_ms"] for s in watch.steps if s["attempt"] == 2) / 1000.0
        self.assertEqual(watch.wait(), 0, c.status(job))

        status = c.status(job)
        after = placement(status)
        for r in failed:
            self.assertEqual(after[r], "node-s", status)  # moved to the spare
        for r in set(before) - set(failed):
            self.assertEqual(after[r], before[r], status)  # the survivors stayed
        self.assertIn("layout:    dp=4 tp=1 pp=1 cp=1 ep=1", status)  # unchanged
        losses = dict(watch.losses(1))
        losses.update(watch.losses(2))
        self.assertEqual(sorted(losses), list(range(1, STEPS + 1)))
        for step, loss in losses.items():
            self.assertEqual(loss, expected[step], f"step {step} differs")  # bit for bit
        incidents = incident_lines(status)
        self.assertEqual(len(incidents), 1, status)
        self.assertTrue(incidents[0].startswith("node_lost"), incidents[0])
        self.assertIn("in place", incidents[0])
        print(f"\nnode lost -> first step on the spare: {moved_at - failed_at:.2f} s"
              f"\n  {incidents[0]}")


if __name__ == "__main__":
    unittest.main()
