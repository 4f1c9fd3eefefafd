"""Recovery, accounted (docs/fault_tolerance.md): a rank of a running job
kills itself (the LOOM_TEST_FAULT drill); the job's status keeps one incident
whose six phases were each measured and add up to the recovery the test saw
from the outside, with the steps it recomputed; the coordinator's histogram
counts every phase once, and the job's goodput lies strictly between 0 and 1.
Once on the whole-job path (fault_tolerance.in_place: false: the steps redone
after the restart from a checkpoint do not count), once in place (the job on
one node: the crashed rank's buddy is the next rank on that node; its own
phases abort, relaunch and restore, nothing recomputed)."""

import os
import sys
import unittest

from loom_cluster import BUILD, Cluster, tiny_job, wait_until
from test_fault_tolerance import Watch

sys.path.insert(0, os.path.join(BUILD, "python"))
from loom.v1 import job_pb2, job_pb2_grpc  # noqa: E402

PHASES = ["detection", "stopping", "placement", "rendezvous", "checkpoint_load", "first_step"]


class RecoveryAccounting(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)

    def run_with_one_crash(self, name, spec, coordinator_flags=()):
        """Rank 2 kills itself once step 6 is done (first attempt only); runs
        `spec` to its end on one 4-device node and returns (job id, watch,
        the recovery as seen from outside: the last step of attempt 1 to the
        first of attempt 2, the job, its one incident)."""
        c = self.cluster
        os.environ["LOOM_TEST_FAULT"] = "after_step@6#2"
        try:
            c.start_coordinator(list(coordinator_flags))
            c.start_agent("node-a", "cpu:4")
        finally:
            del os.environ["LOOM_TEST_FAULT"]
        job_id = c.submit(spec, name)
        watch = Watch(c, job_id)
        self.assertEqual(watch.wait(), 0, c.status(job_id))
        first = [s for s in watch.steps if s["attempt"] == 1]
        second = [s for s in watch.steps if s["attempt"] == 2]
        self.assertTrue(first and second, watch.steps)
        measured = (second[0]["time_unix_ms"] - max(s["time_unix_ms"] for s in first)) / 1000.0
        channel = c.channel()
        self.addCleanup(channel.close)
        job = job_pb2_grpc.JobServiceStub(channel).GetJob(job_pb2.GetJobRequest(id=job_id),
                                                          timeout=10)
        self.assertEqual(len(job.incidents), 1, job.incidents)
        incident = job.incidents[0]
        self.assertEqual(incident.kind, "crash")
        self.assertEqual(incident.failed_attempt, 1)
        self.assertTrue(incident.complete and incident.closed)
        self.assertEqual(incident.last_step, 6)
        self.assertEqual(incident.resumed_step, second[0]["step"] - 1)
        return job_id, watch, measured, job, incident

    def test_a_crash_is_one_incident_with_every_phase_measured(self):
        c = self.cluster
        # The checkpoint of step 4 is what attempt 2 resumes from, so steps 5
        # and 6 are done twice. The ended job's series go 10 s after it ends
        # (checked at the end).
        spec = tiny_job(name="accounted", steps=16, ranks=4, eval_interval=0, ckpt_interval=4,
                        max_restarts=2).replace("val_path: data/val.txt, ", "").replace(
                            "hang_timeout_s: 0}", "hang_timeout_s: 0, in_place: false}")
        job_id, watch, measured, job, incident = self.run_with_one_crash(
            "accounted", spec, ["--job_metrics_grace_s=10"])
        # The whole job restarted (in place is off), from the checkpoint of
        # step 4: steps 5 and 6, done before the crash (rank 0's report of
        # step 6 travels ahead of its exit), were computed again.
        self.assertEqual(incident.path, "whole_job")
        self.assertEqual(incident.fallback_reason,
                         "in-place recovery is off (fault_tolerance.in_place: false)")
        self.assertEqual(incident.steps_recomputed, 2)
        phases = {p: getattr(incident, f"{p}_seconds") for p in PHASES}
        for phase, seconds in phases.items():
            self.assertGreater(seconds, 0, f"{phase}: {incident}")
        self.assertAlmostEqual(sum(phases.values()), incident.total_seconds, delta=1e-3)
        self.assertAlmostEqual(incident.total_seconds, measured, delta=max(0.5, 0.25 * measured),
                               msg=f"incident {incident} vs measured {measured:.3f} s")
        # The restart backoff (1 s) runs from the declaration: stopping and
        # placement together last at least that long.
        self.assertGreaterEqual(phases["stopping"] + phases["placement"], 0.999)
        print(f"\nrecovery (crash): measured {measured:.2f} s, accounted "
              + ", ".join(f"{p} {s:.3f}" for p, s in phases.items())
              + f", total {incident.total_seconds:.2f} s; goodput {job.goodput:.3f}")

        status = c.status(job_id)
        self.assertIn("recoveries:", status)
        self.assertRegex(status, r"crash rank \d node node-a \(attempt 1\): detect \d+\.\d\ds .* "
                                 r"total [\d.]+s; whole job, 2 steps recomputed \(in-place "
                                 r"recovery is off \(fault_tolerance.in_place: false\)\)\n")
        self.assertIn("goodput:", status)

        for phase in PHASES:
            self.assertEqual(c.metric_value("loom_recovery_phase_seconds_count", phase=phase), 1.0,
                             phase)
        # The ended job's series stay for the metrics grace.
        goodput = c.metric_value("loom_job_goodput", job=job_id)
        self.assertIsNotNone(goodput)
        self.assertGreater(goodput, 0)
        self.assertLess(goodput, 1)
        self.assertGreater(job.goodput, 0)
        self.assertLess(job.goodput, 1)
        # Steps 5 and 6 were redone: the counted time is that of 16 steps, less
        # than all the steps reported.
        all_steps = sum(s["step_seconds"] for s in watch.steps)
        self.assertLess(job.counted_step_seconds, all_steps)

        # The goodput series goes with the job's other series; the histogram,
        # which has no job label, stays.
        wait_until(lambda: c.metric_value("loom_job_step", job=job_id) is None, 60,
                   "the ended job's series to go")
        self.assertIsNone(c.metric_value("loom_job_goodput", job=job_id))
        self.assertEqual(c.metric_value("loom_recovery_phase_seconds_count", phase="detection"), 1.0)

    def test_a_crash_recovered_in_place_is_one_incident_on_its_own_timeline(self):
        c = self.cluster
        # Checkpoints off: nothing could come back from disk.
        spec = tiny_job(name="in-place", steps=16, ranks=4, eval_interval=0, ckpt_interval=4,
                        max_restarts=2).replace("val_path: data/val.txt, ", "").replace(
                            "checkpoint: {dir: checkpoints, interval: 4, keep: 2}\n", "")
        self.assertNotIn("checkpoint:", spec)
        job_id, watch, measured, job, incident = self.run_with_one_crash("in-place", spec)
        self.assertEqual(incident.path, "in_place")
        self.assertEqual(list(incident.relaunched_ranks), [2])
        self.assertEqual(incident.fallback_reason, "")
        # Rank 2 died right after step 6: training goes on from the snapshot
        # of step 6, or of step 5 when its copy of step 6 had not reached its
        # buddy yet (at most the step in flight is computed again).
        self.assertIn(incident.resumed_step, (5, 6))
        self.assertEqual(incident.steps_recomputed, 6 - incident.resumed_step)
        phases = {"detection": incident.detection_seconds, "abort": incident.abort_seconds,
                  "relaunch": incident.placement_seconds,
                  "rendezvous": incident.rendezvous_seconds,
                  "restore": incident.checkpoint_load_seconds,
                  "first_step": incident.first_step_seconds}
        self.assertEqual(incident.stopping_seconds, 0)  # nothing was stopped
        for phase, seconds in phases.items():
            self.assertGreaterEqual(seconds, 0, f"{phase}: {incident}")
        self.assertGreater(incident.abort_seconds, 0, incident)
        self.assertGreater(incident.rendezvous_seconds, 0, incident)
        self.assertAlmostEqual(sum(phases.values()), incident.total_seconds, delta=1e-3)
        self.assertAlmostEqual(incident.total_seconds, measured, delta=max(0.5, 0.25 * measured),
                               msg=f"incident {incident} vs measured {measured:.3f} s")
        print(f"\nrecovery in place (crash): measured {measured:.2f} s, accounted "
              + ", ".join(f"{p} {s:.3f}" for p, s in phases.items())
              + f", total {incident.total_seconds:.2f} s; goodput {job.goodput:.3f}")
        self.assertRegex(c.status(job_id),
                         r"crash rank 2 node node-a \(attempt 1\): detect \d+\.\d\ds abort "
                         r"[\d.]+s relaunch [\d.]+s rendezvous [\d.]+s restore [\d.]+s "
                         r"first-step [\d.]+s total [\d.]+s; in place, relaunched rank 2, "
                         r"[012] steps? recomputed\n")
        # The in-place path's own phases are counted once each, with the
        # three it shares with the whole-job path.
        for phase in ("detection", "abort", "relaunch", "rendezvous", "restore", "first_step"):
            self.assertEqual(c.metric_value("loom_recovery_phase_seconds_count", phase=phase), 1.0,
                             phase)
        for phase in ("stopping", "placement", "checkpoint_load"):
            self.assertEqual(c.metric_value("loom_recovery_phase_seconds_count", phase=phase), 0.0,
                             phase)
        self.assertGreater(job.goodput, 0)
        self.assertLess(job.goodput, 1)


if __name__ == "__main__":
    unittest.main()
