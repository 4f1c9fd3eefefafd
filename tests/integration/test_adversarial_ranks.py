"""Issue 29, against a real coordinator, agent and trainers over mutual TLS:
a rank that misbehaves (a trainer reading hostile data, or a compromised
process holding its own rank token) and a user who floods the coordinator
with expensive work. Each attack must leave the coordinator answering (its
latency measured and printed, not asserted beyond a liveness bound), the
victim job training untouched, no node lost, no process stuck."""

import glob
import os
import sys
import threading
import time
import unittest

import grpc

from loom_cluster import BUILD, Cluster, tiny_job, wait_until

sys.path.insert(0, os.path.join(BUILD, "python"))
from loom.v1 import job_pb2, job_pb2_grpc, node_pb2_grpc, rank_pb2  # noqa: E402

TIMEOUT = 10
MiB = 1024 * 1024


class Latency:
    """GetJob of the victim, timed, as often as it answers, in the background."""

    def __init__(self, jobs, job_id):
        self.jobs, self.job_id = jobs, job_id
        self.seconds, self.failures = [], []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        # The first sample at once: an attack over within the first interval
        # (a flood refused almost whole) is still measured.
        while True:
            start = time.monotonic()
            try:
                self.jobs.GetJob(job_pb2.GetJobRequest(id=self.job_id), timeout=30)
                self.seconds.append(time.monotonic() - start)
            except grpc.RpcError as error:
                self.failures.append(error.code())
            if self.stopping.wait(0.2):
                return

    def stop(self, what):
        self.stopping.set()
        self.thread.join(timeout=40)
        worst = max(self.seconds) if self.seconds else float("nan")
        print(f"\n  {what}: GetJob answered {len(self.seconds)} times, worst {worst * 1000:.0f} ms")
        return worst


class AdversarialRanks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        c = cls.cluster = Cluster("adversarial-ranks")
        # The coordinator's default node timeout (5 s), not the harness's 3 s:
        # "no node lost" under attack is checked against what a cluster runs,
        # and CI once lost node-a under the plan flood at 3.5 s of silence.
        c.start_coordinator(["--job_metrics_grace_s=1", "--node_timeout_s=5"])
        c.start_agent("node-a", "cpu:2")
        wait_until(lambda: "node-a" in c.loomctl("nodes").stdout, 20, "node-a to register")
        cls.channel = c.channel()
        cls.jobs = job_pb2_grpc.JobServiceStub(cls.channel)
        # The victim (alice's) and the attacker's own job (mallory's), one
        # rank each on node-a.
        long_job = lambda name: tiny_job(name=name, steps=100000, ranks=1, eval_interval=0,
                                         ckpt_interval=100000)
        cls.victim = c.submit(long_job("victim"), "victim", identity="user-alice")
        cls.attacker = c.submit(long_job("attacker"), "attacker", identity="user-mallory")
        for job in (cls.victim, cls.attacker):
            wait_until(lambda job=job: cls.job(job).last_progress.step > 0, 120,
                       f"{job} to train")
        cls.registrations = c.log("node-a.log").count("registered")

    @classmethod
    def tearDownClass(cls):
        for job in (cls.victim, cls.attacker):
            cls.cluster.loomctl("cancel", job, check=False)
        cls.channel.close()
        cls.cluster.stop()

    @classmethod
    def job(cls, job_id):
        return cls.jobs.GetJob(job_pb2.GetJobRequest(id=job_id), timeout=TIMEOUT)

    def assert_untouched(self):
        """The victim keeps training in attempt 1; node-a live, not cordoned;
        the agent never lost its session."""
        before = self.job(self.victim).last_progress.step
        wait_until(lambda: self.job(self.victim).last_progress.step > before, 60,
                   "the victim to keep training")
        job = self.job(self.victim)
        self.assertEqual(job_pb2.JobState.Name(job.state), "RUNNING", job.failure_reason)
        self.assertEqual((job.attempt, job.restarts), (1, 0))
        node = [n for n in self.jobs.ListNodes(job_pb2.ListNodesRequest(), timeout=TIMEOUT).nodes
                if n.node_id == "node-a"][0]
        self.assertTrue(node.live)
        self.assertFalse(node.cordoned, node.cordon_reason)
        self.assertEqual(self.cluster.log("node-a.log").count("registered"), self.registrations,
                         "the agent re-registered: its session failed")

    def attacker_token(self):
        pattern = os.path.join(self.cluster.dir, "node-a", "jobs", self.attacker, "attempt_1",
                               "rank_0", "assignment.pb")
        paths = glob.glob(pattern)
        self.assertEqual(len(paths), 1, pattern)
        with open(paths[0], "rb") as f:
            return rank_pb2.RankAssignment.FromString(f.read()).rank_token

    def report(self, **fields):
        return rank_pb2.RankProgress(job_id=self.attacker, attempt=1, rank=0,
                                     time_unix_ms=int(time.time() * 1000), **fields)

    def send(self, reports):
        """Streams reports on the agent's socket with the attacker's own token;
        the status code the stream ended with (OK when it took them all)."""
        # A rank whose agent's lease ran out is paused: its reports answer
        # UNAVAILABLE until the coordinator resumes it, and a trainer sends
        # them again. The sender does the same for up to 30 s. (Under the
        # plan flood the lease ran out in 1 of 3 runs before beats had a path
        # of their own; on a saturated machine it still can: it is printed.)
        deadline = time.monotonic() + 30
        while True:
            channel = self.cluster.agent_channel("node-a", token=self.attacker_token())
            try:
                node_pb2_grpc.AgentServiceStub(channel).ReportProgress(iter(reports), timeout=60)
                return grpc.StatusCode.OK
            except grpc.RpcError as error:
                paused = (error.code() == grpc.StatusCode.UNAVAILABLE and
                          "is paused" in (error.details() or ""))
                if not paused or time.monotonic() > deadline:
                    return error.code()
            finally:
                channel.close()
            time.sleep(0.5)

    # -- a rank's reports were bounded by nothing but the transport ----------------
    def test_a_huge_report_is_refused_at_the_agents_socket(self):
        latency = Latency(self.jobs, self.victim)
        rss = self.cluster.coordinator_rss_bytes()
        # 450,000 experts (3.6 MB), and a 4 MB phase: refused, never forwarded.
        for report in (self.report(phase="step", step=1,
                                   moe=rank_pb2.MoeProgress(tokens_per_expert=[1.0] * 450000)),
                       self.report(phase="x" * (4 * MiB))):
            # The agent's server refuses a message over its receive limit: the
            # client reads RESOURCE_EXHAUSTED, or, when the server reset the
            # stream while the client was still writing the megabytes,
            # UNAVAILABLE. Either way nothing was taken (OK fails), and below:
            # nothing reached the coordinator.
            self.assertIn(self.send([report]),
                          (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE))
        latency.stop("huge reports")
        self.assertLess(self.cluster.coordinator_rss_bytes() - rss, 64 * MiB)
        self.assertIsNone(self.cluster.metric_value("loom_job_expert_tokens", job=self.attacker))
        self.assert_untouched()

    def test_reports_beyond_the_jobs_bounds_are_refused_by_the_coordinator(self):
        latency = Latency(self.jobs, self.victim)
        refused = self.cluster.metric_value("loom_node_progress_refused_total") or 0
        # Each under the agent's per-report bound (7,000 experts: 56 kB), many
        # of them (20 MB in all, more than a session message may carry): the
        # agent batches them within its byte bound, and the coordinator
        # refuses each (a dense job has no experts; the job trains 100,000
        # steps; 40 groups).
        reports = [self.report(phase="step", step=1 + i % 50,
                               moe=rank_pb2.MoeProgress(tokens_per_expert=[1.0] * 7000))
                   for i in range(360)]
        reports += [self.report(phase="step", step=10 ** 9),
                    self.report(phase="ready", groups=[rank_pb2.GroupProgress(group=f"g{i}")
                                                       for i in range(40)])]
        self.assertEqual(self.send(reports), grpc.StatusCode.OK)
        wait_until(lambda: (self.cluster.metric_value("loom_node_progress_refused_total") or 0)
                   >= refused + len(reports), 30, "the coordinator to refuse every report")
        latency.stop("reports beyond the job's bounds")
        self.assertIsNone(self.cluster.metric_value("loom_job_expert_tokens", job=self.attacker))
        self.assertLess(self.job(self.attacker).last_progress.step, 10 ** 9)
        self.assert_untouched()

    # -- one user could hurt everyone ----------------------------------------------
    def test_a_flood_of_plans_from_one_user_holds_no_one_up(self):
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                               "llama-gpu.yaml")) as f:
            example = f.read()
        big = example.replace(
            "parallelism: {dp: 8, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 1}", "parallelism: auto"
        ).replace("nodes: 1, gpus_per_node: 8", "nodes: 512, gpus_per_node: 8")
        mallory = self.cluster.channel("user-mallory")
        plan = job_pb2_grpc.JobServiceStub(mallory).PlanJob
        codes, lock = [], threading.Lock()

        def one():
            try:
                plan(job_pb2.PlanJobRequest(spec_yaml=big, source_name="big.yaml"), timeout=120)
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
            with lock:
                codes.append(code)

        lease_ran_out = self.cluster.log("node-a.log").count("ran out")
        latency = Latency(self.jobs, self.victim)
        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
        # alice still gets a plan while mallory's flood runs.
        alice = self.cluster.channel("user-alice")
        small = tiny_job(name="small", steps=10, ranks=1)
        start = time.monotonic()
        answer = job_pb2_grpc.JobServiceStub(alice).PlanJob(
            job_pb2.PlanJobRequest(spec_yaml=small, source_name="small.yaml"), timeout=120)
        print(f"\n  alice's plan during the flood: {time.monotonic() - start:.2f} s")
        self.assertTrue(answer.candidates)
        for t in threads:
            t.join(timeout=150)
        latency.stop("a flood of plans")
        # At most two of mallory's at once; the rest refused at once.
        self.assertEqual(len(codes), 12)
        self.assertIn(grpc.StatusCode.RESOURCE_EXHAUSTED, codes)
        self.assertEqual(set(codes) - {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED},
                         set())
        alice.close()
        mallory.close()
        # Measured, not asserted (see test_adversarial_bounds' submissions):
        # the node is never lost (assert_untouched), the lease is printed.
        print(f"  the agent's lease ran out "
              f"{self.cluster.log('node-a.log').count('ran out') - lease_ran_out} time(s) meanwhile")
        self.assert_untouched()

    def test_a_launch_too_large_is_refused_before_it_is_built(self):
        """pp 2, a global batch of 5,000,000 sequences in micro-batches of one:
        inside every limit of the spec, but every rank's pipeline instructions
        were built (GBs) before the launch-size check refused the job."""
        rss = self.cluster.coordinator_rss_bytes()
        spec = tiny_job(name="huge-batch", steps=10, ranks=2).replace(
            "global_batch_size: 4", "global_batch_size: 5000000").replace(
            "dp: 2, tp: 1, pp: 1", "dp: 1, tp: 1, pp: 2")
        mallory = job_pb2_grpc.JobServiceStub(self.cluster.channel("user-mallory"))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as caught:
            mallory.SubmitJob(job_pb2.SubmitJobRequest(spec_yaml=spec, source_name="job.yaml"),
                              timeout=60)
        print(f"\n  refused after {time.monotonic() - start:.2f} s, coordinator RSS "
              f"+{(self.cluster.coordinator_rss_bytes() - rss) / MiB:.0f} MiB")
        self.assertEqual(caught.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         caught.exception.details())
        self.assertIn("launch message of every rank would be at least", caught.exception.details())
        self.assertLess(self.cluster.coordinator_rss_bytes() - rss, 256 * MiB)
        self.assert_untouched()

    def test_an_error_quoting_a_huge_value_is_cut_to_the_rule(self):
        mallory = job_pb2_grpc.JobServiceStub(self.cluster.channel("user-mallory"))
        spec = tiny_job(name="n" * 10000, steps=2, ranks=1)
        for call, request in (
                (mallory.SubmitJob, job_pb2.SubmitJobRequest(spec_yaml=spec, source_name="j.yaml")),
                (mallory.PlanJob, job_pb2.PlanJobRequest(spec_yaml=tiny_job(name="p"),
                                                         source_name="j.yaml",
                                                         profile="p" * 100000))):
            with self.assertRaises(grpc.RpcError) as caught:
                call(request, timeout=TIMEOUT)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                             caught.exception.details()[:200])
            self.assertLess(len(caught.exception.details()), 4096)
            self.assertIn("bytes)", caught.exception.details())
        self.assert_untouched()


if __name__ == "__main__":
    unittest.main()
