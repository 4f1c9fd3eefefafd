"""In-place recovery through the real binaries (docs/fault_tolerance.md,
"In-place recovery"): a coordinator, three agents of two CPU devices each (a
job of four ranks spans two of them, the third is spare) and real trainers on
loopback. For each layout — dp4 ZeRO-1, tp2·pp2 (1F1B), cp2·dp2 — an
uninterrupted run gives the reference losses, then runs that each meet one
failure mid-run: a rank SIGKILLed, a rank SIGSTOPped (the hang's culprit), a
node lost (its agent and its ranks killed together); cp2·dp2 meets the crash
and the lost node only (the hang is the same path as the crash once its
culprit is named, and costs the hang timeout). Each: the job SUCCEEDS,
its losses equal the reference's bit for bit, the survivors' processes are the
same ones before and after, the recovery recomputed at most the step in
flight (no step is computed more than twice), and `loomctl status` names the
in-place path, the relaunched ranks and the steps recomputed. Checkpoints are
off: nothing is restored from disk. Each case prints the time from the
failure to the first step after it."""

import os
import signal
import time
import unittest

from loom_cluster import Cluster, pid_alive, placement, wait_until
from test_fault_tolerance import Watch, incident_lines

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2,
        ffn_hidden_size: 64, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: {batch}, micro_batch_size: 1, seq_len: 32,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: {dp}, tp: {tp}, pp: {pp}, cp: {cp}, ep: 1, zero_stage: {zero}, schedule: 1f1b}}
resources: {{device: cpu, ranks: 4}}
fault_tolerance: {{max_restarts: 2, hang_timeout_s: 4, abort_timeout_s: 20}}
"""

LAYOUTS = {
    "dp4-zero1": dict(dp=4, tp=1, pp=1, cp=1, zero=1, batch=8),
    "tp2-pp2": dict(dp=1, tp=2, pp=2, cp=1, zero=0, batch=4),
    "cp2-dp2": dict(dp=2, tp=1, pp=1, cp=2, zero=1, batch=4),
}
STEPS = 120
FAIL_AFTER = 10  # the failure lands once this step is reported


def spec(name, layout):
    return SPEC.format(name=name, steps=STEPS, **LAYOUTS[layout])


class InPlaceRecovery(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        c = self.cluster
        c.start_coordinator(["--hang_floor_s=1"])
        for name in ("node-a", "node-b", "node-c"):
            c.start_agent(name, "cpu:2")
        wait_until(lambda: c.metric_value("loom_nodes_live") == 3, 30, "three nodes")

    def reference(self, layout):
        c = self.cluster
        job = c.submit(spec(f"{layout}-reference", layout), f"{layout}-reference")
        watch = Watch(c, job)
        self.assertEqual(watch.wait(), 0, c.status(job))
        losses = watch.losses(1)
        self.assertEqual(sorted(losses), list(range(1, STEPS + 1)))
        return losses

    def fail_and_recover(self, layout, failure, reference):
        """Runs the layout, lets `failure` happen after step FAIL_AFTER, and
        checks the recovery was in place and changed nothing."""
        c = self.cluster
        name = f"{layout}-{failure}"
        job = c.submit(spec(name, layout), name)
        watch = Watch(c, job)
        wait_until(lambda: any(s["step"] >= FAIL_AFTER for s in watch.steps), 120,
                   f"step {FAIL_AFTER}")
        where = placement(c.status(job))
        self.assertEqual(sorted(where), [0, 1, 2, 3])
        before = {rank: pid for (attempt, rank), pid in c.rank_pids().items() if attempt == 1}
        self.assertEqual(sorted(before), [0, 1, 2, 3], c.rank_pids())
        victim = 2  # on the job's second node; its buddy is rank 0
        failed_at = time.time()
        if failure == "sigkill":
            os.kill(before[victim], signal.SIGKILL)
            failed = {victim}
        elif failure == "sigstop":
            os.kill(before[victim], signal.SIGSTOP)
            failed = {victim}
        else:  # the node of rank 2, its agent and ranks together
            node = where[victim]
            failed = {r for r, n in where.items() if n == node}
            c.kill(c.agents[node], signal.SIGKILL)
            for r in failed:
                try:
                    os.kill(before[r], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        survivors = sorted(set(before) - failed)

        # Attempt 2 steps: the survivors are the same processes.
        wait_until(lambda: any(s["attempt"] == 2 for s in watch.steps), 120,
                   "a step of attempt 2")
        recovered = min(s["time_unix_ms"] for s in watch.steps if s["attempt"] == 2) / 1000.0
        now = c.rank_pids()
        for r in survivors:
            self.assertTrue(pid_alive(before[r]), f"survivor rank {r} is gone")
            self.assertEqual(now.get((1, r)), before[r], f"rank {r}: {now}")
        for r in failed:
            self.assertIn((2, r), now, f"rank {r} was relaunched in attempt 2: {now}")
            self.assertNotEqual(now[(2, r)], before[r])
        self.assertEqual(watch.wait(), 0, c.status(job))

        # Every step of the run equals the uninterrupted one's, bit for bit.
        first, second = watch.losses(1), watch.losses(2)
        self.assertEqual(max(second), STEPS)
        for step, loss in list(first.items()) + list(second.items()):
            self.assertEqual(loss, reference[step], f"{name}: step {step} differs")
        # At most the step in flight is computed again, or two when the failed
        # rank's copy of the step before was still on its way to its buddy
        # (common/snapshot_generations.h); no step is computed more than twice.
        recomputed = max(first) - (min(second) - 1)
        self.assertLessEqual(recomputed, 2, f"{name}: attempt 1 to {max(first)}, "
                                            f"attempt 2 from {min(second)}")
        self.assertEqual(sorted(set(first) | set(second)), list(range(1, STEPS + 1)))

        status = c.status(job)
        self.assertIn("state:     SUCCEEDED", status)
        incidents = incident_lines(status)
        self.assertEqual(len(incidents), 1, status)
        ranks = ",".join(str(r) for r in sorted(failed))
        ranks = ranks if len(failed) == 1 else f"{min(failed)}-{max(failed)}"
        kind = {"sigkill": "crash", "sigstop": "hang", "node": "node_lost"}[failure]
        self.assertTrue(incidents[0].startswith(kind), incidents[0])
        self.assertRegex(incidents[0],
                         rf"; in place, relaunched ranks? {ranks}, [012] steps? recomputed$")
        self.assertIn("abort", incidents[0])
        print(f"\n{name}: failure -> first step of attempt 2: {recovered - failed_at:.2f} s"
              f"\n  {incidents[0]}")

    def run_layout(self, layout, failures=("sigkill", "sigstop", "node")):
        reference = self.reference(layout)
        for failure in failures:
            with self.subTest(layout=layout, failure=failure):
                self.fail_and_recover(layout, failure, reference)

    def test_dp4_zero1(self):
        self.run_layout("dp4-zero1")

    def test_tp2_pp2(self):
        self.run_layout("tp2-pp2")

    def test_cp2_dp2(self):
        self.run_layout("cp2-dp2", ("sigkill", "node"))


if __name__ == "__main__":
    unittest.main()
