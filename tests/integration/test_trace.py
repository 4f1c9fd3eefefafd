"""`loomctl trace` through the real binaries (docs/observability.md, "Traces"):
a coordinator, two agents and four CPU trainers of a tp2·pp2 job on loopback.

* One rank is slowed from outside: stopped (SIGSTOP/SIGCONT) for three times
  the CPU time its training loop uses, at moments it is found computing
  (Throttle below; why not on a fixed period as test_stragglers.py does is
  said there). `loomctl trace` of a coming step writes one file that parses
  as the Chrome trace-event format, with a process per rank named with its place and node, a compute
  track and one per communicator; each rank's trace holds every collective
  its communicators counted for that step (the step's own timing summary,
  from the same report), each with its group, operation and bytes; the
  slowed rank's own work (its step less its time blocked in collectives) is
  visibly longer than its peers'.
* Another user is refused exactly as `loomctl status` refuses them; a step
  that has begun already is refused naming the step.

Timing is printed, never asserted beyond "visibly longer" (1.3x)."""

import collections
import json
import os
import shutil
import signal
import statistics
import threading
import time
import unittest

from loom_cluster import Cluster, wait_until

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 256, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 768, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: 8, micro_batch_size: 4, seq_len: 64,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: 1, tp: 2, pp: 2, cp: 1, ep: 1, zero_stage: 0, schedule: 1f1b}}
resources: {{device: cpu, ranks: 4}}
fault_tolerance: {{max_restarts: 0, hang_timeout_s: 120}}
"""

SLOWED = 1  # the rank the test slows


class Throttle:
    """Slows a process's own work from outside, as a throttled device would,
    like cpulimit: a thread reads how much CPU time the process's main thread
    (the training loop's) used, and for each millisecond of it stops the
    process for `factor` milliseconds (SIGSTOP, SIGCONT), at moments it finds
    that thread running, so the stops land in its compute and its waits in
    collectives (asleep in the kernel) are left alone. (A stop on a fixed
    period, as test_stragglers.py uses for a dp4 job, landed mostly in those
    waits here: a tp2·pp2 step on this machine is a chain of exchanges in
    which each rank computes for a fifth of the time or less.) stop() always
    leaves the process continued."""

    def __init__(self, pid, factor=3.0, poll=0.001, shortest=0.002, longest=0.03):
        self.pid, self.factor, self.poll = pid, factor, poll
        self.shortest, self.longest = shortest, longest
        self.done = threading.Event()
        self.stopped_s = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _cpu_s(self):
        with open(f"/proc/{self.pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def _running(self):
        with open(f"/proc/{self.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "R"

    def _run(self):
        # On a loaded machine an ordinary thread wakes too late to find the
        # rank computing; a real-time one (when allowed) on time. It sleeps
        # between polls, so it takes little CPU.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except (PermissionError, OSError):
            pass
        try:
            used = self._cpu_s()
            owed = 0.0
            while not self.done.is_set():
                now = self._cpu_s()
                owed += (now - used) * self.factor
                used = now
                if owed >= self.shortest and self._running():
                    pause = min(owed, self.longest)
                    os.kill(self.pid, signal.SIGSTOP)
                    time.sleep(pause)
                    os.kill(self.pid, signal.SIGCONT)
                    owed -= pause
                    self.stopped_s += pause
                time.sleep(self.poll)
        except (FileNotFoundError, ProcessLookupError):  # the rank ended
            pass

    def stop(self):
        self.done.set()
        self.thread.join(timeout=5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def step_of(status):
    for line in status.splitlines():
        if line.startswith("progress:"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "step":
                return int(parts[2].split("/")[0])
    return 0


def own_work_us(events, pid):
    """The rank's step (first compute span to last) less its time blocked in
    collectives: what the straggler timing calls its compute."""
    spans = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
    compute = [e for e in spans if e["cat"] == "compute"]
    step = max(e["ts"] + e["dur"] for e in compute) - min(e["ts"] for e in compute)
    blocked = sum(e["args"]["blocked_us"] for e in spans if e["cat"] == "collective")
    return step - blocked


def doc_step_us(events):
    spans = [e for e in events if e["ph"] == "X"]
    return max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)


class Trace(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", devices="cpu:2")
        c.start_agent("node-b", devices="cpu:2")
        wait_until(lambda: c.metric_value("loom_nodes_live") == 2, 30, "two nodes")

    def test_trace_of_a_tp2_pp2_step_with_a_slowed_rank(self):
        c = self.cluster
        job = c.submit(SPEC.format(name="traced", steps=100000), name="traced",
                       identity="user-alice")
        wait_until(lambda: step_of(c.status(job, identity="user-alice")) >= 5, 240,
                   f"{job} to pass step 5")
        slower = Throttle(c.rank_pids(attempt=1)[(1, SLOWED)])
        self.addCleanup(slower.stop)
        time.sleep(1.0)  # a few slowed steps before the traced one

        # Refusals first: another user, a step already under way.
        bob = c.loomctl("trace", job, "--output=bob.json", identity="user-bob", check=False)
        self.assertEqual(bob.returncode, 1)
        self.assertEqual(bob.stderr.strip(),
                         c.loomctl("status", job, identity="user-bob", check=False).stderr.strip())
        self.assertFalse(os.path.exists(os.path.join(c.dir, "bob.json")))
        begun = c.loomctl("trace", job, "--step=1", "--output=begun.json", identity="user-alice",
                          check=False)
        self.assertEqual(begun.returncode, 1)
        self.assertIn("step 1 may have begun already", begun.stderr)

        started = time.monotonic()
        result = c.loomctl("trace", job, "--output=step.json", "--wait_s=120",
                           identity="user-alice", timeout=180)
        print(f"\n{result.stdout.strip()} ({time.monotonic() - started:.1f} s)")
        slower.stop()
        print(f"rank {SLOWED} stopped for {slower.stopped_s:.2f} s in all")
        path = os.path.join(c.dir, "step.json")
        with open(path) as f:
            doc = json.load(f)
        if os.environ.get("LOOM_TRACE_KEEP"):  # to look at it in a viewer
            shutil.copy(path, os.environ["LOOM_TRACE_KEEP"])
        print(f"{os.path.getsize(path)} bytes")

        # The trace-event format: a traceEvents list of events with ph, pid,
        # and for complete events ts and dur in microseconds.
        events = doc["traceEvents"]
        self.assertIsInstance(events, list)
        for e in events:
            self.assertIn(e["ph"], ("M", "X", "i"), e)
            self.assertIsInstance(e["pid"], int)
            if e["ph"] == "X":
                self.assertGreaterEqual(e["dur"], 0)
                self.assertIsInstance(e["ts"], int)

        # A process per rank, named with its place and node.
        names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
        self.assertEqual(len(names), 4, names)
        for rank in range(4):
            self.assertRegex(names[rank + 1], rf"^rank {rank} TP\(\d\)-\S*PP\(\d\)\S* on node-[ab]$")
        threads = collections.defaultdict(dict)
        for e in events:
            if e["name"] == "thread_name":
                threads[e["pid"]][e["tid"]] = e["args"]["name"]

        step = doc["otherData"]["step"]
        self.assertEqual(doc["otherData"]["missing_ranks"], [])
        own = {}
        for rank in range(4):
            pid = rank + 1
            tracks = threads[pid]
            self.assertEqual(tracks[0], "compute")
            self.assertTrue(any(t.startswith("tp[") for t in tracks.values()), tracks)
            self.assertTrue(any(t.startswith("pp[") for t in tracks.values()), tracks)
            spans = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
            phases = {e["name"].split(" ")[0] for e in spans if e["cat"] == "compute"}
            for phase in ("load_data", "backward", "reduce_gradients", "optimizer"):
                self.assertIn(phase, phases, f"rank {rank}")
            # The last stage's head runs its forward inside the backward pass.
            if "PP(0)" in names[pid]:
                self.assertIn("forward", phases, f"rank {rank}")
            # Every collective the rank's communicators counted that step.
            traced = collections.Counter((e["args"]["group"], e["args"]["op"])
                                         for e in spans if e["cat"] == "collective")
            counted = {(c_["group"], c_["op"]): c_["calls"]
                       for c_ in doc["otherData"]["ranks"][str(rank)]["collectives"]}
            self.assertTrue(counted, f"rank {rank} counted no collective")
            self.assertEqual(dict(traced), counted, f"rank {rank}")
            for e in spans:
                if e["cat"] == "collective":
                    self.assertEqual(threads[pid][e["tid"]], e["args"]["group"])
                    if e["args"]["op"] in ("all_reduce", "send", "recv"):
                        self.assertGreater(e["args"]["bytes"], 0, e)
            own[rank] = own_work_us(events, pid)
        for rank in range(4):
            summary = doc["otherData"]["ranks"][str(rank)]
            print(f"rank {rank}: own work {own[rank] / 1e3:.1f} ms in the trace, its report's "
                  f"compute {summary['compute_seconds'] * 1e3:.1f} ms, "
                  f"wait {summary['wait_seconds'] * 1e3:.1f} ms")
        others = statistics.median(v for r, v in own.items() if r != SLOWED)
        print(f"step {step}: own work per rank (us) {own}; slowed rank {SLOWED}: "
              f"{own[SLOWED] / others:.2f}x its peers' median")
        self.assertGreater(own[SLOWED], 1.3 * others, own)
        # The traced step's cost: its length against the steps around it.
        print(f"traced step {step} took {doc_step_us(events) / 1e3:.1f} ms (every rank's first "
              f"to last compute span)")
        c.loomctl("cancel", job, identity="user-alice")
        c.wait_state(job, {"CANCELLED"}, timeout=60)


if __name__ == "__main__":
    unittest.main()
