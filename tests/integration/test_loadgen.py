"""loom-loadgen against a real coordinator (issues 19 and 25). Fake node agents
with 8 devices each register over mutual TLS with certificates loadgen issues
from the cluster CA, and a data-parallel job runs on them with every rank
reporting once a second (each node forwards its ranks' reports in one progress
batch on its session, as loom-worker does). Checks correctness only, never
timing:
  * 64 ranks: the job reaches RUNNING, no node is lost and no hang is declared
    while every rank reports, and the hang that follows names the silent rank;
  * 256 ranks, one rank crashed, and 256 ranks with one node lost (a spare
    node registered): the job recovers in place (the incident's path, the
    relaunched ranks exactly the dead ones), no rank of the old attempt is
    reported after its node was told of the new one or left behind in it,
    every rank gets past its next step in the new attempt, and the
    coordinator refused no report;
  * the scheduling run, bounded: 32 labelled nodes, 100 jobs of mixed sizes and
    priorities from 10 users (two under quotas set through QuotaService), each
    running a short fake time: every job succeeds and every decision follows
    the rules loadgen checks (tools/loadgen/sched_checks.h).
The measurements at 1k-16k ranks are tests/bench/scale/run.sh's, and the
256-node scheduling run tests/bench/scheduling/run_loadgen.sh's (docs/scale.md)."""

import os
import re
import subprocess
import unittest

from loom_cluster import BIN, Cluster

STOPPED_RANK = 13
FAILED_RANK = 133  # of 256: rank 5 of node 16


class Loadgen(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster("loadgen")
        # Loadgen's fake ranks do not stop gracefully yet (StopRanks): its
        # scheduling run checks the queue's rules with preemption off.
        self.cluster.start_coordinator(["--preemption=false"])

    def tearDown(self):
        self.cluster.stop()

    def run_loadgen(self, *flags, nodes=8):
        c = self.cluster
        result = subprocess.run(
            [os.path.join(BIN, "loom-loadgen"), f"--coordinator={c.address}",
             f"--ca_dir={os.path.join(c.certs, 'ca')}",
             f"--admin_tls_dir={c.tls_dir('admin')}", f"--nodes={nodes}", "--gpus_per_node=8",
             f"--coordinator_pid={c.coordinator.pid}", f"--loomctl={os.path.join(BIN, 'loomctl')}",
             *flags],
            capture_output=True, text=True, timeout=240)
        out = result.stdout + result.stderr
        line = re.search(r"^RESULT (.*)$", result.stdout, re.M)
        self.assertIsNotNone(line, out)
        fields = dict(kv.split("=", 1) for kv in line.group(1).split())
        return result, fields, out

    def test_64_ranks_run_and_the_silent_rank_is_named(self):
        c = self.cluster
        result, fields, out = self.run_loadgen(
            "--run_s=4", f"--stop_rank={STOPPED_RANK}", "--hang_wait_s=90")
        self.assertEqual(result.returncode, 0, out)
        self.assertEqual(fields["ranks"], "64")
        self.assertGreaterEqual(float(fields["running_s"]), 0, out)  # reached RUNNING
        self.assertEqual(fields["lost_nodes"], "0", out)
        self.assertEqual(fields["named"], str(STOPPED_RANK), out)
        self.assertEqual(fields["lease_expiries"], "0", out)
        self.assertEqual(fields["correct"], "1", out)
        # Every report loadgen's nodes forwarded in their progress batches was
        # for a rank that node runs in the current attempt: none was refused.
        self.assertEqual(c.metric_value("loom_node_progress_refused_total"), 0.0, out)
        # The coordinator saw it the same way: one hang, naming that rank.
        log = c.log("coordinator.log")
        self.assertIn(f"hang: no progress", log)
        self.assertRegex(log, rf"\): rank {STOPPED_RANK} \S+ holds the job up")

    def check_recovered_in_place(self, result, fields, out, relaunched):
        self.assertEqual(result.returncode, 0, out)
        self.assertEqual(fields["ranks"], "256")
        self.assertEqual(fields["path"], "in_place", out)
        # Exactly the ranks that died were relaunched (loadgen compares the
        # incident's list with them and fails the run otherwise).
        self.assertEqual(fields["relaunched"], str(relaunched), out)
        # Every rank of the new attempt reported a step past its restore step.
        self.assertEqual(fields["recovered"], "1", out)
        # Nothing of the old attempt after a node was told of the new one,
        # and no live rank left in it.
        self.assertEqual(fields["stale_reports"], "0", out)
        self.assertEqual(fields["ranks_behind"], "0", out)
        self.assertEqual(fields["lease_expiries"], "0", out)
        self.assertEqual(fields["correct"], "1", out)
        self.assertEqual(self.cluster.metric_value("loom_node_progress_refused_total"), 0.0, out)

    def test_256_ranks_a_crashed_rank_is_relaunched_in_place(self):
        result, fields, out = self.run_loadgen(
            "--run_s=3", f"--fail_rank={FAILED_RANK}", "--fail=crash", "--expect_in_place",
            "--recovery_wait_s=90", nodes=32)
        self.check_recovered_in_place(result, fields, out, relaunched=1)

    def test_256_ranks_a_lost_nodes_ranks_are_relaunched_in_place(self):
        result, fields, out = self.run_loadgen(
            "--run_s=3", f"--fail_rank={FAILED_RANK}", "--fail=node", "--spare_nodes=1",
            "--expect_in_place", "--recovery_wait_s=90", nodes=32)
        self.check_recovered_in_place(result, fields, out, relaunched=8)
        self.assertEqual(fields["lost_nodes"], "0", out)  # none but the one lost on purpose

    def test_scheduling_32_nodes_100_jobs_follow_the_rules(self):
        result, fields, out = self.run_loadgen("--jobs=100", "--schedule_timeout_s=180", nodes=32)
        self.assertEqual(result.returncode, 0, out)
        self.assertEqual(fields["mode"], "schedule", out)
        self.assertEqual(fields["jobs"], "100", out)
        self.assertEqual(fields["ended"], "100", out)
        self.assertEqual(fields["violations"], "0", out)
        self.assertEqual(fields["sessions_ended"], "0", out)
        self.assertEqual(fields["correct"], "1", out)
        self.assertNotIn("VIOLATION", out)
        # The nodes registered with their labels.
        self.assertIn("nvlink_domain=d0,rack=r0", self.cluster.loomctl("nodes").stdout)


if __name__ == "__main__":
    unittest.main()
