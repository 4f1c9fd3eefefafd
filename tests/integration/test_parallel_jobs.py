"""Parallel layouts as jobs through the coordinator and the node agent: every
layout's per-step losses equal one process's within 1e-5 relative. The layout
matrix also compares the parameters the jobs end with (their last checkpoint,
exported to Hugging Face) with one process's."""

import json
import math
import os
import shutil
import struct
import subprocess
import unittest

from loom_cluster import Cluster

SPEC = """
name: {name}
model: {{vocab_size: 256, hidden_size: 64, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 128, max_seq_len: 64, rope_theta: 10000, tie_embeddings: {tied}{moe}}}
train: {{steps: 10, global_batch_size: {batch}, micro_batch_size: 2, seq_len: 32,
        lr: 3.0e-3, warmup_steps: 2, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 7, precision: {precision}, eval_interval: 0, eval_windows: 4}}
data: {{train_path: data/train.txt, format: text}}
parallelism: {{dp: {dp}, tp: {tp}, pp: {pp}, cp: {cp}, ep: {ep}, zero_stage: {zero}, sequence_parallel: {sp},
              schedule: {schedule}, virtual_stages: {v}}}
resources: {{device: cpu, ranks: {ranks}}}
checkpoint: {{dir: "{ckpt}", interval: {ckpt_interval}, keep: 2{resume}}}
fault_tolerance: {{max_restarts: 0}}
"""

# A small mixture of experts (docs/expert_parallel.md): 4 routed experts, top-2,
# one shared expert, the first layer dense, the aux loss and the selection bias on.
MOE = (", moe: {num_experts: 4, top_k: 2, expert_ffn_hidden_size: 32, num_shared_experts: 1,"
       " first_dense_layers: 1, aux_loss_coef: 0.01, bias_update_rate: 0.01}")


def read_safetensors(path):
    """{tensor name: tuple of floats} of an F32 safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_size])
    data = blob[8 + header_size:]
    tensors = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        assert entry["dtype"] == "F32", key
        begin, end = entry["data_offsets"]
        tensors[key] = struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])
    return tensors


class ParallelJobs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.jobs = {}  # test name -> job id
        cls.grad_norms = {}  # test name -> {step: gradient norm}
        cls.cluster = Cluster("parallel")
        cls.cluster.start_coordinator()
        cls.cluster.start_agent("node-a", "cpu:8")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def losses(self, name, dp=1, tp=1, pp=1, cp=1, zero=0, sp=False, schedule="1f1b", v=1,
               precision="fp32", steps=10, ckpt=None, tied=False, batch=8, ckpt_interval=5,
               resume_from=None, ep=1, moe="", eps=None):
        c = self.cluster
        spec = SPEC.format(name=name, dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, sp=str(sp).lower(),
                           schedule=schedule, v=v, precision=precision, ranks=dp * tp * pp * cp * ep,
                           ep=ep, moe=moe,
                           ckpt=ckpt or f"ckpt-{name}", tied=str(tied).lower(), batch=batch,
                           ckpt_interval=ckpt_interval,
                           resume=f", resume_from: {resume_from}" if resume_from else ""
                           ).replace("steps: 10,", f"steps: {steps},").replace("seed: 7,", f"seed: 7, eps: {eps}," if eps else "seed: 7,")
        job = c.submit(spec, name)
        self.last_job = job
        self.jobs[name] = job
        watch = subprocess.run(c.loomctl_argv("watch", job, "--format=jsonl"), capture_output=True, text=True, timeout=300)
        self.assertEqual(watch.returncode, 0, watch.stderr + c.status(job))
        steps = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
        self.grad_norms[name] = {s["step"]: s["grad_norm"] for s in steps if "grad_norm" in s}
        return {s["step"]: s["loss"] for s in steps}

    def assert_same_run(self, name, got, reference, steps):
        """Job `name` logged every step 1..steps, each loss within 1e-5
        relative of the reference run's."""
        self.assertEqual(sorted(got), list(range(1, steps + 1)))
        for step, b in reference.items():
            a = got[step]
            self.assertLessEqual(abs(a - b), 1e-5 * abs(b), f"{name} step {step}: {a} vs {b}")

    def assert_same_parameters(self, name, params, reference_params):
        """The same tensors as the reference's, each within 1e-5 in its L2 norm
        (AdamW divides by sqrt(v), so single weights with tiny gradients
        amplify float reordering; see tests/model_tp/tp_training_test.cc)."""
        self.assertEqual(sorted(params), sorted(reference_params))
        for tensor, want in reference_params.items():
            have = params[tensor]
            diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(have, want)))
            norm = math.sqrt(sum(y * y for y in want))
            self.assertLessEqual(diff, 1e-5 * norm, f"{name} {tensor}")

    def test_layouts_match_one_process(self):
        reference = self.losses("single")
        layouts = [("dp2", dict(dp=2)), ("dp2-zero1", dict(dp=2, zero=1)),
                   ("dp2-zero2", dict(dp=2, zero=2)), ("dp2-zero3", dict(dp=2, zero=3)),
                   ("tp2", dict(tp=2)), ("tp2-sp", dict(tp=2, sp=True)),
                   ("dp2-tp2", dict(dp=2, tp=2)), ("pp2-1f1b", dict(pp=2)),
                   ("pp2-interleaved-v2", dict(pp=2, schedule="interleaved", v=2)),
                   ("pp4-afab", dict(pp=4, schedule="afab")), ("tp2-pp2", dict(tp=2, pp=2)),
                   ("dp2-tp2-pp2", dict(dp=2, tp=2, pp=2))]
        for name, layout in layouts:
            with self.subTest(layout=name):
                self.assert_same_run(name, self.losses(name, **layout), reference, 10)

    def rank_log_lines(self, job, text):
        """Lines containing `text` in the rank logs of `job` (the agent's work dir)."""
        lines = []
        for root, _, files in os.walk(self.cluster.dir):
            if job in root and "log.txt" in files:
                with open(os.path.join(root, "log.txt"), errors="replace") as f:
                    lines += [line.strip() for line in f if text in line]
        return lines

    def checkpoint_tensors(self, name):
        """The model tensors of job `name`'s newest checkpoint, each global
        tensor assembled from its shards as index.json places them (whatever
        layout wrote them): {global name: tuple of floats}."""
        checkpoint = self.cluster.checkpoint_dir(self.jobs[name])
        newest = os.path.join(checkpoint, sorted(d for d in os.listdir(checkpoint) if d.startswith("step_"))[-1])
        with open(os.path.join(newest, "index.json")) as f:
            index = json.load(f)
        files, tensors = {}, {}
        for tensor, entry in index["tensors"].items():
            if entry.get("group") != "model":
                continue
            shape = entry["shape"]
            whole = [0.0] * math.prod(shape)
            strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
            for shard in entry["shards"]:
                if shard["file"] not in files:
                    files[shard["file"]] = read_safetensors(os.path.join(newest, shard["file"]))
                values = files[shard["file"]][shard["key"]]
                offset, piece = shard["offset"], shard["shape"]
                row = piece[-1] if piece else 1
                for r in range(len(values) // row if row else 0):
                    # The index of the row's first element in the global tensor.
                    at, rest = 0, r
                    for d in range(len(piece) - 2, -1, -1):
                        at += (offset[d] + rest % piece[d]) * strides[d]
                        rest //= piece[d]
                    at += offset[-1] if piece else 0
                    whole[at:at + row] = values[r * row:(r + 1) * row]
            tensors[tensor] = tuple(whole)
        return tensors

    # Expert parallelism (docs/expert_parallel.md): each EP rank holds its
    # experts and reads its own data; losses within 1e-5 of one process every
    # step, and the parameters of the last checkpoint (every expert and dense
    # tensor, by its global name) within 1e-5 in each tensor's L2 norm.
    def test_expert_parallel_layouts_match_one_process(self):
        steps = 4
        # AdamW's eps at 1e-6, not 1e-8: at step 1 its update is lr*g/(|g|+eps),
        # so a weight whose first gradient nearly cancels (|g| ~ 1e-9, the
        # gradients' RMS ~ 2e-4) turns the layouts' float reordering of that sum
        # into lr*dg/eps (dg 4e-11 gave 5.4e-6, one weight moving a tensor past
        # 1e-5 of its norm). The layouts differ in summation order by design
        # (an expert's rows come from every EP rank, dense sums cross dp x ep).
        common = dict(moe=MOE, batch=16, steps=steps, ckpt_interval=steps, eps=1.0e-6)
        reference = self.losses("moe-single", **common)
        reference_params = self.checkpoint_tensors("moe-single")
        self.assertIn("model.layers.1.mlp.experts.3.down_proj.weight", reference_params)
        for name, layout in [("ep2", dict(ep=2)), ("ep4", dict(ep=4)),
                             ("ep2-dp2-zero1", dict(ep=2, dp=2, zero=1)), ("ep2-tp2", dict(ep=2, tp=2)),
                             ("ep2-pp2", dict(ep=2, pp=2)), ("ep2-dp2-zero3", dict(ep=2, dp=2, zero=3))]:
            with self.subTest(layout=name):
                got = self.losses(name, **common, **layout)
                self.assert_same_run(name, got, reference, steps)
                # Adam divides each update by the gradient's own size, so the
                # parameters hardly show a gradient off by a constant factor (a
                # dense sum counted twice over EP); the gradient norm does.
                self.assert_same_run(name, self.grad_norms[name], self.grad_norms["moe-single"], steps)
                self.assert_same_parameters(name, self.checkpoint_tensors(name), reference_params)
                # The ranks really split the experts (each says which it holds).
                ep, others = layout["ep"], layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)
                held = self.rank_log_lines(self.jobs[name], "holds experts")
                want_held = sorted(f"ep rank {r} of {ep} holds experts [{r * 4 // ep}, {(r + 1) * 4 // ep})"
                                   for r in range(ep) for _ in range(others))
                self.assertEqual(sorted(line.split("expert parallel: ", 1)[1] for line in held), want_held)
        # Not yet: the MoE layer does not split the stream for sequence
        # parallelism, and CP does not combine with EP; submission says so.
        for name, layout, rule in [("ep2-tp2-sp", dict(ep=2, tp=2, sp=True),
                                    "parallelism.sequence_parallel=true with model.moe"),
                                   ("ep2-cp2", dict(ep=2, cp=2),
                                    "parallelism.cp=2 with parallelism.ep=2 is not supported")]:
            with self.subTest(layout=name):
                tp, pp, cp = layout.get("tp", 1), layout.get("pp", 1), layout.get("cp", 1)
                spec = SPEC.format(name=name, dp=1, tp=tp, pp=pp, cp=cp,
                                   zero=0, sp=str(layout.get("sp", False)).lower(), schedule="1f1b",
                                   v=1, precision="fp32",
                                   ranks=tp * pp * cp * 2, ep=2, moe=MOE, ckpt=f"ckpt-{name}", tied="false",
                                   batch=16, ckpt_interval=4, resume="")
                refused = self.cluster.loomctl("submit", self.cluster.write_spec(name, spec), check=False)
                self.assertNotEqual(refused.returncode, 0, refused.stdout)
                self.assertIn(rule, refused.stderr)

    def final_parameters(self, name):
        """The parameters of job `name`'s newest checkpoint, exported to Hugging
        Face: {tensor name: list of floats}."""
        out = os.path.join(self.cluster.dir, f"hf-{name}")
        checkpoint = self.cluster.checkpoint_dir(self.jobs[name])
        self.cluster.loomctl("export", "--format=hf", checkpoint, out)
        return read_safetensors(os.path.join(out, "model.safetensors"))

    # Layouts that compose the axes, context parallelism included (8 CPU ranks
    # at most, tied embeddings throughout): per-step losses within 1e-5 relative of one process, and the
    # parameters after the last step within 1e-5 in each tensor's L2 norm
    # (AdamW divides by sqrt(v), so single weights with tiny gradients amplify
    # float reordering; see tests/model_tp/tp_training_test.cc).
    def test_layout_matrix_matches_one_process(self):
        steps = 4
        common = dict(tied=True, batch=16, steps=steps, ckpt_interval=steps)
        reference = self.losses("matrix-single", **common)
        reference_params = self.final_parameters("matrix-single")
        layouts = [
            ("tp2-pp2-dp2-zero1", dict(tp=2, pp=2, dp=2, zero=1)),
            ("tp2-dp4-zero3", dict(tp=2, dp=4, zero=3)),
            ("pp2-dp2-zero2", dict(pp=2, dp=2, zero=2)),
            ("pp2-dp2-interleaved-zero1", dict(pp=2, dp=2, zero=1, schedule="interleaved", v=2)),
            ("tp2-sp-dp2-zero2", dict(tp=2, dp=2, zero=2, sp=True)),
            ("tp2-sp-dp4-zero2", dict(tp=2, dp=4, zero=2, sp=True)),
            ("tp2-dp2-zero3-sp", dict(tp=2, dp=2, zero=3, sp=True)),
            ("tp2-pp2-dp2-zero2", dict(tp=2, pp=2, dp=2, zero=2)),
            ("pp4-dp2-afab-zero1", dict(pp=4, dp=2, zero=1, schedule="afab")),
            ("tp4-dp2-zero1", dict(tp=4, dp=2, zero=1)),
            ("dp8-zero3", dict(dp=8, zero=3)),
            ("pp2-tp4", dict(pp=2, tp=4)),
            ("pp2-dp2-zero3", dict(pp=2, dp=2, zero=3)),
            ("tp2-pp2-dp2-zero3", dict(tp=2, pp=2, dp=2, zero=3)),
            # Context parallelism (ring attention, zigzag split of seq_len 32).
            ("cp2", dict(cp=2)),
            ("cp4", dict(cp=4)),
            ("cp2-tp2-sp", dict(cp=2, tp=2, sp=True)),
            ("cp2-pp2-1f1b", dict(cp=2, pp=2)),
            ("cp2-dp2-zero2", dict(cp=2, dp=2, zero=2)),
            ("cp2-tp2-dp2", dict(cp=2, tp=2, dp=2)),
        ]
        for name, layout in layouts:
            with self.subTest(layout=name):
                got = self.losses(name, **common, **layout)
                self.assert_same_run(name, got, reference, steps)
                self.assert_same_parameters(name, self.final_parameters(name), reference_params)

    def test_checkpoint_from_dp2_tp2_resumes_at_tp2_pp2(self):
        reference = self.losses("uninterrupted")
        first = self.losses("first", dp=2, tp=2)
        first_job = self.last_job
        self.assertEqual(sorted(first), list(range(1, 11)))
        # Keep only the step-5 checkpoint, as if the first job had stopped there.
        shutil.rmtree(os.path.join(self.cluster.checkpoint_dir(first_job), "step_00000010"))
        # A new job has a checkpoint directory of its own; it starts from the
        # first job's (same owner) through checkpoint.resume_from.
        second = self.losses("second-half", tp=2, pp=2, resume_from=first_job)
        self.assertEqual(sorted(second), list(range(6, 11)), "resumed after the step-5 checkpoint")
        for step, loss in second.items():
            self.assertLessEqual(abs(loss - reference[step]), 1e-5 * abs(reference[step]), step)

    def test_fp8_emulation_runs_as_a_job(self):
        # The recipe's numerics against fp32 are checked in tests/fp8_emulation;
        # here the coordinator admits precision: fp8 and the ranks run it.
        fp8 = self.losses("fp8", precision="fp8")
        self.assertEqual(sorted(fp8), list(range(1, 11)))
        self.assertTrue(all(math.isfinite(loss) and loss > 0 for loss in fp8.values()), fp8)

    def test_auto_picks_tp_or_pp_when_one_rank_cannot_hold_the_model(self):
        # The activation-heavy model of tests/coordinator/examples_test.cc
        # (AutoLayoutTest): under a rank memory limit of AUTO_MEMORY_MB no
        # data-parallel layout of 2 ranks fits (whatever its ZeRO stage), a
        # tensor- or pipeline-parallel one does. `auto` must pick that, and the
        # job must train.
        c = self.cluster
        job = c.submit(AUTO_SPEC.format(memory_mb=AUTO_MEMORY_MB), "auto-split")
        watch = subprocess.run(c.loomctl_argv("watch", job, "--format=jsonl"),
                               capture_output=True, text=True, timeout=300)
        self.assertEqual(watch.returncode, 0, watch.stderr + c.status(job))
        steps = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
        losses = {s["step"]: s["loss"] for s in steps}
        self.assertEqual(sorted(losses), [1, 2, 3])
        self.assertTrue(all(math.isfinite(x) and x > 0 for x in losses.values()), losses)
        layout = [line for line in c.status(job).splitlines() if line.startswith("layout:")]
        self.assertEqual(len(layout), 1, c.status(job))
        fields = dict(f.split("=", 1) for f in layout[0].split() if "=" in f)
        self.assertTrue(fields["tp"] != "1" or fields["pp"] != "1", layout[0])
        self.assertEqual(int(fields["dp"]) * int(fields["tp"]) * int(fields["pp"]), 2, layout[0])


# Memory per rank: the planner predicts less than this for the best tp2 or pp2
# layout and more for every dp2 layout (tests/coordinator/examples_test.cc
# prints both and fails when the model stops separating them). In-place
# recovery's snapshots (on by default, six copies of a rank's state since
# 2026-12-03: three of its own, three of its ward's) count in a CPU rank's
# memory: 114.6 MiB for tp/pp, 125.9 for dp only, so 115 (examples_test's
# own limit).
AUTO_MEMORY_MB = 115
AUTO_SPEC = """
name: auto-split
model: {{vocab_size: 256, hidden_size: 128, num_layers: 4, num_heads: 4, num_kv_heads: 4,
        ffn_hidden_size: 384, max_seq_len: 1024}}
train: {{steps: 3, global_batch_size: 2, micro_batch_size: 1, seq_len: 1024, lr: 3.0e-3,
        warmup_steps: 1, seed: 7, eval_interval: 0}}
data: {{train_path: data/train.txt, format: text}}
parallelism: auto
resources: {{device: cpu, ranks: 2, memory_mb: {memory_mb}}}
checkpoint: {{dir: ckpt-auto, interval: 0, keep: 1}}
fault_tolerance: {{max_restarts: 0}}
"""


if __name__ == "__main__":
    unittest.main()
