"""The Python client (client/python, `import loom`) installed the way
docs/client.md says, into a fresh venv with the system's site packages
(Debian's grpcio and protobuf; nothing from a registry), then driven against a
live stack: submit (a path and a dict), steps, wait, logs, list, cancel, the
errors' status codes, and the example in examples/."""

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import unittest

from loom_cluster import Cluster, tiny_job

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

DRIVER = textwrap.dedent("""
    import json, sys, yaml
    import grpc, loom

    address, tls_dir, spec_path = sys.argv[1:4]
    out = {}
    client = loom.Client(address, tls_dir=tls_dir)
    job = client.submit(spec_path)
    out["id"] = job.id
    out["steps"] = list(job.steps())
    out["final"] = job.wait(timeout=240)
    out["state"] = job.state
    out["logs"] = list(job.logs(rank=1))
    out["all"] = list(job.logs(all_ranks=True, tail=1))
    out["listed"] = [j.id for j in client.list()]
    # A dict spec, cancelled while it waits or runs.
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    spec["name"] = "from-a-dict"
    spec["train"]["steps"] = 100000
    long = client.submit(spec)
    # A step of it traced on both ranks (docs/observability.md, "Traces").
    for step in long.steps(timeout=240):
        if step["step"] >= 3:
            break
    # Well ahead: this small job's steps take milliseconds.
    trace = long.trace(step=step["step"] + 100, wait_seconds=60)
    out["trace_processes"] = sorted(e["args"]["name"].split()[1] for e in trace["traceEvents"]
                                    if e["name"] == "process_name")
    out["trace_missing"] = trace["otherData"]["missing_ranks"]
    out["cancelled"] = long.cancel()
    out["cancelled_wait"] = long.wait(timeout=120)
    # Errors keep the gRPC status code.
    try:
        client.get("no-such-job")
    except loom.LoomError as error:
        out["missing_code"] = error.code.name
    bad = dict(spec, train=dict(spec["train"], lr=-1))
    try:
        client.submit(bad)
    except loom.LoomError as error:
        out["bad_code"] = error.code.name
        out["bad_message"] = error.message
    # A failed job raises on wait(), with the diagnosis.
    broken = dict(spec, name="broken", data=dict(spec["data"], train_path="data/missing.txt"))
    broken["train"] = dict(spec["train"], steps=2)
    try:
        client.submit(broken).wait(timeout=240)
        out["failed"] = None
    except loom.JobFailed as failure:
        out["failed"] = [failure.state, failure.diagnosis]
    print(json.dumps(out))
""")


class PythonClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="loom-pyclient-")
        venv = os.path.join(cls.tmp, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                       check=True, timeout=120)
        cls.python = os.path.join(venv, "bin", "python")
        # A copy of the repository's client and protos: the install must not
        # depend on (or write into) the checkout.
        src = os.path.join(cls.tmp, "src")
        shutil.copytree(os.path.join(REPO, "client", "python"), os.path.join(src, "client", "python"))
        shutil.copytree(os.path.join(REPO, "proto"), os.path.join(src, "proto"))
        install = subprocess.run([cls.python, "-m", "pip", "install", "--no-build-isolation",
                                  "--no-deps", "--no-index", os.path.join(src, "client", "python")],
                                 capture_output=True, text=True, timeout=300)
        if install.returncode != 0:
            raise AssertionError(install.stdout + install.stderr)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)
        self.cluster.start_coordinator()
        self.cluster.start_agent("node-a", "cpu:2")

    def run_python(self, *args, env=None, timeout=400):
        result = subprocess.run([self.python, *args], capture_output=True, text=True,
                                timeout=timeout, cwd=self.cluster.dir, env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr +
                         self.cluster.log("coordinator.log")[-3000:])
        return result.stdout

    def test_the_client_against_a_live_stack(self):
        c = self.cluster
        spec = c.write_spec("py", tiny_job(name="py", steps=6, ranks=2, eval_interval=3))
        out = json.loads(self.run_python("-c", DRIVER, c.address, c.tls_dir("user-alice"), spec))
        self.assertEqual([s["step"] for s in out["steps"]], list(range(1, 7)))
        for key in ("step", "loss", "tokens", "step_seconds", "tokens_per_second", "mfu", "attempt"):
            self.assertIn(key, out["steps"][0])
        self.assertIn("val_loss", out["steps"][2])
        self.assertEqual(out["final"], "SUCCEEDED")
        self.assertEqual(out["state"], "SUCCEEDED")
        self.assertTrue(any(line.startswith("step 6/6 loss") for line in out["logs"]), out["logs"][-3:])
        self.assertEqual(sorted(l.split("]")[0] for l in out["all"]), ["[rank 0", "[rank 1"])
        self.assertIn(out["id"], out["listed"])
        self.assertEqual(out["trace_processes"], ["0", "1"])
        self.assertEqual(out["trace_missing"], [])
        self.assertIn(out["cancelled"], ("CANCELLED",))
        self.assertEqual(out["cancelled_wait"], "CANCELLED")
        self.assertEqual(out["missing_code"], "NOT_FOUND")
        self.assertEqual(out["bad_code"], "INVALID_ARGUMENT")
        self.assertIn("lr", out["bad_message"])
        self.assertEqual(out["failed"][0], "FAILED")
        self.assertIn("missing.txt", out["failed"][1])
        # The same jobs through loomctl: the client saw what loomctl sees.
        self.assertIn(out["id"], c.loomctl("list", identity="user-alice").stdout)

    def test_the_example_prints_the_final_validation_loss(self):
        c = self.cluster
        spec = c.write_spec("example", tiny_job(name="example", steps=4, ranks=2, eval_interval=2))
        env = dict(os.environ, LOOM_COORDINATOR=c.address, LOOM_TLS_DIR=c.tls_dir("user-alice"))
        env.pop("LOOM_TOKEN", None)
        out = self.run_python(os.path.join(REPO, "examples", "python_client.py"), spec, env=env)
        self.assertIn("step 4/4 loss", out)
        self.assertRegex(out, r"SUCCEEDED; final validation loss \d+\.\d{4}")

    def test_defaults_come_from_the_environment_and_errors_keep_the_code(self):
        c = self.cluster
        env = dict(os.environ, LOOM_COORDINATOR=c.address, LOOM_TLS_DIR=c.tls_dir("user-bob"))
        env.pop("LOOM_TOKEN", None)
        job = c.submit(tiny_job(name="alices", steps=2, ranks=1), identity="user-alice")
        out = self.run_python("-c", textwrap.dedent(f"""
            import loom
            client = loom.Client()
            print(len(client.list()))
            try:
                client.get("{job}").cancel()
            except loom.LoomError as e:
                print(e.code.name)
            try:
                list(loom.Job("{job}", client=client).logs())
            except loom.LoomError as e:
                print(e.code.name)
        """), env=env)
        # Bob sees none of Alice's jobs and may not touch them.
        lines = out.split()
        self.assertEqual(lines[0], "0")
        self.assertIn(lines[1], ("NOT_FOUND", "PERMISSION_DENIED"))
        self.assertEqual(lines[2], lines[1])


if __name__ == "__main__":
    unittest.main()
