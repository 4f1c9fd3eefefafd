"""`resources.device: gpu` jobs through the control plane on a machine
without a GPU. The agent is given an nvidia-smi on PATH that lists two H200s
(the only stand-in here: the real tool needs a driver), so everything up to
the CUDA runtime is real: the agent advertises the GPUs, the coordinator
places one rank per GPU, the agent launches each rank with its device, the
trainer picks the CUDA backend, fails to open the device, and exits 3 (job
broken) with a message naming resources.device; the job fails without
restarts."""

import os
import stat
import unittest

from loom_cluster import Cluster, wait_until

GPU_JOB = """
name: gpu-one
model: {vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 128, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}
train: {steps: 5, global_batch_size: 4, micro_batch_size: 2, seq_len: 32, lr: 3.0e-3,
        warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0, seed: 3,
        precision: bf16, eval_interval: 0, eval_windows: 4}
data: {train_path: data/train.txt, format: text}
parallelism: {dp: 1, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0}
resources: {device: gpu, gpu: h200, nodes: 1, gpus_per_node: 1}
fault_tolerance: {max_restarts: 2}
"""


class GpuJob(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster("gpu")
        cls.cluster.start_coordinator()
        fake_bin = os.path.join(cls.cluster.dir, "fake-bin")
        os.makedirs(fake_bin)
        smi = os.path.join(fake_bin, "nvidia-smi")
        with open(smi, "w") as f:
            f.write("#!/bin/sh\necho 'NVIDIA H200, 143771'\necho 'NVIDIA H200, 143771'\n")
        os.chmod(smi, os.stat(smi).st_mode | stat.S_IXUSR)
        env = dict(os.environ, PATH=f"{fake_bin}:{os.environ.get('PATH', '')}")
        cls.cluster.start_agent("gpu-node", "gpu", env=env)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_node_advertises_the_gpu(self):
        c = self.cluster
        wait_until(lambda: "gpu-node" in c.loomctl("nodes").stdout, 20, "the GPU node to register")
        nodes = c.loomctl("nodes").stdout
        self.assertIn("2xgpu", nodes)
        self.assertIn("989.5 TF", nodes, "the H200's dense bf16 peak from common/hardware")

    def run_to_failure(self, spec, name):
        """Submits, waits for the end; the job must fail without spending a
        restart (exit 3: the job itself cannot run here). Returns its status."""
        c = self.cluster
        job = c.submit(spec, name)
        wait_until(lambda: c.state(job) in ("FAILED", "SUCCEEDED", "CANCELLED"), 120,
                   "the GPU job to end")
        status = c.status(job)
        self.assertEqual(c.state(job), "FAILED", status)
        self.assertIn("restarts 0", status)
        return status

    def test_gpu_job_reaches_the_cuda_backend_and_fails_cleanly(self):
        status = self.run_to_failure(GPU_JOB, "gpu-one")
        self.assertIn("exited with code 3", status)
        # The failure quotes the rank's log: placed on the GPU, the CUDA backend refused.
        self.assertIn("on node gpu-node device 0", status)
        self.assertRegex(status, "resources.device=gpu: (cannot open CUDA device 0|"
                                 "this loom-trainer was built without CUDA)")

    def test_data_parallel_gpu_job_is_placed_one_rank_per_gpu(self):
        spec = (GPU_JOB.replace("name: gpu-one", "name: gpu-two")
                .replace("gpus_per_node: 1", "gpus_per_node: 2").replace("dp: 1", "dp: 2"))
        status = self.run_to_failure(spec, "gpu-two")
        self.assertRegex(status, r"rank 0 .* node gpu-node device 0")
        self.assertRegex(status, r"rank 1 .* node gpu-node device 1")

if __name__ == "__main__":
    unittest.main()
