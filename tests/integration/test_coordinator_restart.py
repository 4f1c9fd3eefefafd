"""A coordinator that stops gracefully (SIGTERM: systemd, a rolling update, a
certificate rotation) and starts again on the same state directory, with real
agents and ranks (issue 24, item 5): its stop is not the nodes' failure, so a
running job trains on through it and finishes with every loss equal, bit for
bit, to an undisturbed run and no restart counted; a job in the middle of a
whole-job restart when the coordinator stops has that restart finished by the
next coordinator (exits counted again, the backoff it stored kept) and counted
once; and a watch after the restart still replays every step from the first."""

import json
import os
import signal
import subprocess
import time
import unittest

from loom_cluster import Cluster, wait_until, pid_alive
from test_fault_tolerance import Watch, job_spec


def replayed_steps(cluster, job):
    """What `loomctl watch` of an ended job prints: its stored step series."""
    out = cluster.loomctl("watch", job, "--format=jsonl", timeout=60).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


class CoordinatorRestart(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)

    def sigterm_coordinator(self):
        c = self.cluster
        c.kill(c.coordinator, signal.SIGTERM)
        code = c.coordinator.wait(timeout=30)
        self.assertEqual(code, 0, c.log("coordinator.log")[-3000:])

    def reference(self, steps, ckpt):
        """Losses of an undisturbed run of the same spec, every step: a live
        watch that lags sees consecutive steps coalesced, the replay of the
        ended job has them all."""
        c = self.cluster
        job = c.submit(job_spec("reference", 2, steps=steps, ckpt=ckpt), "reference")
        watch = Watch(c, job)
        self.assertEqual(watch.wait(), 0, c.status(job))
        return {s["step"]: s["loss"] for s in replayed_steps(c, job)}

    def test_sigterm_mid_run_the_job_trains_on_bit_for_bit_with_no_restart(self):
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", "cpu:2")
        steps = 1500  # long enough to outlive the coordinator's restart
        reference = self.reference(steps, ckpt=500)
        self.assertEqual(sorted(reference), list(range(1, steps + 1)))

        job = c.submit(job_spec("survivor", 2, steps=steps, ckpt=500), "survivor")
        watch = Watch(c, job)
        wait_until(lambda: any(s["step"] >= 5 for s in watch.steps), 120, "step 5")
        ranks = c.trainer_pids()
        self.assertEqual(len(ranks), 2)
        self.sigterm_coordinator()
        self.assertNotIn("RESTARTING", c.log("coordinator.log"))
        c.start_coordinator()
        # The same rank processes carry on through the stop and the restart.
        self.assertTrue(all(pid_alive(p) for p in ranks))
        self.assertEqual(watch.wait(), 0, c.status(job))
        status = c.status(job)
        self.assertIn("restarts 0", status)
        self.assertNotIn("RESTARTING", c.log("coordinator.log"))
        self.assertEqual({s["attempt"] for s in watch.steps}, {1})
        losses = watch.losses(1)
        self.assertEqual(max(losses), steps)
        for step, loss in losses.items():
            self.assertEqual(loss, reference[step], f"step {step} differs from the undisturbed run")
        # The step series was stored: a watch now replays the whole run, the
        # steps from before the stop included.
        replay = replayed_steps(c, job)
        self.assertEqual([s["step"] for s in replay], list(range(1, steps + 1)))
        self.assertEqual({s["step"]: s["loss"] for s in replay}, reference)

    def test_sigterm_during_a_whole_job_restart_the_next_coordinator_finishes_it(self):
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", "cpu:2")
        steps, ckpt = 300, 4
        reference = self.reference(steps, ckpt)

        # A backoff long enough that the restart is still under way when the
        # coordinator stops.
        job = c.submit(job_spec("recovering", 2, steps=steps, ckpt=ckpt,
                                extra_ft="restart_backoff_s: 12"), "recovering")
        watch = Watch(c, job)
        wait_until(lambda: any(s["step"] >= 6 for s in watch.steps), 120, "step 6")
        victim = None
        for pid in c.trainer_pids():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"rank_1/" in f.read():
                    victim = pid
        self.assertIsNotNone(victim)
        os.kill(victim, signal.SIGKILL)
        c.wait_state(job, ("RESTARTING",), timeout=60)
        self.sigterm_coordinator()
        c.start_coordinator()
        self.assertEqual(c.state(job), "RESTARTING")
        self.assertEqual(watch.wait(timeout=300), 0, c.status(job))
        status = c.status(job)
        # The crash, counted once: the stop added nothing.
        self.assertIn("restarts 1: crash 1, hang 0, lost node 0", status)
        self.assertIn("attempt:   2", status)
        second = watch.losses(2)
        self.assertTrue(second, "the second attempt reported steps")
        self.assertEqual((min(second) - 1) % ckpt, 0, "resumed from a committed checkpoint")
        self.assertGreater(min(second), 1)
        self.assertEqual(max(second), steps)
        for step, loss in second.items():
            self.assertEqual(loss, reference[step], f"step {step} differs from the undisturbed run")
        # Both attempts' steps are replayed, the first attempt's from before the stop.
        replay = replayed_steps(c, job)
        self.assertEqual({s["attempt"] for s in replay}, {1, 2})
        self.assertEqual(min(s["step"] for s in replay if s["attempt"] == 1), 1)


if __name__ == "__main__":
    unittest.main()
