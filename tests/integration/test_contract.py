"""The wire contract from outside C++: a Python client (Debian's
python3-grpcio, stubs generated from proto/ by protoc's gRPC Python plugin)
submits and reads jobs; every validation rule answers INVALID_ARGUMENT naming
the field; an oversize message is refused while the server keeps serving; the
health service answers; reflection is off unless --reflection asks for it."""

import os
import sys
import unittest

import grpc

from loom_cluster import BUILD, Cluster, tiny_job

sys.path.insert(0, os.path.join(BUILD, "python"))
from loom.v1 import job_pb2, job_pb2_grpc  # noqa: E402


class Contract(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster("contract")
        cls.cluster.start_coordinator()
        cls.channel = cls.cluster.channel(identity="admin")
        cls.jobs = job_pb2_grpc.JobServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.cluster.stop()

    def submit(self, yaml_text):
        return self.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec_yaml=yaml_text, source_name="job.yaml",
                                                            base_dir=self.cluster.dir), timeout=10)

    def assert_rejected(self, yaml_text, message):
        before = len(self.jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=10).jobs)
        with self.assertRaises(grpc.RpcError) as caught:
            self.submit(yaml_text)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(message, caught.exception.details())
        after = len(self.jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=10).jobs)
        self.assertEqual(before, after, "a rejected job must not be stored")

    def test_python_client_submits_and_reads_a_job(self):
        job = self.submit(tiny_job(name="from-python", ranks=2)).job
        self.assertTrue(job.id.startswith("job-"))
        self.assertEqual(job.state, job_pb2.PENDING)  # no node yet
        got = self.jobs.GetJob(job_pb2.GetJobRequest(id=job.id), timeout=10)
        self.assertEqual(got.name, "from-python")
        self.assertEqual(got.layout.dp, 2)
        self.assertIn("dp: 2", got.resolved_spec_yaml)
        listed = [j.id for j in self.jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=10).jobs]
        self.assertIn(job.id, listed)
        cancelled = self.jobs.CancelJob(job_pb2.CancelJobRequest(id=job.id), timeout=10)
        self.assertEqual(cancelled.state, job_pb2.CANCELLED)

    def test_unknown_job_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as caught:
            self.jobs.GetJob(job_pb2.GetJobRequest(id="job-999999"), timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_validation_rules(self):
        base = tiny_job(ranks=2)
        cases = [
            (base.replace("num_heads: 2", "num_heads: 3"),
             "model.hidden_size=32 must be divisible by model.num_heads=3"),
            (base.replace("tp: 1", "tp: 4").replace("dp: 2", "dp: 1").replace("ranks: 2", "ranks: 4"),
             "model.num_heads=2 must be divisible by parallelism.tp=4"),
            (base.replace("seq_len: 32", "seq_len: 128"),
             "train.seq_len=128 must not exceed model.max_seq_len=64"),
            (base.replace("micro_batch_size: 1", "micro_batch_size: 3"),
             "train.global_batch_size=4 must be divisible by train.micro_batch_size=3"),
            (base.replace("ranks: 2}", "ranks: 3}"),
             "must equal the number of ranks (3)"),
            (base.replace("steps: 6", "steps: -1"), "train.steps=-1 must be positive"),
            (base.replace("keep: 2", "keep: 0"), "checkpoint.keep=0 must be positive"),
            (base.replace("lr: 3.0e-3", "lr: fast"), "train.lr=fast must be a number"),
            (base.replace("format: text", "format: parquet"),
             "data.format=parquet must be one of text | bin"),
            (base.replace("num_kv_heads: 1", "num_kv_head: 1"), "unknown field model.num_kv_head"),
            (base + "extra: 1\n", "unknown field extra"),
        ]
        for text, message in cases:
            with self.subTest(message=message):
                self.assert_rejected(text, message)

    def test_oversize_message_is_refused_and_server_keeps_serving(self):
        huge = "name: x\n# " + "x" * (20 * 1024 * 1024) + "\n"
        with self.assertRaises(grpc.RpcError) as caught:
            self.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec_yaml=huge), timeout=30)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        # Still serving.
        self.jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=10)
        job = self.submit(tiny_job(name="after-oversize", ranks=1)).job
        self.assertEqual(job.name, "after-oversize")

    def test_health_service(self):
        request = b""  # grpc.health.v1.HealthCheckRequest with service "" (empty message)
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=lambda x: x,
                                         response_deserializer=lambda x: x)
        response = check(request, timeout=10)
        # HealthCheckResponse{status: SERVING (1)}: field 1, varint 1.
        self.assertEqual(response, b"\x08\x01")

    def reflection_services(self, channel):
        # ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
        info = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda x: x, response_deserializer=lambda x: x)
        return list(info(iter([b"\x3a\x00"]), timeout=10))

    def test_server_reflection_is_off_by_default(self):
        with self.assertRaises(grpc.RpcError) as caught:
            self.reflection_services(self.channel)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

    def test_server_reflection_lists_the_services_when_asked(self):
        cluster = Cluster("contract-reflection")
        try:
            cluster.start_coordinator(extra=["--reflection"])
            channel = cluster.channel(identity="admin")
            responses = self.reflection_services(channel)
            channel.close()
        finally:
            cluster.stop()
        self.assertEqual(len(responses), 1)
        for service in (b"loom.v1.JobService", b"loom.v1.NodeService", b"loom.v1.RankService",
                        b"loom.v1.AuthService", b"grpc.health.v1.Health"):
            self.assertIn(service, responses[0])


if __name__ == "__main__":
    unittest.main()
