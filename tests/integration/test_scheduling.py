"""A shared cluster's queue with real CPU jobs through coordinator and agents
(docs/scheduling.md): the higher priority goes first and `loomctl queue` says
why the other waits; a user over quota waits, saying so, and starts when
their other job ends; a priority above the owner's cap is refused; a short
job backfills a gap without starting before a waiting larger job could, and a
job the planner predicts to run past that job's start does not; node labels
(loom-worker --labels) are checked, shown by `loomctl nodes`, and let a TP
group span the two nodes of one NVLink domain. Preemption is off here:
tests/integration/test_preemption.py has it."""

import os
import subprocess
import unittest

from loom_cluster import BIN, Cluster, tiny_job, wait_until


def with_scheduling(spec, priority=0, max_runtime_s=0):
    return spec + f"scheduling: {{priority: {priority}, max_runtime_s: {max_runtime_s}}}\n"


def long_job(name):
    """Two ranks that run until the test cancels them (its devices then come
    free at a moment the test chooses, not when a step count runs out)."""
    return tiny_job(name=name, steps=1000000, ranks=2, eval_interval=0, ckpt_interval=0)


def queue_lines(cluster, identity="admin"):
    """loomctl queue's rows: {job id: the whole line}, in order."""
    out = cluster.loomctl("queue", identity=identity).stdout
    rows = {}
    for line in out.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1 and fields[0].isdigit():
            rows[fields[1]] = line
    return rows


class Scheduling(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self._testMethodName)
        # The queue's order, quotas and backfill; preemption (which would stop
        # the running jobs these tests wait behind) is test_preemption.py's.
        self.cluster.start_coordinator(["--preemption=false"])

    def tearDown(self):
        self.cluster.stop()

    def test_priority_goes_first_and_the_queue_says_why(self):
        c = self.cluster
        c.start_agent("node-a", devices="cpu:2")
        running = c.submit(long_job("first"), name="first")
        c.wait_state(running, {"RUNNING"}, timeout=120)
        low = c.submit(with_scheduling(tiny_job(name="low", ranks=2)), name="low")
        high = c.submit(with_scheduling(tiny_job(name="high", ranks=2), priority=5), name="high")

        def queued_in_order():
            rows = queue_lines(c)
            return list(rows)[:2] == [high, low]
        wait_until(queued_in_order, 30, "the queue to list high before low")
        rows = queue_lines(c)
        self.assertIn("needs 2 cpu, 0 free", rows[high])
        self.assertIn(f"priority 0, behind {high} (priority 5)", rows[low])
        # A user sees only their own jobs (none here), with the queue's size.
        self.assertIn("none of your jobs waits", c.loomctl("queue", identity="user-bob").stdout)

        c.loomctl("cancel", running)
        state = c.wait_state(high, {"STARTING", "RUNNING", "SUCCEEDED"}, timeout=60)
        self.assertIn(state, {"STARTING", "RUNNING", "SUCCEEDED"})
        if state != "SUCCEEDED":
            self.assertEqual(c.state(low), "PENDING")  # 2 devices: one job at a time
        c.expect_end(high, {"SUCCEEDED", "FAILED"}, "SUCCEEDED", timeout=300)
        c.expect_end(low, {"SUCCEEDED", "FAILED"}, "SUCCEEDED", timeout=300)

    def test_a_user_over_quota_waits_and_starts_when_their_other_job_ends(self):
        c = self.cluster
        c.start_agent("node-a", devices="cpu:4")
        out = c.loomctl("quota", "set", "--user=alice", "--cpu_quota=2").stdout
        self.assertIn("user alice", out)
        # Only admins change or read quotas.
        refused = c.loomctl("quota", "list", identity="user-alice", check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("may not", refused.stderr)

        first = c.submit(long_job("a1"), name="a1", identity="user-alice")
        c.wait_state(first, {"STARTING", "RUNNING"}, timeout=60)
        second = c.submit(tiny_job(name="a2", ranks=2), name="a2", identity="user-alice")
        wait_until(lambda: second in queue_lines(c, identity="user-alice"), 30,
                   "alice's second job to wait")
        self.assertIn("quota: alice holds 2 of 2 cpu", queue_lines(c, "user-alice")[second])
        # Bob is not held up by alice's quota: he gets the 2 free devices.
        bob = c.submit(tiny_job(name="b1", ranks=2), name="b1", identity="user-bob")
        c.expect_end(bob, {"SUCCEEDED", "FAILED"}, "SUCCEEDED", timeout=300)
        self.assertEqual(c.state(second), "PENDING")
        c.loomctl("cancel", first, identity="user-alice")
        c.expect_end(second, {"SUCCEEDED", "FAILED"}, "SUCCEEDED", timeout=300)
        # The quota survives a coordinator restart (stored before it took effect).
        c.kill(c.coordinator)
        c.start_coordinator(["--preemption=false"])
        self.assertIn("user alice", c.loomctl("quota", "get", "--user=alice").stdout)

    def test_a_priority_above_the_owners_cap_is_refused(self):
        c = self.cluster
        c.loomctl("quota", "set", "--user=alice", "--max_priority=1")
        path = c.write_spec("capped", with_scheduling(tiny_job(name="capped"), priority=5))
        result = c.loomctl("submit", path, identity="user-alice", check=False)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("scheduling.priority=5 must be at most 1, alice's cap", result.stderr)
        self.assertNotIn("capped", c.loomctl("list", identity="user-alice").stdout)
        ok = c.write_spec("fine", with_scheduling(tiny_job(name="fine"), priority=1))
        self.assertEqual(c.loomctl("submit", ok, identity="user-alice", check=False).returncode, 0)

    def test_a_short_job_backfills_without_delaying_the_waiting_one(self):
        c = self.cluster
        c.start_agent("node-a", devices="cpu:4")
        # Holds 2 of 4 and promises to end within 10 minutes.
        long = c.submit(with_scheduling(long_job("long"),
                                        max_runtime_s=600), name="long")
        c.wait_state(long, {"STARTING", "RUNNING"}, timeout=60)
        head = c.submit(with_scheduling(tiny_job(name="head", ranks=4)), name="head")
        wait_until(lambda: head in queue_lines(c), 30, "the 4-rank job to wait")
        # No promise, and the planner predicts a run far past head's reserved
        # start: it waits although 2 devices are free.
        unbounded = c.submit(tiny_job(name="unbounded", steps=100000000, ranks=2,
                                      eval_interval=0, ckpt_interval=0), name="unbounded")
        wait_until(lambda: "the planner predicts it runs" in
                   queue_lines(c).get(unbounded, ""), 30, "the long unpromised job to wait")
        self.assertEqual(c.state(unbounded), "PENDING")
        # Promises to end long before long's promised end: it backfills.
        short = c.submit(with_scheduling(tiny_job(name="short", ranks=2), max_runtime_s=120),
                         name="short")
        self.assertIn(c.wait_state(short, {"STARTING", "RUNNING", "SUCCEEDED"}, timeout=60),
                      {"STARTING", "RUNNING", "SUCCEEDED"})
        self.assertEqual(c.state(head), "PENDING")
        c.expect_end(short, {"SUCCEEDED", "FAILED"}, "SUCCEEDED", timeout=300)
        self.assertEqual(c.state(head), "PENDING")  # 2 free of the 4 it needs
        c.loomctl("cancel", long)
        # The head goes next, before the job without a promise submitted ahead of short.
        state = c.wait_state(head, {"STARTING", "RUNNING", "SUCCEEDED"}, timeout=60)
        if state != "SUCCEEDED":
            self.assertEqual(c.state(unbounded), "PENDING")
        c.expect_end(head, {"SUCCEEDED", "FAILED"}, "SUCCEEDED", timeout=300)
        # Then the long one starts (it would run for hours: cancelled here).
        c.wait_state(unbounded, {"STARTING", "RUNNING"}, timeout=60)
        c.loomctl("cancel", unbounded)

    def test_node_labels_let_a_tp_group_span_an_nvlink_domain(self):
        c = self.cluster
        # A malformed label is refused at start, naming the flag and the rule.
        bad = subprocess.run(
            [os.path.join(BIN, "loom-worker"), f"--coordinator={c.address}", "--devices=cpu:1",
             f"--work_dir={os.path.join(c.dir, 'bad')}", "--insecure", "--labels=Rack=r1"],
            capture_output=True, text=True, timeout=30)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--labels: key 'Rack'", bad.stderr)
        labels = "--labels=rack=r1,nvlink_domain=d0"
        c.start_agent("node-a", devices="cpu:1", extra=[labels])
        c.start_agent("node-b", devices="cpu:1", extra=[labels])

        def both_labelled():
            out = c.loomctl("nodes").stdout
            return len([l for l in out.splitlines() if "nvlink_domain=d0,rack=r1" in l]) == 2
        wait_until(both_labelled, 30, "both nodes to register with their labels")
        # tp=2 on nodes of one device each: only the NVLink domain can hold it.
        spec = tiny_job(name="tp2", ranks=2).replace("dp: 2, tp: 1", "dp: 1, tp: 2").replace(
            "num_kv_heads: 1", "num_kv_heads: 2")
        job = c.submit(spec, name="tp2")
        self.assertEqual(c.wait_state(job, {"SUCCEEDED", "FAILED"}, timeout=300), "SUCCEEDED",
                         c.loomctl("status", job).stdout)
        # Its two ranks are one TP group (TP(0) and TP(1)), one on each node.
        status = c.loomctl("status", job).stdout
        placed = [l for l in status.splitlines() if l.strip().startswith("rank ")]
        self.assertEqual(len(placed), 2, status)
        self.assertEqual({"TP(0)" in placed[0], "TP(1)" in placed[1]}, {True}, status)
        self.assertEqual({l.split(" node ")[1].split()[0] for l in placed}, {"node-a", "node-b"},
                         status)


if __name__ == "__main__":
    unittest.main()