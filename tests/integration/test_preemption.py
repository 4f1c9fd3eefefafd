"""Graceful stops through the real binaries (docs/scheduling.md, "Preemption,
drain and signals"): a coordinator, two agents of two CPU devices each, real
trainers on loopback. Checkpoints are on but their interval is longer than
the runs: the only checkpoint a job has before it ends is the one its stop
saves, so a step lost or recomputed would show.

- Preemption: a priority-0 dp4 job holds all four devices; a priority-5 dp2
  job is submitted. The low job stops after a step, saved, and is PREEMPTED;
  the high job runs and ends; the low job resumes from exactly that step and
  finishes. Its losses equal an uninterrupted run's bit for bit and no step
  is trained twice; no restart is counted.
- Drain: `loomctl drain NODE` moves a dp2 job off its node the same way; the
  node shows as drained and takes no work until uncordoned.
- An agent's SIGTERM drains its node the same way, and the agent exits 0.
- SIGUSR1 to one rank (a batch system's warning before its time limit) stops
  the whole job after the same step; it resumes and ends bit for bit."""

import os
import signal
import unittest

from loom_cluster import Cluster, placement, wait_until
from test_elastic import history
from test_fault_tolerance import Watch

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
checkpoint: {{dir: ckpt, interval: 1000}}
scheduling: {{priority: {priority}}}
fault_tolerance: {{max_restarts: 0, hang_timeout_s: 20}}
"""
STEPS = 120
STOP_AFTER = 10  # the stop is asked once this step is reported


def spec(name, ranks, priority=0, steps=STEPS):
    return SPEC.format(name=name, ranks=ranks, priority=priority, steps=steps)


class GracefulStops(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        c = self.cluster
        c.start_coordinator(["--hang_floor_s=5", "--stop_grace_s=60"])
        for name in ("node-a", "node-b"):
            c.start_agent(name, "cpu:2", extra=["--drain_grace_s=60"])
        wait_until(lambda: c.metric_value("loom_nodes_live") == 2, 30, "two nodes")

    def reference(self, ranks):
        c = self.cluster
        job = c.submit(spec(f"reference-{ranks}", ranks), f"reference-{ranks}")
        watch = Watch(c, job)
        self.assertEqual(watch.wait(), 0, c.status(job))
        losses = watch.losses(1)
        self.assertEqual(sorted(losses), list(range(1, STEPS + 1)))
        return losses

    def stop_when_past(self, job, watch, stop):
        """Calls stop() once the job reported STOP_AFTER steps; returns the
        job's history once it is PREEMPTED."""
        c = self.cluster
        wait_until(lambda: any(s["step"] >= STOP_AFTER for s in watch.steps), 120,
                   f"step {STOP_AFTER}")
        stop()
        wait_until(lambda: any("stopped after step" in line for line in history(c.status(job))),
                   120, "the graceful stop")
        return c.status(job)

    def expect_resumed_exactly(self, job, watch, expected):
        """The job ran to the end over two attempts: the first stopped after
        step S (saved), the second resumed after S; every step trained once,
        every loss the reference's, no restart counted."""
        c = self.cluster
        self.assertEqual(watch.wait(), 0, c.status(job))
        status = c.status(job)
        first, second = watch.losses(1), watch.losses(2)
        stopped = max(first)
        self.assertGreaterEqual(stopped, STOP_AFTER)
        self.assertEqual(sorted(first), list(range(1, stopped + 1)))
        self.assertEqual(sorted(second), list(range(stopped + 1, STEPS + 1)))  # none twice
        for step, loss in {**first, **second}.items():
            self.assertEqual(loss, expected[step], f"step {step} differs")  # bit for bit
        lines = history(status)
        self.assertTrue(any(f"stopped after step {stopped} with a checkpoint of it" in line
                            for line in lines), status)
        self.assertIn("(restarts 0:", status)
        self.assertIn("preempted: 1 times", status)
        return status

    def test_a_higher_priority_job_preempts_and_the_low_one_resumes_bit_for_bit(self):
        c = self.cluster
        expected = self.reference(4)
        low = c.submit(spec("low", 4), "low")
        watch = Watch(c, low)
        high = []
        status = self.stop_when_past(
            low, watch, lambda: high.append(c.submit(spec("high", 2, priority=5, steps=20),
                                                     "high")))
        self.assertIn(f"preempted by {high[0]} (priority 5)", status)
        self.assertEqual(c.wait_state(high[0], ("SUCCEEDED", "FAILED")), "SUCCEEDED",
                         c.status(high[0]))
        status = self.expect_resumed_exactly(low, watch, expected)
        # The high job started only once the low one had stopped.
        high_status = c.status(high[0])
        self.assertIn("SUCCEEDED", high_status)

    def test_drain_moves_a_job_off_its_node_without_losing_a_step(self):
        c = self.cluster
        expected = self.reference(2)
        job = c.submit(spec("drained", 2), "drained")
        watch = Watch(c, job)
        wait_until(lambda: watch.steps, 120, "the first step")
        node = set(placement(c.status(job)).values())
        self.assertEqual(len(node), 1)
        node = node.pop()
        status = self.stop_when_past(
            job, watch, lambda: c.loomctl("drain", node, "--reason=disk errors"))
        self.assertIn(f"node {node} drained: disk errors (by admin)", status)
        nodes = c.loomctl("nodes").stdout
        self.assertIn("drained: disk errors", nodes)
        status = self.expect_resumed_exactly(job, watch, expected)
        self.assertNotIn(node, set(placement(status).values()))  # went on elsewhere
        c.loomctl("uncordon", node)
        self.assertNotIn("drained", c.loomctl("nodes").stdout)

    def test_sigterm_to_an_agent_drains_its_node_and_the_agent_exits_zero(self):
        c = self.cluster
        expected = self.reference(2)
        job = c.submit(spec("evicted", 2), "evicted")
        watch = Watch(c, job)
        wait_until(lambda: watch.steps, 120, "the first step")
        node = set(placement(c.status(job)).values()).pop()
        agent = c.agents[node]
        status = self.stop_when_past(job, watch, lambda: c.kill(agent, signal.SIGTERM))
        self.assertIn(f"node {node} drained: its agent is shutting down", status)
        self.assertEqual(agent.wait(timeout=60), 0)  # left once its ranks had stopped
        status = self.expect_resumed_exactly(job, watch, expected)
        self.assertNotIn(node, set(placement(status).values()))

    def test_sigusr1_to_one_rank_stops_the_whole_job_and_it_resumes_bit_for_bit(self):
        c = self.cluster
        expected = self.reference(2)
        job = c.submit(spec("signalled", 2), "signalled")
        watch = Watch(c, job)

        def signal_rank_1():
            pids = {rank: pid for (attempt, rank), pid in c.rank_pids().items() if attempt == 1}
            os.kill(pids[1], signal.SIGUSR1)

        status = self.stop_when_past(job, watch, signal_rank_1)
        self.assertIn("was asked to stop (a signal from outside)", status)
        self.expect_resumed_exactly(job, watch, expected)


if __name__ == "__main__":
    unittest.main()
