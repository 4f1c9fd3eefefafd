"""A 2-rank job submitted, watched and completed through the real binaries;
the coordinator killed and restarted on the same state directory."""

import json
import os
import signal
import subprocess
import time
import unittest

from loom_cluster import BIN, Cluster, tiny_job, wait_until, pid_alive


class JobEndToEnd(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)

    def test_two_rank_job_trains_and_succeeds(self):
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", "cpu:2")
        job = c.submit(tiny_job(steps=6, ranks=2, eval_interval=3))
        watch = subprocess.run(c.loomctl_argv("watch", job, "--format=jsonl"), capture_output=True, text=True, timeout=180)
        self.assertEqual(watch.returncode, 0, watch.stdout + watch.stderr + c.log("coordinator.log"))
        steps = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
        self.assertEqual([s["step"] for s in steps], list(range(1, 7)))
        for s in steps:
            for key in ("step", "loss", "tokens", "step_seconds", "tokens_per_second", "mfu", "attempt"):
                self.assertIn(key, s)
            self.assertEqual(s["attempt"], 1)
            self.assertGreater(s["loss"], 0)
            self.assertGreater(s["tokens_per_second"], 0)
            self.assertGreater(s["mfu"], 0)
        # 4 sequences of 32 tokens per step, over both ranks.
        self.assertEqual(steps[-1]["tokens"], 6 * 4 * 32)
        self.assertIn("val_loss", steps[2])
        self.assertNotIn("val_loss", steps[0])
        self.assertEqual(c.state(job), "SUCCEEDED")
        # A watch that joins after the job ended still gets every step, in order.
        late = subprocess.run(c.loomctl_argv("watch", job, "--format=jsonl"), capture_output=True, text=True, timeout=60)
        self.assertEqual(late.returncode, 0, late.stderr)
        self.assertEqual([json.loads(line) for line in late.stdout.splitlines() if line.strip()], steps)
        status = c.status(job)
        self.assertIn("TP(0)-CP(0)-PP(0)-DP(1)-Rank(1)", status)
        # The per-rank and per-job metrics are exported.
        self.assertEqual(c.metric_value("loom_job_step", job=job), 6)
        self.assertIsNotNone(c.metric_value("loom_rank_loss", job=job, rank="1"))
        self.assertEqual(c.metric_value("loom_jobs", state="SUCCEEDED"), 1)
        self.assertGreater(c.metric_value("loom_rpcs_total", method="/loom.v1.JobService/SubmitJob",
                                          code="OK"), 0)
        # Every rank exited; the agent's log per rank exists.
        self.assertEqual(c.trainer_pids(), [])
        for rank in (0, 1):
            log = os.path.join(c.dir, "node-a", "jobs", job, "attempt_1", f"rank_{rank}", "log.txt")
            self.assertTrue(os.path.exists(log), log)
        # The final checkpoint exports to the Hugging Face layout.
        out = os.path.join(c.dir, "hf")
        c.loomctl("export", "--format=hf", os.path.join(c.dir, "checkpoints"), out)
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(config["num_key_value_heads"], 1)
        self.assertEqual(config["hidden_size"], 32)
        self.assertGreater(os.path.getsize(os.path.join(out, "model.safetensors")), 4 * 256 * 32)

    def test_unreachable_coordinator_is_named_with_how_to_start_one(self):
        c = self.cluster
        result = c.loomctl("list", check=False, timeout=30)
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"cannot reach the coordinator at {c.address}", result.stderr)
        self.assertIn("loom-coordinator --listen=", result.stderr)

    def test_bad_flags_exit_2_with_one_usage_line(self):
        for binary in ("loom-coordinator", "loom-worker", "loom-trainer", "loomctl"):
            with self.subTest(binary=binary):
                result = subprocess.run([os.path.join(BIN, binary), "--no_such_flag=1"],
                                        capture_output=True, text=True, timeout=30)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("no_such_flag", result.stderr)

    def test_watch_exit_status_is_nonzero_for_a_failed_job(self):
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", "cpu:1")
        spec = tiny_job(ranks=1, steps=3).replace("data/train.txt", "data/missing.txt")
        job = c.submit(spec)
        watch = c.loomctl("watch", job, check=False, timeout=120)
        self.assertEqual(watch.returncode, 1, watch.stdout + watch.stderr)
        self.assertEqual(c.state(job), "FAILED")
        # The reason names the missing file, and a broken job is not retried.
        self.assertIn("missing.txt", c.status(job))
        self.assertIn("restarts 0", c.status(job))

    def test_coordinator_sigkill_restart_keeps_jobs(self):
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", "cpu:1")
        done = c.submit(tiny_job(name="done", ranks=1, steps=2, eval_interval=0).replace(
            "val_path: data/val.txt, ", ""), "done")
        self.assertEqual(c.loomctl("watch", done, timeout=120).returncode, 0)
        # Two more that cannot be placed (4 ranks on a 1-device node) stay PENDING.
        waiting = [c.submit(tiny_job(name=f"wait{i}", ranks=4), f"wait{i}") for i in range(2)]
        cancelled = c.submit(tiny_job(name="cancelled", ranks=4), "cancelled")
        c.loomctl("cancel", cancelled)
        before = c.loomctl("list").stdout

        c.kill(c.coordinator, signal.SIGKILL)
        c.start_coordinator()
        after = c.loomctl("list").stdout
        self.assertEqual(before, after)
        self.assertEqual(c.state(done), "SUCCEEDED")
        self.assertEqual([c.state(j) for j in waiting], ["PENDING", "PENDING"])
        self.assertEqual(c.state(cancelled), "CANCELLED")
        # History survived too, and new ids continue after the old ones.
        self.assertIn("all ranks finished", c.status(done))
        new = c.submit(tiny_job(name="after", ranks=4), "after")
        self.assertGreater(new, cancelled)

    def test_agent_sigkill_kills_its_ranks_and_node_is_lost(self):
        c = self.cluster
        c.start_coordinator()
        agent = c.start_agent("node-a", "cpu:2")
        job = c.submit(tiny_job(steps=100000, ranks=2, eval_interval=0, ckpt_interval=0).replace(
            "val_path: data/val.txt, ", ""))
        wait_until(lambda: c.state(job) == "RUNNING", 60, "the job to run")
        ranks = c.trainer_pids()
        self.assertEqual(len(ranks), 2)
        self.assertEqual(c.metric_value("loom_nodes_live"), 1)
        c.kill(agent, signal.SIGKILL)
        wait_until(lambda: not any(pid_alive(p) for p in ranks), 5, "the ranks to die with their agent")
        wait_until(lambda: c.metric_value("loom_nodes_live") == 0, 10, "the node to be marked lost")
        wait_until(lambda: c.state(job) == "FAILED", 10, "the job to fail (no restarts allowed)")
        self.assertIn("node-a was lost", c.status(job))


if __name__ == "__main__":
    unittest.main()
