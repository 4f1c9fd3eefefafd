"""[moe] A mixture-of-experts job (docs/moe.md) through the real binaries: two
CPU ranks data-parallel with ZeRO-1; its expert load reaches the coordinator's
metrics (loom_job_expert_tokens per expert, the imbalance), every assignment
of the last step counted once over both ranks; its checkpoint exports in
Mixtral's Hugging Face layout."""

import json
import os
import subprocess
import unittest

from loom_cluster import Cluster, tiny_job


def moe_job():
    spec = tiny_job(name="tiny-moe", steps=4, ranks=2, eval_interval=2)
    spec = spec.replace("tie_embeddings: false}",
                        "tie_embeddings: false,\n        moe: {num_experts: 4, top_k: 2, "
                        "expert_ffn_hidden_size: 16, aux_loss_coef: 0.01}}")
    return spec.replace("zero_stage: 0}", "zero_stage: 1}")


class MoeJob(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(self.id().split(".")[-1])
        self.addCleanup(self.cluster.stop)

    def test_moe_job_reports_expert_load_and_exports_mixtral(self):
        c = self.cluster
        c.start_coordinator()
        c.start_agent("node-a", "cpu:2")
        job = c.submit(moe_job())
        watch = subprocess.run(c.loomctl_argv("watch", job, "--format=jsonl"), capture_output=True,
                               text=True, timeout=180)
        self.assertEqual(watch.returncode, 0, watch.stdout + watch.stderr + c.log("coordinator.log"))
        steps = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
        self.assertEqual([s["step"] for s in steps], [1, 2, 3, 4])
        self.assertEqual(c.state(job), "SUCCEEDED")
        # Last step: 4 sequences x 32 tokens x top-2 x 2 MoE layers, both ranks together.
        load = [c.metric_value("loom_job_expert_tokens", job=job, expert=str(e)) for e in range(4)]
        self.assertNotIn(None, load, c.metrics())
        self.assertEqual(sum(load), 4 * 32 * 2 * 2)
        imbalance = c.metric_value("loom_job_moe_imbalance", job=job)
        self.assertGreaterEqual(imbalance, 1.0)
        self.assertLessEqual(imbalance, 2.0)  # top-2 of 4: at most every token on the same two
        self.assertGreater(c.metric_value("loom_job_moe_aux_loss", job=job), 0)
        self.assertEqual(c.metric_value("loom_job_moe_dropped_fraction", job=job), 0)
        out = os.path.join(c.dir, "hf")
        c.loomctl("export", "--format=hf", c.checkpoint_dir(job), out)
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(config["architectures"], ["MixtralForCausalLM"])
        self.assertEqual(config["num_local_experts"], 4)
        self.assertEqual(config["num_experts_per_tok"], 2)


if __name__ == "__main__":
    unittest.main()
