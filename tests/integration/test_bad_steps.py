"""Bad steps through coordinator, agent and trainers (docs/fault_tolerance.md,
"Bad steps"): a dp2 ZeRO-1 CPU job on one node, run three times. Plain; with
a NaN written into rank 1's gradient at step K (LOOM_TEST_FAULT nan_grad@K#1):
step K is not applied and the job runs on to SUCCEEDED; with a loss spike at
step K (loss_spike@K) and fault_tolerance.loss_spike_factor set: step K is
rolled back to the snapshot of step K-1 and its batch skipped. Both bad runs
leave batch K out, so their losses agree bit for bit at every other step;
before K they equal the plain run's, after it they do not. Each step is
reported once, and loomctl status names the skipped step."""

import os
import unittest

from loom_cluster import Cluster, tiny_job
from test_fault_tolerance import Watch

STEPS = 10
K = 6


def spec(name):
    return tiny_job(name=name, steps=STEPS, ranks=2, eval_interval=0, ckpt_interval=0).replace(
        "zero_stage: 0", "zero_stage: 1").replace(
        "hang_timeout_s: 0}", "hang_timeout_s: 0, loss_spike_factor: 3, max_bad_steps: 2}")


class BadSteps(unittest.TestCase):
    def run_job(self, name, drill):
        """Runs the job on a fresh one-node cluster whose agent carries the
        drill; returns rank 0's step reports by step, and loomctl status."""
        c = Cluster(f"bad-steps-{name}")
        self.addCleanup(c.stop)
        c.start_coordinator()
        env = dict(os.environ)
        env.pop("LOOM_TEST_FAULT", None)
        if drill:
            env["LOOM_TEST_FAULT"] = drill
        c.start_agent("node-a", "cpu:2", env=env)
        job_id = c.submit(spec(name), name)
        watch = Watch(c, job_id)
        self.assertEqual(watch.wait(), 0, c.status(job_id))
        self.assertEqual(c.state(job_id), "SUCCEEDED", c.status(job_id))
        steps = [s["step"] for s in watch.steps]
        self.assertEqual(steps, list(range(1, STEPS + 1)), "each step reported once, in order")
        status = c.status(job_id)
        c.stop()
        return {s["step"]: s for s in watch.steps}, status

    def test_a_nan_step_is_skipped_and_a_spike_rolled_back_both_leaving_the_batch_out(self):
        plain, _ = self.run_job("plain", None)
        nan, nan_status = self.run_job("nan", f"nan_grad@{K}#1")
        spike, spike_status = self.run_job("spike", f"loss_spike@{K}")
        for s in range(1, STEPS + 1):
            self.assertNotIn("last_bad_step", plain[s])
            if s < K:
                self.assertEqual(nan[s]["loss"], plain[s]["loss"], f"step {s}")
                self.assertEqual(spike[s]["loss"], plain[s]["loss"], f"step {s}")
                self.assertNotIn("skipped_steps", nan[s])
            elif s > K:
                self.assertEqual(nan[s]["loss"], spike[s]["loss"], f"step {s}")
                self.assertEqual(nan[s]["skipped_steps"], 1, nan[s])
                self.assertEqual(spike[s]["skipped_steps"], 1, spike[s])
        # Batch K was left out: the later steps are not the plain run's.
        self.assertTrue(any(nan[s]["loss"] != plain[s]["loss"] for s in range(K + 1, STEPS + 1)))
        self.assertTrue(nan[K]["last_bad_step"].startswith(
            f"step {K}: non-finite gradients (norm nan), not applied"), nan[K])
        self.assertEqual(nan[K]["loss"], plain[K]["loss"])  # trained, then not applied
        self.assertIn(f"step {K}: loss spike (", spike[K]["last_bad_step"])
        self.assertIn(f"rolled back to step {K - 1} and its batch skipped",
                      spike[K]["last_bad_step"])
        self.assertGreater(spike[K]["loss"], 100 * plain[K]["loss"])  # the spike, reported once
        self.assertIn(f"skipped 1 (last: step {K}: non-finite gradients", nan_status)
        self.assertIn(f"skipped 1 (last: step {K}: loss spike", spike_status)


if __name__ == "__main__":
    unittest.main()
