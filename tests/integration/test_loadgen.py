"""loom-loadgen against a real coordinator (issue 19): 8 fake node agents with 8
devices each register over mutual TLS with certificates loadgen issues from the
cluster CA, a 64-rank data-parallel job runs on them with every rank reporting
once a second (each node forwards its ranks' reports in one progress batch on
its session, as loom-worker does), then one rank goes silent. Checks
correctness only, never timing: the job reaches RUNNING, no node is lost and no
hang is declared while every rank reports, and the hang that follows names the
silent rank.
The measurements at 1k-16k ranks are tests/bench/scale/run.sh's (docs/scale.md)."""

import os
import re
import subprocess
import unittest

from loom_cluster import BIN, Cluster

STOPPED_RANK = 13


class LoadgenSmall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster("loadgen")
        cls.cluster.start_coordinator()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_64_ranks_run_and_the_silent_rank_is_named(self):
        c = self.cluster
        result = subprocess.run(
            [os.path.join(BIN, "loom-loadgen"), f"--coordinator={c.address}",
             f"--ca_dir={os.path.join(c.certs, 'ca')}",
             f"--admin_tls_dir={c.tls_dir('admin')}", "--nodes=8", "--gpus_per_node=8",
             "--run_s=4", f"--stop_rank={STOPPED_RANK}", "--hang_wait_s=90",
             f"--coordinator_pid={c.coordinator.pid}", f"--loomctl={os.path.join(BIN, 'loomctl')}"],
            capture_output=True, text=True, timeout=240)
        out = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, out)
        line = re.search(r"^RESULT (.*)$", result.stdout, re.M)
        self.assertIsNotNone(line, out)
        fields = dict(kv.split("=", 1) for kv in line.group(1).split())
        self.assertEqual(fields["ranks"], "64")
        self.assertGreaterEqual(float(fields["running_s"]), 0, out)  # reached RUNNING
        self.assertEqual(fields["lost_nodes"], "0", out)
        self.assertEqual(fields["named"], str(STOPPED_RANK), out)
        self.assertEqual(fields["correct"], "1", out)
        # Every report loadgen's nodes forwarded in their progress batches was
        # for a rank that node runs in the current attempt: none was refused.
        self.assertEqual(c.metric_value("loom_node_progress_refused_total"), 0.0, out)
        # The coordinator saw it the same way: one hang, naming that rank.
        log = c.log("coordinator.log")
        self.assertIn(f"hang: no progress", log)
        self.assertRegex(log, rf"\): rank {STOPPED_RANK} \S+ holds the job up")


if __name__ == "__main__":
    unittest.main()
