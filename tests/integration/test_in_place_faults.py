"""The harder faults of in-place recovery through the real binaries
(docs/fault_tolerance.md, "In-place recovery" and "Fencing"): a coordinator,
agents of two CPU devices each and real trainers on loopback.

* A second rank killed while the first is being restored: the recovery falls
  back to the whole job ("a second failure while recovering in place").
* A survivor that does not answer the abort (stopped before the failure):
  the whole job after fault_tolerance.abort_timeout_s.
* A rank and its snapshot buddy lost together (a one-node job, whose ring
  lies on that node, loses the node): the whole job from the disk checkpoint.
* A partition, twice: one node's agent frozen (SIGSTOP; its ranks live on)
  past the node timeout, and one node cut off by its link (its agent and
  ranks in a network namespace of their own, joined by a veth pair that is
  set down: needs root and iproute2, else skipped). The coordinator declares
  the node lost and relaunches its ranks on the spare node in place; the cut
  node's agent, whose lease ran out, has paused its ranks; once the agent is
  back (SIGCONT, link up) its stale ranks are killed, not resumed, and none
  of them commits a checkpoint after the freeze.

Each: the job SUCCEEDS, every step's loss equals the uninterrupted run's bit
for bit (also on the whole-job paths: training is deterministic and the
checkpoint or snapshot restores it exactly), and `loomctl status` names the
path and why. Timing is printed, never asserted."""

import glob
import os
import re
import shutil
import signal
import subprocess
import time
import unittest

from loom_cluster import BIN, MAKE_CERTS, USERS, Cluster, pid_alive, placement, wait_until
from test_fault_tolerance import Watch, incident_lines

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2,
        ffn_hidden_size: 64, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: 8, micro_batch_size: 1, seq_len: 32,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: {ranks}, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 1}}
resources: {{device: cpu, ranks: {ranks}}}
checkpoint: {{dir: checkpoints, interval: {ckpt}, keep: 2}}
fault_tolerance: {{max_restarts: 3, hang_timeout_s: {hang}, abort_timeout_s: {abort}}}
"""

STEPS = 100
FAIL_AFTER = 10  # the failure lands once this step is reported


def spec(name, ranks=4, ckpt=10, hang=60, abort=20):
    return SPEC.format(name=name, steps=STEPS, ranks=ranks, ckpt=ckpt, hang=hang, abort=abort)


def process_state(pid):
    """The state letter of /proc/PID/stat (T: stopped), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None


def signal_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class InPlaceFaults(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        # Processes a test stopped are continued before the cluster stops
        # (a stopped agent cannot end its ranks).
        self.stopped = []
        self.addCleanup(lambda: [signal_quietly(pid, signal.SIGCONT) for pid in self.stopped])
        # Hang detection is out of these tests' way (hang_timeout_s: 60): a
        # calibrated timeout could call the ranks waiting on a lost node hung
        # before the node timeout declares the node lost.
        self.cluster.start_coordinator()

    def start_agents(self, names):
        c = self.cluster
        for name in names:
            c.start_agent(name, "cpu:2")
        wait_until(lambda: c.metric_value("loom_nodes_live") == len(c.agents), 30,
                   f"{len(c.agents)} live nodes")

    def stop_process(self, pid):
        self.stopped.append(pid)
        os.kill(pid, signal.SIGSTOP)

    def reference(self, ranks=4):
        c = self.cluster
        job = c.submit(spec("reference", ranks, ckpt=0), "reference")
        watch = Watch(c, job)
        self.assertEqual(watch.wait(), 0, c.status(job))
        losses = watch.losses(1)
        self.assertEqual(sorted(losses), list(range(1, STEPS + 1)))
        return losses

    def start_job(self, name, **kwargs):
        c = self.cluster
        job = c.submit(spec(name, **kwargs), name)
        watch = Watch(c, job)
        wait_until(lambda: any(s["step"] >= FAIL_AFTER for s in watch.steps), 120,
                   f"step {FAIL_AFTER}")
        before = {rank: pid for (_, rank), pid in c.rank_pids(attempt=1).items()}
        return job, watch, before

    def finish(self, job, watch, reference, reported_all=True):
        """The job succeeds and every step any attempt reported equals the
        uninterrupted run's; returns (status, incident lines, {attempt: losses}).
        reported_all: every step was reported by some attempt (not so when
        the reporting rank's agent was frozen: the steps it computed then
        reach no one, though the survivors' snapshots hold them)."""
        c = self.cluster
        self.assertEqual(watch.wait(), 0, c.status(job))
        status = c.status(job)
        self.assertIn("state:     SUCCEEDED", status)
        attempts = {}
        for s in watch.steps:
            attempts.setdefault(s["attempt"], {})[s["step"]] = s["loss"]
        for attempt, losses in attempts.items():
            for step, loss in losses.items():
                self.assertEqual(loss, reference[step], f"attempt {attempt}: step {step} differs")
        last = max(attempts)
        self.assertEqual(max(attempts[last]), STEPS)
        if reported_all:
            self.assertEqual(sorted(set().union(*attempts.values())), list(range(1, STEPS + 1)))
        else:
            for attempt in sorted(attempts):
                self.assertEqual(sorted(attempts[attempt]),
                                 list(range(min(attempts[attempt]), max(attempts[attempt]) + 1)))
            self.assertEqual(min(attempts[min(attempts)]), 1)
        return status, incident_lines(status), attempts

    def test_second_failure_while_recovering_falls_back_to_the_whole_job(self):
        c = self.cluster
        self.start_agents(["node-a", "node-b"])
        reference = self.reference()
        job, watch, before = self.start_job("second-failure")
        self.assertEqual(sorted(before), [0, 1, 2, 3], c.rank_pids())
        failed_at = time.time()
        os.kill(before[2], signal.SIGKILL)
        # Rank 2's relaunch in attempt 2 is stopped as soon as it exists, so
        # the recovery cannot complete; then a survivor dies.
        relaunched = wait_until(lambda: c.rank_pids(attempt=2).get((2, 2)), 60,
                                "rank 2 relaunched in attempt 2", interval=0.005)
        self.stop_process(relaunched)
        self.assertIn("state:     RECOVERING", c.status(job))
        os.kill(before[1], signal.SIGKILL)
        wait_until(lambda: "a second failure while recovering in place" in c.status(job), 60,
                   "the fallback")
        signal_quietly(relaunched, signal.SIGCONT)
        status, incidents, attempts = self.finish(job, watch, reference)
        self.assertEqual(len(incidents), 2, status)
        self.assertRegex(incidents[0], r"^crash rank 2 .*; in place, relaunched rank 2")
        self.assertRegex(incidents[1], r"^crash rank 1 .*; whole job, \d+ steps? recomputed "
                                       r"\(a second failure while recovering in place\)$")
        later = [s for s in watch.steps if s["attempt"] > 1]
        print(f"\nsecond failure: failure -> first step after: "
              f"{later[0]['time_unix_ms'] / 1000.0 - failed_at:.2f} s\n  " + "\n  ".join(incidents))

    def test_survivor_that_ignores_the_abort_falls_back_after_the_deadline(self):
        c = self.cluster
        self.start_agents(["node-a", "node-b"])
        reference = self.reference()
        # The stopped survivor is caught by the abort deadline, long before
        # the hang timeout.
        job, watch, before = self.start_job("ignores-abort", abort=3)
        self.assertEqual(sorted(before), [0, 1, 2, 3], c.rank_pids())
        # Stopped first, so it cannot leave its collectives by itself either.
        self.stop_process(before[1])
        failed_at = time.time()
        os.kill(before[2], signal.SIGKILL)
        wait_until(lambda: re.search(r"did not report leaving (its|their) collectives",
                                     c.status(job)), 60,
                   "the abort deadline's fallback")
        signal_quietly(before[1], signal.SIGCONT)
        status, incidents, attempts = self.finish(job, watch, reference)
        self.assertEqual(len(incidents), 1, status)
        self.assertRegex(incidents[0],
                         r"^crash rank 2 .*; whole job, \d+ steps? recomputed \(rank 1 did not "
                         r"report leaving its collectives within "
                         r"fault_tolerance.abort_timeout_s \(3 s\); rank 1 was in phase .*; "
                         r"last report [0-9.]+m?s ago\)$")
        # The whole job: every rank is a new process.
        self.assertFalse(pid_alive(before[0]) or pid_alive(before[3]))
        later = [s for s in watch.steps if s["attempt"] > 1]
        print(f"\nignored abort: failure -> first step after: "
              f"{later[0]['time_unix_ms'] / 1000.0 - failed_at:.2f} s\n  {incidents[0]}")

    def test_rank_and_buddy_lost_together_restore_from_disk(self):
        c = self.cluster
        # Four ranks on a node of three devices and one of one: ranks 0-2 on
        # the first, 3 on the second. 0 and 3 hold each other's copies; the
        # two ranks left over form a ring on their own node (docs/topology.md,
        # "Snapshot ring"), so losing that node loses a rank and its buddy.
        c.start_agent("node-a", "cpu:3")
        c.start_agent("node-b", "cpu:1")
        wait_until(lambda: c.metric_value("loom_nodes_live") == 2, 30, "two nodes")
        reference = self.reference()
        job, watch, before = self.start_job("buddy-lost", ckpt=5)
        where = placement(c.status(job))
        big = where[0] if list(where.values()).count(where[0]) == 3 else where[3]
        self.assertEqual(list(where.values()).count(big), 3, where)
        c.start_agent("node-c", "cpu:3")  # where the lost node's share can go
        wait_until(lambda: c.metric_value("loom_nodes_live") == 3, 30, "three nodes")
        failed_at = time.time()
        c.kill(c.agents[big], signal.SIGKILL)
        for r, pid in before.items():
            if where[r] == big:
                signal_quietly(pid, signal.SIGKILL)
        # The reporting rank died with the node: a step it computed (and
        # committed) may have reached no one.
        status, incidents, attempts = self.finish(job, watch, reference, reported_all=False)
        self.assertNotIn(big, set(placement(status).values()))
        self.assertEqual(len(incidents), 1, status)
        self.assertRegex(incidents[0],
                         rf"^node_lost node {big} .*; whole job, \d+ steps? recomputed \(rank \d and "
                         rf"its buddy rank \d, which holds its snapshot copies, failed together "
                         rf"\(node {big} was lost\)\)$")
        # Restored from a disk checkpoint (every 5 steps), not from scratch.
        first_new = min(attempts[2])
        self.assertGreater(first_new, 1)
        self.assertEqual((first_new - 1) % 5, 0, sorted(attempts[2]))
        print(f"\nbuddy lost: failure -> first step after: "
              f"{min(s['time_unix_ms'] for s in watch.steps if s['attempt'] == 2) / 1000.0 - failed_at:.2f} s"
              f"\n  {incidents[0]}")

    def test_frozen_agent_is_fenced_and_its_ranks_are_killed_when_it_returns(self):
        c = self.cluster
        self.start_agents(["node-a", "node-b"])
        reference = self.reference()
        job, watch, before = self.start_job("frozen-agent", ckpt=5)
        where = placement(c.status(job))
        self.start_agents(["node-c"])  # the spare the lost node's ranks move to
        # The node of rank 0, which commits the job's checkpoints.
        node = where[0]
        stale = {r: before[r] for r, n in where.items() if n == node}
        self.assertEqual(len(stale), 2, where)
        agent = c.agents[node]
        frozen_at = time.time()
        self.stop_process(agent.pid)
        # A commit whose gate passed just before the freeze may still be
        # renaming; everything later needs the frozen agent.
        time.sleep(0.5)
        saved_at_freeze = [int(d.rsplit("_", 1)[1]) for d in
                           glob.glob(os.path.join(c.checkpoint_dir(job), "step_*"))]
        try:
            # The coordinator declares the node lost and recovers in place;
            # the stale ranks run on meanwhile (nothing stops them but their
            # agent's lease, which a frozen agent cannot act on).
            wait_until(lambda: any(s["attempt"] == 2 for s in watch.steps), 120,
                       "a step of attempt 2")
            for pid in stale.values():
                self.assertTrue(pid_alive(pid), "a stale rank is gone before its agent returns")
            # The survivors are the same processes.
            survivors = {r: p for r, p in before.items() if r not in stale}
            for r, pid in survivors.items():
                self.assertEqual(c.rank_pids(attempt=1).get((1, r)), pid, f"survivor rank {r}")
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        # Back: its lease ran out, so it pauses its ranks before relaying
        # anything, registers again, and the coordinator has them killed.
        wait_until(lambda: not any(pid_alive(p) for p in stale.values()), 60,
                   "the stale ranks to be killed")
        status, incidents, attempts = self.finish(job, watch, reference, reported_all=False)
        # At most the step in flight is computed again (the frozen node's
        # ranks computed beyond their last report, which reached no one).
        self.assertGreaterEqual(min(attempts[2]), max(attempts[1]))
        self.assertEqual(len(incidents), 1, status)
        stale_ranks = sorted(stale)
        self.assertRegex(incidents[0],
                         rf"^node_lost node {node} .*; in place, relaunched ranks "
                         rf"{stale_ranks[0]}-{stale_ranks[1]}, [012] steps? recomputed$")
        now = placement(status)
        for r in stale:
            self.assertEqual(now[r], "node-c", status)
        # The commit gate: every checkpoint a stale rank saved was committed
        # before its agent froze (rank 0, on the frozen node, commits them).
        for r in stale:
            logs = glob.glob(os.path.join(c.dir, node, "jobs", job, "attempt_1", f"rank_{r}",
                                          "log.txt"))
            self.assertEqual(len(logs), 1, logs)
            with open(logs[0], errors="replace") as f:
                text = f.read()
            saved = [int(s) for s in re.findall(r"checkpoint saved: \S*/step_0*(\d+)", text)]
            if r == 0:
                self.assertTrue(saved, text[-2000:])
            for step in saved:
                self.assertLessEqual(step, max(saved_at_freeze), text[-2000:])
        print(f"\nfrozen agent: freeze -> first step of attempt 2: "
              f"{min(s['time_unix_ms'] for s in watch.steps if s['attempt'] == 2) / 1000.0 - frozen_at:.2f} s"
              f"\n  {incidents[0]}")

    def test_node_cut_off_by_its_link_is_fenced_and_its_ranks_are_killed(self):
        """A partition for real: node-b's agent and ranks live in a network
        namespace of their own, joined to the rest by one veth pair; the
        link is set down, then up again."""
        c = self.cluster
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.skipTest("needs root and iproute2 (ip netns)")
        c.stop()  # the coordinator again, listening beyond loopback
        c.processes.clear()
        subnet = f"10.77.{os.getpid() % 250 + 1}"
        host, peer = f"{subnet}.1", f"{subnet}.2"
        ns, veth = f"loomcut{os.getpid()}", f"lmc{os.getpid()}"

        def ip(*args, check=True):
            return subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)

        ip("netns", "add", ns)
        self.addCleanup(lambda: (c.stop(), ip("netns", "del", ns, check=False),
                                 ip("link", "del", veth, check=False)))
        ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}n")
        ip("link", "set", f"{veth}n", "netns", ns)
        ip("addr", "add", f"{host}/24", "dev", veth)
        ip("link", "set", veth, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{peer}/24", "dev", f"{veth}n")
        ip("netns", "exec", ns, "ip", "link", "set", f"{veth}n", "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # The coordinator's certificate names the veth address too.
        shutil.rmtree(os.path.join(c.certs, "coordinator"))
        subprocess.run([MAKE_CERTS, c.certs, f"--host={host}"] + [f"--user={u}" for u in USERS],
                       check=True, capture_output=True, timeout=60)
        c.start_coordinator([f"--listen=0.0.0.0:{c.port}"])
        # Ranks listen on addresses both sides reach.
        c.start_agent("node-a", "cpu:2", extra=[f"--address={host}"])
        work = os.path.join(c.dir, "node-b")
        c.agents["node-b"] = c._spawn(
            ["ip", "netns", "exec", ns, os.path.join(BIN, "loom-worker"),
             f"--coordinator={host}:{c.port}", "--devices=cpu:2", f"--work_dir={work}",
             f"--tls_dir={c.tls_dir('node-b')}", f"--address={peer}", *c.root_flags()],
            "node-b.log")
        wait_until(lambda: c.metric_value("loom_nodes_live") == 2, 30, "two nodes")
        reference = self.reference()
        job, watch, before = self.start_job("cut-link")
        where = placement(c.status(job))
        self.assertEqual(set(where.values()), {"node-a", "node-b"}, where)
        c.start_agent("node-c", "cpu:2", extra=[f"--address={host}"])  # the spare
        wait_until(lambda: c.metric_value("loom_nodes_live") == 3, 30, "three nodes")
        stale = {r: before[r] for r, n in where.items() if n == "node-b"}
        survivors = {r: p for r, p in before.items() if r not in stale}
        cut_at = time.time()
        ip("link", "set", veth, "down")
        try:
            wait_until(lambda: any(s["attempt"] == 2 for s in watch.steps), 120,
                       "a step of attempt 2")
            # The cut-off agent's lease ran out before the coordinator placed
            # their replacements: its ranks are paused, not gone.
            for r, pid in stale.items():
                self.assertEqual(process_state(pid), "T", f"stale rank {r}")
            for r, pid in survivors.items():
                self.assertEqual(c.rank_pids(attempt=1).get((1, r)), pid, f"survivor rank {r}")
        finally:
            ip("link", "set", veth, "up")
        wait_until(lambda: not any(pid_alive(p) for p in stale.values()), 60,
                   "the stale ranks to be killed")
        status, incidents, attempts = self.finish(job, watch, reference, reported_all=False)
        # At most the step in flight is computed again.
        self.assertGreaterEqual(min(attempts[2]), max(attempts[1]))
        self.assertEqual(len(incidents), 1, status)
        ranks = sorted(stale)
        self.assertRegex(incidents[0],
                         rf"^node_lost node node-b .*; in place, relaunched ranks "
                         rf"{ranks[0]}-{ranks[1]}, [012] steps? recomputed$")
        for r in stale:
            self.assertEqual(placement(status)[r], "node-c", status)
        print(f"\ncut link: cut -> first step of attempt 2: "
              f"{min(s['time_unix_ms'] for s in watch.steps if s['attempt'] == 2) / 1000.0 - cut_at:.2f} s"
              f"\n  {incidents[0]}")


if __name__ == "__main__":
    unittest.main()
