"""Issue 13's identity attacks, replayed against a real coordinator and a real
agent over mutual TLS with Python grpcio clients written against the protos.
Each attack gets the refusal it should (UNAUTHENTICATED or PERMISSION_DENIED),
and the victim job and node are untouched: the job keeps training, the node
stays live, the refusals are counted in loom_rpcs_total by code."""

import glob
import os
import queue
import subprocess
import sys
import time
import unittest

import grpc

from loom_cluster import BUILD, Cluster, tiny_job, wait_until

sys.path.insert(0, os.path.join(BUILD, "python"))
from loom.v1 import auth_pb2, auth_pb2_grpc  # noqa: E402
from loom.v1 import job_pb2, job_pb2_grpc  # noqa: E402
from loom.v1 import node_pb2, node_pb2_grpc  # noqa: E402
from loom.v1 import rank_pb2, rank_pb2_grpc  # noqa: E402

TIMEOUT = 10


class Session:
    """A NodeService.Session opened by hand: messages go in through a queue."""

    def __init__(self, channel):
        self.outbox = queue.Queue()
        self.replies = node_pb2_grpc.NodeServiceStub(channel).Session(
            iter(self.outbox.get, None), timeout=30)

    def send(self, **kind):
        self.outbox.put(node_pb2.NodeMessage(**kind))

    def close(self):
        self.outbox.put(None)

    def next_reply(self):
        """The next reply that is not a heartbeat's acknowledgement."""
        reply = next(self.replies)
        while reply.HasField("heartbeat_ack"):
            reply = next(self.replies)
        return reply

    def refusal(self):
        """The status code the session ended with (None if it answered)."""
        try:
            next(self.replies)
            return None
        except grpc.RpcError as error:
            return error.code()


def register(node_id, devices=()):
    return node_pb2.RegisterNode(node_id=node_id, hostname="attacker", address="127.0.0.1",
                                 devices=list(devices))


class AdversarialIdentity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        c = cls.cluster = Cluster("adversarial-identity")
        c.start_coordinator()
        c.start_agent("node-a", "cpu:2")
        wait_until(lambda: "node-a" in c.loomctl("nodes").stdout, 20, "node-a to register")
        # The victim: alice's long job, running on node-a.
        cls.job = c.submit(tiny_job(name="victim", steps=100000, ranks=2, eval_interval=0,
                                    ckpt_interval=1000).replace("val_path: data/val.txt, ", ""),
                           "victim", identity="user-alice")
        cls.alice = c.channel("user-alice")
        wait_until(lambda: cls.victim().last_progress.step >= 2, 120, "the victim job to train")

    @classmethod
    def tearDownClass(cls):
        try:
            job_pb2_grpc.JobServiceStub(cls.alice).CancelJob(job_pb2.CancelJobRequest(id=cls.job),
                                                             timeout=TIMEOUT)
        finally:
            cls.alice.close()
            cls.cluster.stop()

    @classmethod
    def victim(cls):
        return job_pb2_grpc.JobServiceStub(cls.alice).GetJob(job_pb2.GetJobRequest(id=cls.job),
                                                             timeout=TIMEOUT)

    def assert_code(self, code, call, *args, **kwargs):
        with self.assertRaises(grpc.RpcError) as caught:
            result = call(*args, timeout=TIMEOUT, **kwargs)
            if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
                list(result)
        self.assertEqual(caught.exception.code(), code, caught.exception.details())
        # One line, saying why.
        self.assertNotIn("\n", caught.exception.details())
        return caught.exception.details()

    def assert_victim_untouched(self):
        """Still RUNNING, still training (a later step arrives), node-a still live."""
        before = self.victim().last_progress.step
        self.assertGreater(before, 0)
        wait_until(lambda: self.victim().last_progress.step > before, 60,
                   "the victim job to keep training")
        job = self.victim()
        self.assertEqual(job_pb2.JobState.Name(job.state), "RUNNING", job.failure_reason)
        self.assertEqual(job.attempt, 1)
        self.assertLess(job.last_progress.step, 999999)
        nodes = self.cluster.loomctl("nodes").stdout
        self.assertRegex(nodes, r"node-a\s+\S+\s+yes")

    # -- any client could list, watch and cancel every job ---------------------
    def test_other_users_cannot_see_watch_or_cancel_the_job(self):
        bob = self.cluster.channel("user-bob")
        jobs = job_pb2_grpc.JobServiceStub(bob)
        listed = jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=TIMEOUT).jobs
        self.assertNotIn(self.job, [j.id for j in listed])
        for call, request in ((jobs.GetJob, job_pb2.GetJobRequest(id=self.job)),
                              (jobs.CancelJob, job_pb2.CancelJobRequest(id=self.job)),
                              (jobs.WatchJob, job_pb2.WatchJobRequest(id=self.job))):
            # The answer for a job that does not exist, word for word: ids
            # cannot be enumerated by probing.
            foreign = self.assert_code(grpc.StatusCode.NOT_FOUND, call, request)
            absent_id = self.job[:-1] + ("0" if self.job[-1] != "0" else "1") + "9"
            absent = self.assert_code(grpc.StatusCode.NOT_FOUND, call,
                                      type(request)(id=absent_id))
            self.assertEqual(foreign.replace(self.job, "ID"), absent.replace(absent_id, "ID"))
        self.assertEqual(self.cluster.loomctl("cancel", self.job, identity="user-bob",
                                              check=False).returncode, 1)
        # Node-level calls are the admin's.
        self.assert_code(grpc.StatusCode.PERMISSION_DENIED, jobs.ListNodes,
                         job_pb2.ListNodesRequest())
        bob.close()
        # The owner and the admin see it.
        self.assertIn(self.job, self.cluster.loomctl("list", identity="user-alice").stdout)
        self.assertIn(self.job, self.cluster.loomctl("list", identity="admin").stdout)
        self.assertIn("owner:     alice", self.cluster.status(self.job, identity="user-alice"))
        self.assert_victim_untouched()

    def test_callers_without_a_credential_are_unauthenticated(self):
        anonymous = self.cluster.channel(identity=None)
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                         job_pb2_grpc.JobServiceStub(anonymous).ListJobs, job_pb2.ListJobsRequest())
        forged = self.cluster.channel(identity=None, token="loomu1." + "00" * 32)
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                         job_pb2_grpc.JobServiceStub(forged).CancelJob,
                         job_pb2.CancelJobRequest(id=self.job))
        anonymous.close()
        forged.close()
        self.assert_victim_untouched()

    def test_bearer_tokens_are_per_user_and_revocable(self):
        c = self.cluster
        # Only an admin issues tokens.
        alice_auth = auth_pb2_grpc.AuthServiceStub(self.alice)
        self.assert_code(grpc.StatusCode.PERMISSION_DENIED, alice_auth.CreateToken,
                         auth_pb2.CreateTokenRequest(user="alice"))
        token = c.loomctl("token", "create", "--user=carol").stdout.strip()
        self.assertTrue(token)
        self.assertEqual(c.loomctl("whoami", identity=None, token=token).stdout.strip(),
                         "carol (user)")
        # carol sees none of alice's jobs and cannot cancel them.
        self.assertNotIn(self.job, c.loomctl("list", identity=None, token=token).stdout)
        refused = c.loomctl("cancel", self.job, identity=None, token=token, check=False)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("does not exist", refused.stderr)
        # The state dir keeps only a hash.
        with open(os.path.join(c.state_dir, "tokens")) as f:
            self.assertNotIn(token, f.read())
        c.loomctl("token", "revoke", "--user=carol")
        self.assertEqual(c.loomctl("whoami", identity=None, token=token, check=False).returncode, 1)
        self.assert_victim_untouched()

    # -- reflection showed the whole API ------------------------------------------
    # -- issue 29: identities ------------------------------------------------------
    def odd_certificate(self, name, subject):
        """A certificate the cluster CA signs with `subject` (openssl -subj)."""
        c = self.cluster
        d = os.path.join(c.dir, "odd", name)
        os.makedirs(d, exist_ok=True)
        ca = os.path.join(c.certs, "ca")
        ext = os.path.join(d, "ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=critical,CA:FALSE\n"
                    "keyUsage=critical,digitalSignature,keyEncipherment\n"
                    "extendedKeyUsage=clientAuth\n")
        run = lambda *args: subprocess.run(args, check=True, capture_output=True, timeout=60)
        run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout",
            "-out", os.path.join(d, "tls.key"))
        run("openssl", "req", "-new", "-key", os.path.join(d, "tls.key"), "-subj", subject,
            "-out", os.path.join(d, "tls.csr"))
        run("openssl", "x509", "-req", "-in", os.path.join(d, "tls.csr"),
            "-CA", os.path.join(ca, "ca.crt"), "-CAkey", os.path.join(ca, "ca.key"),
            "-CAserial", os.path.join(ca, "ca.srl"), "-CAcreateserial", "-days", "1",
            "-sha256", "-extfile", ext, "-out", os.path.join(d, "tls.crt"))

        def read(path):
            with open(path, "rb") as f:
                return f.read()
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(os.path.join(ca, "ca.crt")),
            private_key=read(os.path.join(d, "tls.key")),
            certificate_chain=read(os.path.join(d, "tls.crt")))
        return grpc.secure_channel(self.cluster.address, credentials)

    def test_a_role_cannot_hide_in_another_field_of_the_subject(self):
        """The subject as a string ("O=x\\,OU=admin,OU=user,CN=...") was split at
        every ',' and '/': an O holding ",OU=admin" made a user an admin."""
        for name, subject in (("comma", "/CN=mallory/OU=user/O=x,OU=admin"),
                              ("slash", "/CN=mallory/OU=user/O=x\\/OU=admin")):
            with self.subTest(name=name):
                channel = self.odd_certificate(name, subject)
                me = auth_pb2_grpc.AuthServiceStub(channel).WhoAmI(auth_pb2.WhoAmIRequest(),
                                                                    timeout=TIMEOUT)
                self.assertEqual((me.name, me.role), ("mallory", "user"))
                self.assert_code(grpc.StatusCode.PERMISSION_DENIED,
                                 job_pb2_grpc.JobServiceStub(channel).ListNodes,
                                 job_pb2.ListNodesRequest())
                channel.close()
        # Two roles in two OU entries: no role at all.
        channel = self.odd_certificate("two-roles", "/CN=mallory/OU=user/OU=admin")
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                         auth_pb2_grpc.AuthServiceStub(channel).WhoAmI, auth_pb2.WhoAmIRequest())
        channel.close()
        self.assert_victim_untouched()

    def test_a_token_is_not_the_certificate_of_the_same_name(self):
        """A token minted for "alice" (or "admin") owned alice's (the admin's) jobs."""
        c = self.cluster
        for user in ("alice", "admin"):
            token = c.loomctl("token", "create", f"--user={user}").stdout.strip()
            channel = c.channel(identity=None, token=token)
            jobs = job_pb2_grpc.JobServiceStub(channel)
            self.assertNotIn(self.job, [j.id for j in jobs.ListJobs(job_pb2.ListJobsRequest(),
                                                                   timeout=TIMEOUT).jobs])
            self.assert_code(grpc.StatusCode.NOT_FOUND, jobs.CancelJob,
                             job_pb2.CancelJobRequest(id=self.job))
            channel.close()
            c.loomctl("token", "revoke", f"--user={user}")
        self.assert_victim_untouched()

    def test_revoking_a_token_ends_its_open_watch(self):
        c = self.cluster
        token = c.loomctl("token", "create", "--user=dave").stdout.strip()
        channel = c.channel(identity=None, token=token)
        jobs = job_pb2_grpc.JobServiceStub(channel)
        # dave's own job (it waits: the victim holds node-a's devices).
        spec = tiny_job(name="daves", steps=100000, ranks=2, eval_interval=0, ckpt_interval=0)
        job = jobs.SubmitJob(job_pb2.SubmitJobRequest(spec_yaml=spec, source_name="job.yaml"),
                             timeout=TIMEOUT).job.id
        stream = jobs.WatchJob(job_pb2.WatchJobRequest(id=job), timeout=60)
        self.assertEqual(next(stream).job.id, job)
        revoked_at = time.monotonic()
        c.loomctl("token", "revoke", "--user=dave")
        with self.assertRaises(grpc.RpcError) as caught:
            for _ in stream:
                pass
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED,
                         caught.exception.details())
        print(f"\n  watch ended {time.monotonic() - revoked_at:.2f} s after the revocation")
        self.assertLess(time.monotonic() - revoked_at, 30)
        channel.close()
        c.loomctl("cancel", job)
        self.assert_victim_untouched()

    def test_reflection_is_off(self):
        info = self.alice.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda x: x, response_deserializer=lambda x: x)
        with self.assertRaises(grpc.RpcError) as caught:
            list(info(iter([b"\x3a\x00"]), timeout=TIMEOUT))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

    # -- anyone could open a node session, or replace a live node --------------
    def test_a_session_needs_a_node_certificate(self):
        for identity, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                               ("user-bob", grpc.StatusCode.PERMISSION_DENIED),
                               ("admin", grpc.StatusCode.PERMISSION_DENIED)):
            channel = self.cluster.channel(identity)
            session = Session(channel)
            session.send(register=register("node-a", [node_pb2.Device(kind="cpu", count=4)]))
            self.assertEqual(session.refusal(), code, identity)
            session.close()
            channel.close()
        self.assert_victim_untouched()

    def test_a_node_cannot_take_another_nodes_id(self):
        # node-x holds a valid node certificate, but not node-a's.
        channel = self.cluster.channel("node-x")
        session = Session(channel)
        session.send(register=register("node-a", [node_pb2.Device(kind="cpu", count=4)]))
        self.assertEqual(session.refusal(), grpc.StatusCode.PERMISSION_DENIED)
        session.close()
        channel.close()
        # Even node-a's own certificate cannot open a second session while the
        # agent's is alive.
        channel = self.cluster.channel("node-a")
        session = Session(channel)
        session.send(register=register("node-a", [node_pb2.Device(kind="cpu", count=4)]))
        self.assertEqual(session.refusal(), grpc.StatusCode.PERMISSION_DENIED)
        session.close()
        channel.close()
        self.assert_victim_untouched()
        self.assertIn("node-a: registered", self.cluster.log("coordinator.log"))
        self.assertEqual(self.cluster.log("coordinator.log").count("node node-a: registered"), 1)

    # -- a session that runs none of a job's ranks ended or finished it --------
    def test_rank_exits_from_a_node_that_does_not_run_the_ranks_are_ignored(self):
        channel = self.cluster.channel("node-y")
        session = Session(channel)
        session.send(register=register("node-y"))  # no devices: nothing is placed here
        reply = next(session.replies)
        self.assertEqual(reply.registered.node_id, "node-y")
        attempt = self.victim().attempt
        for exit_code in (3, 0):
            for rank in (0, 1):
                session.send(rank_exited=node_pb2.RankExited(
                    job_id=self.job, attempt=attempt, rank=rank, exit_code=exit_code,
                    log_tail="forged by node-y"))
        session.send(heartbeat=node_pb2.Heartbeat(seq=1))
        # A second registration on the same stream is answered after every
        # message before it was handled: the forged exits have been seen.
        session.send(register=register("node-y"))
        self.assertEqual(session.next_reply().registered.node_id, "node-y")
        self.assertIn(f"job {self.job}: ignored an exit of rank 0 from node node-y",
                      self.cluster.log("coordinator.log"))
        self.assert_victim_untouched()
        self.assertNotIn("forged", self.victim().failure_reason)
        session.close()
        channel.close()

    # -- anyone's progress set another job's step ---------------------------------
    def test_progress_goes_only_through_the_agent_that_runs_the_rank(self):
        attempt = self.victim().attempt
        forged = rank_pb2.RankProgress(job_id=self.job, attempt=attempt, rank=0, phase="step",
                                       step=999999, tokens_per_second=5e9, flops_per_token=1e9)
        # The coordinator takes no progress from ranks any more, even with a real token.
        channel = self.cluster.channel("node-a", token=self.rank_token(0))
        report = channel.stream_unary("/loom.v1.RankService/ReportProgress",
                                      request_serializer=rank_pb2.RankProgress.SerializeToString,
                                      response_deserializer=rank_pb2.ReportProgressResponse.FromString)
        self.assert_code(grpc.StatusCode.UNIMPLEMENTED, report, iter([forged]))
        channel.close()

        # Another node's session speaking for node-a's ranks: ignored and counted.
        channel = self.cluster.channel("node-y")
        session = Session(channel)
        session.send(register=register("node-y"))
        self.assertEqual(next(session.replies).registered.node_id, "node-y")
        session.send(progress=node_pb2.RankProgressBatch(reports=[forged]))
        # A second registration is answered after the batch before it was handled.
        session.send(register=register("node-y"))
        self.assertEqual(next(session.replies).registered.node_id, "node-y")
        self.assertIn("node node-y: ignored 1 progress reports",
                      self.cluster.log("coordinator.log"))
        self.assertGreaterEqual(self.cluster.metric_value("loom_node_progress_refused_total"), 1)
        # A batch above the bound ends the session, naming the rule.
        session.send(progress=node_pb2.RankProgressBatch(reports=[forged] * 1025))
        with self.assertRaises(grpc.RpcError) as caught:
            next(session.replies)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("at most 1024", caught.exception.details())
        channel.close()

        # node-a's agent: no token, a token it did not issue, or a real token
        # reporting for another rank are all refused.
        rpc = lambda channel: node_pb2_grpc.AgentServiceStub(channel).ReportProgress
        for token in (None, "loomr1.forged"):
            channel = self.cluster.agent_channel("node-a", token=token)
            self.assert_code(grpc.StatusCode.PERMISSION_DENIED, rpc(channel), iter([forged]))
            channel.close()
        channel = self.cluster.agent_channel("node-a", token=self.rank_token(0))
        forged.rank = 1
        self.assert_code(grpc.StatusCode.PERMISSION_DENIED, rpc(channel), iter([forged]))
        channel.close()
        self.assert_victim_untouched()

    # -- rendezvous keys of other attempts were readable and writable ------------
    def test_store_calls_stay_in_the_callers_attempt(self):
        namespace = self.assignment(0).store_namespace
        other = f"{self.job}/attempt-2"  # the next attempt's, written in advance
        for identity, code in (("node-y", grpc.StatusCode.PERMISSION_DENIED),
                               ("user-alice", grpc.StatusCode.PERMISSION_DENIED),
                               (None, grpc.StatusCode.UNAUTHENTICATED)):
            channel = self.cluster.channel(identity)
            stub = rank_pb2_grpc.RankServiceStub(channel)
            self.assert_code(code, stub.StoreGet,
                             rank_pb2.StoreGetRequest(store_namespace=namespace, key="gloo/0"))
            self.assert_code(code, stub.StoreSet, rank_pb2.StoreSetRequest(
                store_namespace=other, key="gloo/0", value=b"poison"))
            channel.close()
        # A real rank token opens its own namespace and no other.
        channel = self.cluster.channel("node-a", token=self.rank_token(0))
        stub = rank_pb2_grpc.RankServiceStub(channel)
        stub.StoreAdd(rank_pb2.StoreAddRequest(store_namespace=namespace, key="probe", delta=1),
                      timeout=TIMEOUT)
        for ns in (other, "job-999999/attempt-1"):
            self.assert_code(grpc.StatusCode.PERMISSION_DENIED, stub.StoreSet,
                             rank_pb2.StoreSetRequest(store_namespace=ns, key="k", value=b"v"))
        channel.close()

        # Ranks reach the store through their agent's socket: there, no token or
        # a token the agent did not issue is refused before anything is relayed,
        # and a real rank token opens its own namespace and no other.
        for token in (None, "loomr1.forged"):
            channel = self.cluster.agent_channel("node-a", token=token)
            agent = node_pb2_grpc.AgentServiceStub(channel)
            self.assert_code(grpc.StatusCode.PERMISSION_DENIED, agent.StoreGet,
                             rank_pb2.StoreGetRequest(store_namespace=namespace, key="gloo/0"))
            self.assert_code(grpc.StatusCode.PERMISSION_DENIED, agent.StoreAdd,
                             rank_pb2.StoreAddRequest(store_namespace=namespace, key="probe",
                                                      delta=100))
            channel.close()
        channel = self.cluster.agent_channel("node-a", token=self.rank_token(0))
        agent = node_pb2_grpc.AgentServiceStub(channel)
        added = agent.StoreAdd(rank_pb2.StoreAddRequest(store_namespace=namespace, key="probe",
                                                        delta=1), timeout=TIMEOUT)
        self.assertEqual(added.value, 2)  # the add above, at the coordinator, and this one
        for ns in (other, "job-999999/attempt-1"):
            with self.assertRaises(grpc.RpcError) as caught:
                agent.StoreSet(rank_pb2.StoreSetRequest(store_namespace=ns, key="k", value=b"v"),
                               timeout=TIMEOUT)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
            self.assertIn(f"store_namespace '{ns}'", caught.exception.details())
        channel.close()
        self.assert_victim_untouched()

    def test_a_node_cannot_batch_store_ops_with_another_nodes_rank_token(self):
        namespace = self.assignment(0).store_namespace
        stolen = self.rank_token(0)  # node-a's rank 0
        channel = self.cluster.channel("node-y")
        stub = rank_pb2_grpc.RankServiceStub(channel)
        batch = rank_pb2.StoreBatchRequest(ops=[
            rank_pb2.StoreOp(rank_token=stolen, set=rank_pb2.StoreSetRequest(
                store_namespace=namespace, key="gloo/0", value=b"poison")),
            rank_pb2.StoreOp(rank_token=stolen, add=rank_pb2.StoreAddRequest(
                store_namespace=namespace, key="probe-batch", delta=100)),
            rank_pb2.StoreOp(rank_token="loomr1.forged", add=rank_pb2.StoreAddRequest(
                store_namespace=namespace, key="probe-batch", delta=100)),
        ])
        response = stub.StoreBatch(batch, timeout=TIMEOUT)
        self.assertEqual(len(response.results), 3)
        for result in response.results:
            self.assertEqual(result.code, grpc.StatusCode.UNAUTHENTICATED.value[0], result.message)
        self.assertIn("another node", response.results[0].message)
        channel.close()
        # A user may not call it at all; too many ops are refused naming the bound.
        alice = rank_pb2_grpc.RankServiceStub(self.alice)
        self.assert_code(grpc.StatusCode.PERMISSION_DENIED, alice.StoreBatch, batch)
        channel = self.cluster.channel("node-a")
        stub = rank_pb2_grpc.RankServiceStub(channel)
        too_many = rank_pb2.StoreBatchRequest(ops=[batch.ops[1]] * 1025)
        details = self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, stub.StoreBatch, too_many)
        self.assertIn("StoreBatchRequest.ops", details)
        # node-a itself, with its own rank's token: applied; nothing of the
        # refused ops above was.
        own = rank_pb2.StoreBatchRequest(ops=[rank_pb2.StoreOp(
            rank_token=stolen, add=rank_pb2.StoreAddRequest(
                store_namespace=namespace, key="probe-batch", delta=1))])
        response = stub.StoreBatch(own, timeout=TIMEOUT)
        self.assertEqual(response.results[0].code, 0, response.results[0].message)
        self.assertEqual(response.results[0].value, 1)
        channel.close()
        self.assert_victim_untouched()

    def test_refusals_are_counted_by_code(self):
        bob = self.cluster.channel("user-bob")
        self.assert_code(grpc.StatusCode.PERMISSION_DENIED,
                         job_pb2_grpc.JobServiceStub(bob).ListNodes, job_pb2.ListNodesRequest())
        # Another owner's job answers as an absent one, and is counted so.
        self.assert_code(grpc.StatusCode.NOT_FOUND,
                         job_pb2_grpc.JobServiceStub(bob).CancelJob,
                         job_pb2.CancelJobRequest(id=self.job))
        bob.close()
        self.assertGreaterEqual(self.cluster.metric_value(
            "loom_rpcs_total", method="/loom.v1.JobService/ListNodes", code="PERMISSION_DENIED"), 1)
        self.assertGreaterEqual(self.cluster.metric_value(
            "loom_rpcs_total", method="/loom.v1.JobService/CancelJob", code="NOT_FOUND"), 1)

    # -- helpers -------------------------------------------------------------
    def assignment(self, rank):
        pattern = os.path.join(self.cluster.dir, "node-a", "jobs", self.job, "attempt_1",
                               f"rank_{rank}", "assignment.pb")
        paths = glob.glob(pattern)
        self.assertEqual(len(paths), 1, pattern)
        with open(paths[0], "rb") as f:
            return rank_pb2.RankAssignment.FromString(f.read())

    def rank_token(self, rank):
        token = self.assignment(rank).rank_token
        self.assertTrue(token.startswith("loomr1."))
        return token


if __name__ == "__main__":
    unittest.main()
