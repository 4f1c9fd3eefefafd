"""`loomctl logs` against a live stack (docs/client.md): a running 2-rank
job's rank 1 step lines, --tail, --all with rank prefixes, --follow ending
when the job ends, the logs after the job ended, another user refused, a
symlink or FIFO in a log's place refused, a missing rank and an offline node
named."""

import os
import re
import signal
import subprocess
import time
import unittest

from loom_cluster import Cluster, tiny_job, wait_until

STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss ")


class Logs(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        self.cluster.start_coordinator()
        self.cluster.start_agent("node-a", "cpu:2")

    def logs(self, *args, identity="user-alice", check=True, timeout=120):
        return self.cluster.loomctl("logs", *args, identity=identity, check=check, timeout=timeout)

    def test_logs_of_a_running_job_follow_and_after_the_end(self):
        c = self.cluster
        steps = 40
        job = c.submit(tiny_job(name="logs", steps=steps, ranks=2, eval_interval=20,
                                ckpt_interval=20), identity="user-alice")
        # Running, with a few steps in rank 1's log.
        wait_until(lambda: len([l for l in self.logs(job, "--rank=1", check=False).stdout.splitlines()
                                if STEP_LINE.match(l)]) >= 2, 120, "rank 1's step lines")
        # Live or done: a rank's step lines can be read before the coordinator
        # has the other rank's ready report (batched by its agent), so the
        # job may still say STARTING.
        self.assertIn(c.state(job, identity="user-alice"), ("STARTING", "RUNNING", "SUCCEEDED"))
        rank1 = self.logs(job, "--rank=1").stdout.splitlines()
        self.assertTrue(any(STEP_LINE.match(l) for l in rank1), rank1)
        tail = self.logs(job, "--rank=1", "--tail=2").stdout.splitlines()
        self.assertEqual(len(tail), 2, tail)

        # --all --follow from now until the job ends: both ranks, prefixed,
        # every step up to the last, and it ends by itself.
        follow = subprocess.Popen(c.loomctl_argv("logs", job, "--all", "--follow",
                                                 identity="user-alice"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            out, err = follow.communicate(timeout=300)
        finally:
            if follow.poll() is None:
                os.killpg(follow.pid, signal.SIGKILL)
                follow.wait()
        self.assertEqual(follow.returncode, 0, err)
        self.assertEqual(c.state(job, identity="user-alice"), "SUCCEEDED")
        lines = out.splitlines()
        for rank in (0, 1):
            mine = [l[len(f"[rank {rank}] "):] for l in lines if l.startswith(f"[rank {rank}] ")]
            numbers = [int(STEP_LINE.match(l).group(1)) for l in mine if STEP_LINE.match(l)]
            self.assertEqual(numbers, list(range(1, steps + 1)), f"rank {rank}: {mine[-5:]}")
        self.assertTrue(all(l.startswith("[rank ") for l in lines), lines[:3])

        # After the end: still there (and without --follow it ends at once).
        after = self.logs(job, "--rank=1").stdout.splitlines()
        self.assertEqual(len([l for l in after if STEP_LINE.match(l)]), steps)
        self.assertEqual(self.logs(job, "--rank=0", "--attempt=1").stdout,
                         self.logs(job, "--rank=0").stdout)

        # The owner and admins only: another user is refused, as for status.
        bob = self.logs(job, identity="user-bob", check=False)
        self.assertEqual(bob.returncode, 1)
        self.assertNotIn("step 1/", bob.stdout)
        self.assertEqual(bob.stderr.strip(),
                         c.loomctl("status", job, identity="user-bob", check=False).stderr.strip())
        self.assertIn("step 1/", self.logs(job, "--rank=0", identity="admin").stdout)

        # What is missing is named.
        missing = self.logs(job, "--rank=5", check=False)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("has ranks 0 to 1; there is no rank 5", missing.stderr)
        no_attempt = self.logs(job, "--attempt=4", check=False)
        self.assertIn("there is no attempt 4", no_attempt.stderr)

        # A rank's directory is the rank's to write: a symlink (to the node's
        # TLS key) or a FIFO left in its log's place is refused, never
        # followed or opened (issue 29), and the agent keeps answering.
        log = os.path.join(c.dir, "node-a", "jobs", job, "attempt_1", "rank_1", "log.txt")
        os.rename(log, log + ".old")
        os.symlink(os.path.join(c.tls_dir("node-a"), "tls.key"), log)
        planted = self.logs(job, "--rank=1", check=False)
        self.assertEqual(planted.returncode, 1)
        self.assertIn("symbolic link; it is not followed", planted.stderr)
        self.assertNotIn("PRIVATE KEY", planted.stdout + planted.stderr)
        os.unlink(log)
        os.mkfifo(log)
        fifo = self.logs(job, "--rank=1", check=False, timeout=60)
        self.assertEqual(fifo.returncode, 1)
        self.assertIn("not a regular file", fifo.stderr)
        self.assertIn("step 1/", self.logs(job, "--rank=0").stdout)

        # The node goes away: its ranks' logs are out of reach, and the
        # error says which rank, attempt and node.
        c.kill(c.agents["node-a"])
        offline = wait_until(lambda: (lambda r: r if "offline" in r.stderr else None)(
            self.logs(job, "--rank=1", check=False, timeout=60)), 30, "the node to be offline")
        self.assertEqual(offline.returncode, 1)
        self.assertIn("rank 1 of attempt 1 of job", offline.stderr)
        self.assertRegex(offline.stderr, r"ran on node \S+, which is offline")

    def test_usage_errors(self):
        c = self.cluster
        for args, needle in ((["logs"], "logs needs ID"),
                             (["logs", "j", "--tail=-1"], "--tail must not be negative"),
                             (["logs", "j", "--folow"], "did you mean '--follow'"),
                             (["lgos", "j"], "did you mean 'logs'"),
                             (["list", "--follow"], "--follow does not apply to list")):
            with self.subTest(args=args):
                result = c.loomctl(*args, check=False)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(needle, result.stderr)


if __name__ == "__main__":
    unittest.main()
