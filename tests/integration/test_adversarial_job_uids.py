"""Issue 29, "a rank can reach past its own job", under per-job uids: one
agent run as root with --run_as_uid_range (and the coordinator with the same
--job_uid_range) runs two jobs at once. Each job's ranks run as their own
uid inside the range (read from /proc/PID/status); a process running as job
A's uid (what a compromised rank of A could be) cannot read job B's
assignment (its token), rank directory or checkpoint directory, nor write
into them; both jobs succeed; a job resuming from A reads A's checkpoints
through A's group and cannot write them; and a job the coordinator gave no
uid is refused by such an agent (exit 3), never run as root. Needs root (skips otherwise; CI runs
as root)."""

import json
import os
import subprocess
import sys
import unittest

from loom_cluster import Cluster, tiny_job, wait_until

UID_RANGE = (3_100_000, 3_100_999)  # far from any uid a test machine hands out

# Runs as the uid under test: each (op, path) is tried and answered "ok" or
# the exception's name, so the test sees every attempt, not just the first.
PROBE = r"""
import json, os, sys
results = []
for op, path in json.loads(sys.argv[1]):
    try:
        if op == "read":
            with open(path, "rb") as f:
                f.read(1)
        elif op == "list":
            os.listdir(path)
        elif op == "create":
            with open(os.path.join(path, "planted-by-another-job"), "wb") as f:
                f.write(b"x")
        elif op == "mkdir":
            os.mkdir(os.path.join(path, "step_999999"))
        results.append("ok")
    except Exception as e:
        results.append(type(e).__name__)
print(json.dumps(results))
"""


def proc_ids(pid):
    """(uids, gids, groups) from /proc/PID/status: real, effective, saved, fs."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return ([int(v) for v in fields["Uid"]], [int(v) for v in fields["Gid"]],
            sorted(int(v) for v in fields.get("Groups", [])))


def probe(uid, gid, ops, groups=()):
    """The outcome of each (op, path) for a process running as uid/gid with
    only `groups` as supplementary groups."""
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(ops)], user=uid, group=gid,
                            extra_groups=list(groups), cwd="/", capture_output=True, text=True,
                            timeout=30)
    if result.returncode != 0:
        raise AssertionError(f"probe as uid {uid} failed: {result.stderr}")
    return json.loads(result.stdout)


@unittest.skipUnless(os.geteuid() == 0, "per-job uids need an agent running as root")
class JobsRunAsTheirOwnUids(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster("adversarial-job-uids")
        c = self.cluster
        os.chmod(c.dir, 0o711)  # the job users may pass through, not list
        span = f"{UID_RANGE[0]}-{UID_RANGE[1]}"
        # The coordinator gives no uids in the test that says what then happens.
        ranged = self._testMethodName != "test_a_job_without_a_uid_is_refused_by_the_agent"
        c.start_coordinator(extra=[f"--job_uid_range={span}"] if ranged else [])
        c.start_agent("node-a", "cpu:4", extra=[f"--run_as_uid_range={span}"])

    def tearDown(self):
        self.cluster.stop()

    def job_pids(self, job):
        marker = f"/jobs/{job}/".encode()
        pids = []
        for pid in self.cluster.trainer_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker in f.read():
                        pids.append(pid)
            except FileNotFoundError:
                pass
        return pids

    def rank_dir(self, job, rank=0):
        return os.path.join(self.cluster.dir, "node-a", "jobs", job, "attempt_1", f"rank_{rank}")

    def test_two_jobs_at_once_cannot_reach_each_other(self):
        c = self.cluster
        # Long enough that both run at once while the probes look.
        spec = tiny_job(steps=600, ranks=2, eval_interval=0, ckpt_interval=50)
        a = c.submit(spec.replace("name: tiny", "name: job-a"), "job-a")
        b = c.submit(spec.replace("name: tiny", "name: job-b"), "job-b")
        wait_until(lambda: len(self.job_pids(a)) == 2 and len(self.job_pids(b)) == 2, 120,
                   "both jobs' ranks to run at once")

        uid_of = {}
        for job in (a, b):
            for pid in self.job_pids(job):
                uids, gids, groups = proc_ids(pid)
                self.assertEqual(len(set(uids)), 1, f"rank {pid} of {job}: uids {uids}")
                self.assertEqual(gids, uids, f"rank {pid} of {job}: gids {gids}")
                self.assertEqual(groups, [], f"rank {pid} of {job}: groups {groups}")
                self.assertTrue(UID_RANGE[0] <= uids[0] <= UID_RANGE[1], uids)
                self.assertEqual(uid_of.setdefault(job, uids[0]), uids[0],
                                 f"ranks of {job} run as different uids")
        self.assertNotEqual(uid_of[a], uid_of[b])
        print(f"\njob {a} runs as uid {uid_of[a]}, job {b} as uid {uid_of[b]}")

        # Who owns what, and with which mode.
        for job in (a, b):
            rank_dir = self.rank_dir(job)
            info = os.stat(rank_dir)
            self.assertEqual((info.st_uid, info.st_mode & 0o777), (uid_of[job], 0o700))
            info = os.stat(os.path.join(rank_dir, "assignment.pb"))
            self.assertEqual((info.st_uid, info.st_mode & 0o777), (uid_of[job], 0o600))
            info = os.stat(c.checkpoint_dir(job))
            self.assertEqual((info.st_uid, info.st_gid, info.st_mode & 0o777),
                             (uid_of[job], uid_of[job], 0o750))

        def attacks(victim):
            rank_dir, ckpt = self.rank_dir(victim), c.checkpoint_dir(victim)
            return [("read", os.path.join(rank_dir, "assignment.pb")),
                    ("read", os.path.join(self.rank_dir(victim, 1), "assignment.pb")),
                    ("read", os.path.join(rank_dir, "log.txt")),
                    ("list", rank_dir), ("create", rank_dir),
                    ("list", ckpt), ("create", ckpt), ("mkdir", ckpt),
                    ("list", os.path.dirname(os.path.dirname(rank_dir)))]

        # The probe can succeed: as A it reads A's own files.
        own = probe(uid_of[a], uid_of[a], [("read", os.path.join(self.rank_dir(a), "assignment.pb")),
                                           ("list", c.checkpoint_dir(a))])
        self.assertEqual(own, ["ok", "ok"])
        for attacker, victim in ((a, b), (b, a)):
            outcome = probe(uid_of[attacker], uid_of[attacker], attacks(victim))
            for (op, path), result in zip(attacks(victim), outcome):
                self.assertEqual(result, "PermissionError",
                                 f"as {attacker}'s uid, {op} {path}: {result}")

        for job in (a, b):
            self.assertEqual(c.wait_state(job, ("FAILED", "SUCCEEDED"), timeout=300), "SUCCEEDED",
                             c.status(job))
        for job in (a, b):
            self.assertEqual(os.listdir(c.checkpoint_dir(job)) and all(
                os.stat(os.path.join(c.checkpoint_dir(job), step)).st_uid == uid_of[job]
                for step in os.listdir(c.checkpoint_dir(job))), True,
                f"{job}'s checkpoints: {os.listdir(c.checkpoint_dir(job))}")

    def test_a_resuming_job_reads_its_source_through_the_group_only(self):
        c = self.cluster
        source = c.submit(tiny_job(name="source", steps=4, ranks=1, eval_interval=0,
                                   ckpt_interval=2), "source")
        self.assertEqual(c.wait_state(source, ("FAILED", "SUCCEEDED"), timeout=180), "SUCCEEDED",
                         c.status(source))
        source_uid = os.stat(c.checkpoint_dir(source)).st_uid
        spec = tiny_job(name="resumer", steps=6, ranks=1, eval_interval=0, ckpt_interval=2).replace(
            "keep: 2", f"keep: 2, resume_from: {source}")
        resumer = c.submit(spec, "resumer")
        self.assertEqual(c.wait_state(resumer, ("FAILED", "SUCCEEDED"), timeout=180),
                         "SUCCEEDED", c.status(resumer))
        resumer_uid = os.stat(c.checkpoint_dir(resumer)).st_uid
        self.assertNotEqual(source_uid, resumer_uid)
        self.assertTrue(UID_RANGE[0] <= resumer_uid <= UID_RANGE[1])
        ckpt = c.checkpoint_dir(source)
        with open(os.path.join(self.rank_dir(resumer), "log.txt"), errors="replace") as f:
            log = f.read()
        self.assertIn(f"resumed from {ckpt}/", log, log[-2000:])
        # What its ranks had: the source's group, read but no write; the
        # source's rank directory stays closed.
        steps = sorted(os.listdir(ckpt))
        self.assertTrue(steps, "the source left no checkpoint")
        outcome = probe(resumer_uid, resumer_uid,
                        [("list", ckpt), ("list", os.path.join(ckpt, steps[-1])),
                         ("create", ckpt), ("mkdir", ckpt),
                         ("read", os.path.join(self.rank_dir(source), "assignment.pb"))],
                        groups=[source_uid])
        self.assertEqual(outcome, ["ok", "ok", "PermissionError", "PermissionError",
                                   "PermissionError"])

    def test_a_job_without_a_uid_is_refused_by_the_agent(self):
        """A coordinator without --job_uid_range sends uid 0: the agent never
        runs it as root nor as any fallback user; the job cannot run (exit 3)."""
        c = self.cluster
        job = c.submit(tiny_job(name="no-uid", steps=2, ranks=1, eval_interval=0), "no-uid")
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED", timeout=120)
        status = c.status(job)
        self.assertIn("assignment.run_uid=0 is outside this node's --run_as_uid_range", status)
        self.assertIn("restarts 0", status)
        self.assertEqual(self.job_pids(job), [])


if __name__ == "__main__":
    unittest.main()
