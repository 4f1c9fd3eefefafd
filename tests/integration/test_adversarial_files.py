"""Issue 13's confinement bullets, replayed against a real coordinator and
agent by a client written against the protos: data paths outside the roots,
'..', a symlink out of a root, the first bytes of a file the job may not
read, checkpoint.dir aimed at another job or at an unrelated directory, the
client's base_dir, a symlink planted in a rank directory, and crafted
checkpoints given to `loomctl export` and to a resuming job; and (issue 29)
export led to files outside the step directory, to devices, FIFOs and links,
a model too large for its checkpoint, and a data path that is a directory. Each shows the
new outcome: INVALID_ARGUMENT naming the field and rule at submission, or a
job that fails at once (exit 3) with a message that carries no file bytes,
and the victim's files untouched."""

import json
import os
import re
import shutil
import struct
import sys
import time
import unittest
import zlib

import grpc

from loom_cluster import BIN, BUILD, Cluster, tiny_job, wait_until

sys.path.insert(0, os.path.join(BUILD, "python"))
from loom.v1 import job_pb2, job_pb2_grpc  # noqa: E402

SECRET = b"\x2a\x17\x93\x01SECRET-BYTES-0123456789"  # magic 0x0193172a as the first int32
SECRET_INT = str(struct.unpack("<i", SECRET[:4])[0])


class AdversarialFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        c = cls.cluster = Cluster("adversarial-files")
        c.start_coordinator()
        c.start_agent("node-a", "cpu:2")
        cls.channel = c.channel()
        cls.jobs = job_pb2_grpc.JobServiceStub(cls.channel)
        # A file no job may read (on a shared cluster: root-only, elsewhere).
        cls.outside = os.path.join(c.dir, "outside")
        os.makedirs(cls.outside)
        cls.secret = os.path.join(cls.outside, "secret.bin")
        with open(cls.secret, "wb") as f:
            f.write(SECRET)
        # A victim job that ran to the end: its checkpoints must never change.
        cls.victim = c.submit(tiny_job(name="victim", steps=3, ranks=1, eval_interval=0,
                                       ckpt_interval=1), "victim")
        c.wait_state(cls.victim, ("SUCCEEDED", "FAILED"), timeout=180)
        cls.victim_dir = c.checkpoint_dir(cls.victim)
        cls.victim_listing = cls.listing(cls.victim_dir)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.cluster.stop()

    @staticmethod
    def listing(root):
        out = {}
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = zlib.crc32(f.read())
        return out

    @staticmethod
    def read(path):
        with open(path) as f:
            return f.read()

    def submit(self, spec, base_dir=""):
        return self.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec_yaml=spec, source_name="job.yaml",
                                                            base_dir=base_dir), timeout=10)

    def assert_refused(self, spec, *fragments, base_dir=""):
        with self.assertRaises(grpc.RpcError) as caught:
            self.submit(spec, base_dir)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         caught.exception.details())
        for fragment in fragments:
            self.assertIn(fragment, caught.exception.details())
        return caught.exception.details()

    def assert_no_secret(self, text):
        self.assertNotIn("SECRET", text)
        self.assertNotIn(SECRET_INT, text)

    def tearDown(self):
        # Whatever a test tried, the victim's checkpoints are as they were.
        self.assertEqual(self.listing(self.victim_dir), self.victim_listing)

    # -- data paths ------------------------------------------------------------
    def test_data_paths_outside_the_roots_are_refused_at_submission(self):
        base = tiny_job(name="thief", steps=2, ranks=1)
        for path, rule in ((self.secret, "outside the data roots"),
                           ("/etc/passwd", "outside the data roots"),
                           ("../outside/secret.bin", "'..'"),
                           ("data/../../outside/secret.bin", "'..'")):
            with self.subTest(path=path):
                details = self.assert_refused(base.replace("data/train.txt", path),
                                              "data.train_path", rule)
                self.assert_no_secret(details)
        self.assert_refused(base.replace("data/val.txt", "/etc/hostname"), "data.val_path")

    def test_symlink_out_of_a_root_fails_the_job_without_showing_its_bytes(self):
        c = self.cluster
        link = os.path.join(c.data_root, "data", "innocent.bin")
        os.symlink(self.secret, link)
        spec = tiny_job(name="bin-thief", steps=2, ranks=1, eval_interval=0).replace(
            "data/train.txt, val_path: data/val.txt, format: text",
            "data/innocent.bin, format: bin")
        job = c.submit(spec, "bin-thief")
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED")
        status = c.status(job)
        self.assertIn("outside the data roots", status)
        self.assertIn("restarts 0", status)  # exit 3: the job is broken, not retried
        self.assert_no_secret(status)

    def test_a_bad_token_file_inside_the_root_shows_no_bytes(self):
        c = self.cluster
        with open(os.path.join(c.data_root, "data", "bad.bin"), "wb") as f:
            f.write(SECRET + b"\0" * 1020)
        spec = tiny_job(name="bad-bin", steps=2, ranks=1, eval_interval=0).replace(
            "data/train.txt, val_path: data/val.txt, format: text", "data/bad.bin, format: bin")
        job = c.submit(spec, "bad-bin")
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED")
        status = c.status(job)
        self.assertIn("wrong magic number", status)
        self.assert_no_secret(status)

    def test_base_dir_from_the_client_is_not_trusted(self):
        c = self.cluster
        spec = tiny_job(name="based", steps=2, ranks=1).replace("data/train.txt", "secret.bin")
        job = self.submit(spec, base_dir=self.outside).job
        self.assertIn(f"train_path: {c.data_root}/secret.bin", job.resolved_spec_yaml)
        self.assertNotIn(self.outside, job.resolved_spec_yaml)
        c.expect_end(job.id, ("FAILED", "SUCCEEDED"), "FAILED")
        self.assert_no_secret(c.status(job.id))

    # -- checkpoints -----------------------------------------------------------
    def test_checkpoint_dir_cannot_name_another_place(self):
        unrelated = os.path.join(self.cluster.dir, "unrelated")
        os.makedirs(os.path.join(unrelated, ".step_00000001.tmp-1"))
        base = tiny_job(name="squatter", steps=2, ranks=1)
        for target in (self.victim_dir, unrelated, "../checkpoints/default"):
            with self.subTest(target=target):
                self.assert_refused(base.replace("dir: checkpoints", f"dir: {target}"),
                                    "checkpoint.dir")
        self.assertTrue(os.path.isdir(os.path.join(unrelated, ".step_00000001.tmp-1")))

    def test_same_checkpoint_name_gets_a_directory_of_its_own(self):
        c = self.cluster
        # The victim's spec said `dir: checkpoints` too.
        job = c.submit(tiny_job(name="neighbour", steps=2, ranks=1, eval_interval=0,
                                ckpt_interval=1), "neighbour")
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "SUCCEEDED", timeout=180)
        self.assertNotEqual(c.checkpoint_dir(job), self.victim_dir)
        self.assertTrue(os.listdir(c.checkpoint_dir(job)))

    def test_resume_from_names_only_a_job(self):
        base = tiny_job(name="borrower", steps=2, ranks=1)
        for target, rule in (("job-000000-999999", "is not one of your jobs"),
                             ("../default/" + self.victim, "must be a job id")):
            with self.subTest(target=target):
                self.assert_refused(base.replace("keep: 2", f"keep: 2, resume_from: {target}"),
                                    "checkpoint.resume_from", rule)

    # -- rank directories and job ids ------------------------------------------
    def test_job_ids_are_unique_to_the_state_directory(self):
        c = self.cluster
        prefix = self.read(os.path.join(c.state_dir, "job_id_prefix")).strip()
        self.assertRegex(self.victim, rf"^job-{prefix}-\d{{6}}$")
        other = Cluster("adversarial-files-other")
        try:
            other.start_coordinator()
            job = other.submit(tiny_job(name="elsewhere"), "elsewhere")
            self.assertNotEqual(job.rsplit("-", 1)[0], self.victim.rsplit("-", 1)[0])
        finally:
            other.stop()

    def test_symlink_planted_in_a_rank_directory_is_not_followed(self):
        c = self.cluster
        victim_file = os.path.join(self.outside, "precious.txt")
        with open(victim_file, "w") as f:
            f.write("precious")
        # The next job id is guessable by someone who can read the state
        # directory; the agent still never reuses a rank directory.
        prefix = self.read(os.path.join(c.state_dir, "job_id_prefix")).strip()
        probe = c.submit(tiny_job(name="probe", steps=1, ranks=1, eval_interval=0), "probe")
        upcoming = f"job-{prefix}-{int(probe.rsplit('-', 1)[1]) + 1:06d}"
        rank_dir = os.path.join(c.dir, "node-a", "jobs", upcoming, "attempt_1", "rank_0")
        os.makedirs(rank_dir)
        os.symlink(victim_file, os.path.join(rank_dir, "log.txt"))
        job = c.submit(tiny_job(name="planted", steps=2, ranks=1), "planted")
        self.assertEqual(job, upcoming)
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED")
        self.assertIn("never reused", c.status(job))
        with open(victim_file) as f:
            self.assertEqual(f.read(), "precious")

    def test_new_rank_directories_are_private(self):
        c = self.cluster
        rank_dir = os.path.join(c.dir, "node-a", "jobs", self.victim, "attempt_1", "rank_0")
        self.assertEqual(os.stat(rank_dir).st_mode & 0o777, 0o700)
        self.assertEqual(os.stat(self.victim_dir).st_mode & 0o777, 0o700)

    # -- crafted checkpoints ---------------------------------------------------
    def crafted_copy(self, name, edit_meta=None, edit_index=None):
        steps = sorted(d for d in os.listdir(self.victim_dir) if d.startswith("step_"))
        copy = os.path.join(self.cluster.dir, name)
        shutil.copytree(os.path.join(self.victim_dir, steps[-1]), copy)
        with open(os.path.join(copy, "metadata.json")) as f:
            meta = json.load(f)
        if edit_index:
            with open(os.path.join(copy, "index.json")) as f:
                index = json.load(f)
            edit_index(index)
            data = json.dumps(index).encode()
            with open(os.path.join(copy, "index.json"), "wb") as f:
                f.write(data)
            meta["files"]["index.json"] = {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
        if edit_meta:
            edit_meta(meta)
        with open(os.path.join(copy, "metadata.json"), "w") as f:
            json.dump(meta, f)
        return copy

    def test_export_of_a_crafted_checkpoint_is_an_error_with_nothing_written(self):
        c = self.cluster

        def zero_heads(meta):
            meta["model"]["num_heads"] = 0

        def huge_shape(index):
            index["tensors"]["model.embed_tokens.weight"]["shape"] = [2 ** 62, 4]

        for name, kwargs, fault in (("zero-heads", dict(edit_meta=zero_heads), "model.num_heads=0"),
                                    ("huge-shape", dict(edit_index=huge_shape),
                                     "model.embed_tokens.weight")):
            with self.subTest(name=name):
                out = os.path.join(c.dir, f"hf-{name}")
                result = c.loomctl("export", "--format=hf", self.crafted_copy(name, **kwargs), out,
                                   check=False)
                self.assertNotEqual(result.returncode, 0)
                self.assertLess(result.returncode, 128, "killed by a signal")
                self.assertIn(fault, result.stderr)
                self.assertFalse(os.path.exists(out))
                self.assertFalse([e for e in os.listdir(c.dir) if ".export-" in e])

    def test_export_opens_only_regular_files_of_the_step_directory(self):
        """Issue 29: an index naming /dev/zero aborted export, a FIFO hung it,
        /etc/passwd (or a symlink to it) put its size and CRC in the error,
        and a model of 4,096 layers x 4,096 experts aborted on allocation."""
        c = self.cluster

        def listing(name):
            def edit(meta):
                meta["files"][name] = {"bytes": 10, "crc32": "00000000"}
            return edit

        def many_experts(meta):
            meta["model"]["moe"] = {
                "num_experts": 4096, "top_k": 2, "expert_ffn_hidden_size": 64,
                "num_shared_experts": 0, "first_dense_layers": 0, "aux_loss_coef": 0.01,
                "bias_update_rate": 0.0, "router_score": "softmax"}

        cases = [("absolute", dict(edit_meta=listing("/dev/zero")), "not a plain name"),
                 ("dotdot", dict(edit_meta=listing(f"../outside/{os.path.basename(self.secret)}")),
                  "not a plain name"),
                 ("experts", dict(edit_meta=many_experts), "expert tensors")]
        for name, kwargs, fault in cases:
            with self.subTest(name=name):
                self.assert_export_refused(self.crafted_copy(name, **kwargs), name, fault)
        # A listed shard replaced by a symlink to the secret, by a FIFO, by a
        # directory: never opened through, never blocked on.
        for name, plant in (("symlink", lambda p: os.symlink(self.secret, p)),
                            ("fifo", os.mkfifo), ("directory", os.mkdir)):
            with self.subTest(name=name):
                copy = self.crafted_copy(name)
                shard = sorted(f for f in os.listdir(copy) if f.endswith(".safetensors"))[0]
                os.remove(os.path.join(copy, shard))
                plant(os.path.join(copy, shard))
                self.assert_export_refused(copy, name, "not a regular file")

    def assert_export_refused(self, copy, name, fault):
        c = self.cluster
        out = os.path.join(c.dir, f"hf-{name}")
        start = time.monotonic()
        result = c.loomctl("export", "--format=hf", copy, out, check=False, timeout=30)
        self.assertLess(time.monotonic() - start, 30)
        self.assertNotEqual(result.returncode, 0)
        self.assertLess(result.returncode, 128, "killed by a signal")
        self.assertIn(fault, result.stderr)
        self.assert_no_secret(result.stderr)
        self.assertNotIn(str(len(SECRET)) + " bytes", result.stderr)
        self.assertFalse(os.path.exists(out))

    def test_a_data_path_that_is_a_directory_fails_the_job_with_exit_3(self):
        """Issue 29: the trainer aborted on it (a crash, so the node was
        cordoned); the job cannot run, which is exit 3, and no node is blamed."""
        c = self.cluster
        os.makedirs(os.path.join(c.data_root, "data", "a-directory"), exist_ok=True)
        spec = tiny_job(name="dir-data", steps=2, ranks=1, eval_interval=0, max_restarts=2).replace(
            "data/train.txt, val_path: data/val.txt, format: text",
            "data/a-directory, format: bin")
        job = c.submit(spec, "dir-data")
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED", timeout=180)
        status = c.status(job)
        self.assertIn("not a regular file", status)
        self.assertIn("restarts 0", status)
        node = [n for n in self.jobs.ListNodes(job_pb2.ListNodesRequest(), timeout=10).nodes
                if n.node_id == "node-a"][0]
        self.assertTrue(node.live)
        self.assertFalse(node.cordoned, node.cordon_reason)

    def test_resume_from_a_crafted_checkpoint_fails_the_job_with_exit_3(self):
        c = self.cluster
        source = c.submit(tiny_job(name="to-corrupt", steps=2, ranks=1, eval_interval=0,
                                   ckpt_interval=1), "to-corrupt")
        c.expect_end(source, ("FAILED", "SUCCEEDED"), "SUCCEEDED", timeout=180)
        ckpt = c.checkpoint_dir(source)
        for step in os.listdir(ckpt):
            path = os.path.join(ckpt, step, "metadata.json")
            with open(path) as f:
                meta = json.load(f)
            meta["model"]["num_heads"] = 0
            with open(path, "w") as f:
                json.dump(meta, f)
        spec = tiny_job(name="resumer", steps=4, ranks=1, max_restarts=2).replace(
            "keep: 2", f"keep: 2, resume_from: {source}")
        job = c.submit(spec, "resumer")
        c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED", timeout=180)
        status = c.status(job)
        self.assertIn("model.num_heads=0", status)
        self.assertIn("restarts 0", status)


@unittest.skipUnless(os.geteuid() == 0, "switching users needs an agent running as root")
class RanksAsAnUnprivilegedUser(unittest.TestCase):
    """--run_as_user: a root-only file inside a data root stays unreadable, and
    the job's own directories belong to the rank user."""

    def test_root_only_file_is_not_read_and_the_job_owns_its_checkpoints(self):
        import pwd
        nobody = pwd.getpwnam("nobody")
        c = Cluster("adversarial-run-as")
        try:
            os.chmod(c.dir, 0o711)  # the rank user may pass through, not list
            c.start_coordinator()
            c.start_agent("node-a", "cpu:1", extra=["--run_as_user=nobody"])
            private = os.path.join(c.data_root, "data", "root-only.bin")
            with open(private, "wb") as f:
                f.write(SECRET + b"\0" * 1020)
            os.chmod(private, 0o600)
            spec = tiny_job(name="peek", steps=2, ranks=1, eval_interval=0).replace(
                "data/train.txt, val_path: data/val.txt, format: text",
                "data/root-only.bin, format: bin")
            job = c.submit(spec, "peek")
            c.expect_end(job, ("FAILED", "SUCCEEDED"), "FAILED")
            status = c.status(job)
            self.assertIn("no permission", status)
            self.assertNotIn("SECRET", status)
            self.assertNotIn(SECRET_INT, status)

            ok = c.submit(tiny_job(name="honest", steps=2, ranks=1, eval_interval=0,
                                   ckpt_interval=1), "honest")
            self.assertEqual(c.wait_state(ok, ("FAILED", "SUCCEEDED"), timeout=180), "SUCCEEDED",
                             c.status(ok))
            self.assertEqual(os.stat(c.checkpoint_dir(ok)).st_uid, nobody.pw_uid)
            rank_dir = os.path.join(c.dir, "node-a", "jobs", ok, "attempt_1", "rank_0")
            self.assertEqual(os.stat(rank_dir).st_uid, nobody.pw_uid)
        finally:
            c.stop()


if __name__ == "__main__":
    unittest.main()
