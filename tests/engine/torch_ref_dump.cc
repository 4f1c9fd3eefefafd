// Test tool for the PyTorch reference (torch_reference.py): trains a small
// model for a few steps, checkpoints and exports it to the Hugging Face
// layout, then dumps Loom's loss and every parameter gradient on one batch,
// and its validation loss, so the script can recompute them in plain torch.
//   engine_torch_ref_dump OUT_DIR [--tied | --moe=softmax | --moe=sigmoid | --moe=mixtral]
// Writes OUT_DIR/{train.txt,val.txt,ckpt/,hf/,dump.safetensors}.
// [moe] With --moe the model is a mixture of experts (docs/moe.md): the dump
// also holds every parameter by Loom name (param/...), the selection biases
// used by the checked pass (bias/...), each MoE layer's tokens per expert on
// it (load/L) and the biases after the update from those loads
// (bias_after/...), and the pass's aux loss; the softmax case has shared
// experts and a dense first layer (exported as Qwen2-MoE), the sigmoid case
// the bias and capacity drops (not exportable), the mixtral case neither
// (exported as Mixtral).
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "export/hf_export.h"
#include "tests/engine/test_util.h"
#include "worker/engine/checkpoint/safetensors.h"
#include "worker/engine/training_loop.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "engine_torch_ref_dump: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::engine;
  if (argc < 2) return Fail("usage: engine_torch_ref_dump OUT_DIR [--tied | --moe=softmax|sigmoid]");
  const std::string out = argv[1];
  const std::string flag = argc > 2 ? argv[2] : "";
  const bool tied = flag == "--tied";
  const bool moe = flag.rfind("--moe=", 0) == 0;
  const bool sigmoid = flag == "--moe=sigmoid";
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  testing::WriteFile(out + "/train.txt", testing::SyntheticText(30000, 5));
  testing::WriteFile(out + "/val.txt", testing::SyntheticText(4000, 6));

  loom::spec::JobSpec job = testing::TinyJob(out + "/train.txt", out + "/val.txt");
  job.model.hidden_size = 64;
  job.model.num_heads = 4;
  job.model.num_kv_heads = 2;
  job.model.ffn_hidden_size = 96;
  job.model.max_seq_len = 64;
  job.model.rope_theta = 10000;
  job.model.tie_embeddings = tied;
  job.train.seq_len = 32;
  job.train.global_batch_size = 4;
  job.train.micro_batch_size = 4;
  job.train.steps = 5;
  job.train.eval_windows = 6;
  job.train.warmup_steps = 1;
  if (moe) {
    loom::spec::MoeSpec& e = job.model.moe;
    e.num_experts = 4;
    e.top_k = 2;
    e.expert_ffn_hidden_size = 48;
    if (sigmoid) {
      e.router_score = loom::spec::RouterScoreKind::kSigmoid;
      e.aux_loss_coef = 0.02;
      e.bias_update_rate = 0.01;
      e.capacity_factor = 1.0;
    } else if (flag == "--moe=softmax") {
      e.num_shared_experts = 1;
      e.first_dense_layers = 1;
      e.aux_loss_coef = 0.01;
    } else {
      e.num_experts = 8;
      e.expert_ffn_hidden_size = 32;
    }
  }
  auto loop = TrainingLoop::Create(job);
  if (!loop.ok()) return Fail(std::string(loop.status().message()));
  // A few steps so the weights are no longer at their initialization.
  for (int i = 0; i < 3; ++i) {
    if (auto p = (*loop)->TrainStep(); !p.ok()) return Fail(std::string(p.status().message()));
  }
  if (auto s = (*loop)->SaveCheckpoint(out + "/ckpt"); !s.ok()) {
    return Fail(std::string(s.status().message()));
  }
  absl::Status exported = loom::hf_export::ExportHuggingFace(out + "/ckpt", out + "/hf");
  if (sigmoid) {  // [moe] no HF layout routes by sigmoid with a bias: refused, nothing written
    if (exported.ok() || std::filesystem::exists(out + "/hf")) {
      return Fail("export of a sigmoid router was not refused");
    }
  } else if (!exported.ok()) {
    return Fail(std::string(exported.message()));
  }

  Batch batch;
  (*loop)->FillTrainMicroBatch(4, 0, &batch);
  LlamaModel& model = (*loop)->model();
  // [moe] The biases the checked pass selects with, copied before the update.
  std::vector<std::vector<float>> biases;
  std::vector<TensorView> moe_dump;
  for (const TensorView& b : model.ExpertBiases()) {
    biases.emplace_back(b.data, b.data + b.numel());
    moe_dump.push_back({"bias/" + b.name, b.shape, biases.back().data()});
  }
  model.ZeroGradients();
  const float loss = model.ForwardBackward(batch.inputs.data(), batch.targets.data(), batch.batch,
                                           batch.seq, 1.0f);
  auto val = (*loop)->Evaluate();
  if (!val.ok()) return Fail(std::string(val.status().message()));

  const MoeStepStats stats = model.TakeMoeStats();
  std::vector<float> loads(stats.tokens_per_expert.begin(), stats.tokens_per_expert.end());
  if (moe) {
    model.UpdateExpertBias(stats.tokens_per_expert);
    const int64_t e_count = job.model.moe.num_experts;
    for (size_t l = 0; l * e_count < loads.size(); ++l) {
      moe_dump.push_back({"load/" + std::to_string(l), {e_count}, loads.data() + l * e_count});
    }
    for (const TensorView& b : model.ExpertBiases()) {
      moe_dump.push_back({"bias_after/" + b.name, b.shape, b.data});
    }
    for (TensorView p : model.Parameters()) {
      p.name = "param/" + p.name;
      moe_dump.push_back(p);
    }
  }
  std::vector<TensorView> dump = moe_dump;
  for (TensorView g : model.Gradients()) {
    g.name = "grad/" + g.name;
    dump.push_back(g);
  }
  std::vector<float> inputs(batch.inputs.begin(), batch.inputs.end());
  std::vector<float> targets(batch.targets.begin(), batch.targets.end());
  dump.push_back({"inputs", {batch.batch, batch.seq}, inputs.data()});
  dump.push_back({"targets", {batch.batch, batch.seq}, targets.data()});
  auto written = WriteSafetensors(
      out + "/dump.safetensors", dump,
      {{"loss", absl::StrFormat("%.9g", loss)},
       {"val_loss", absl::StrFormat("%.17g", *val)},
       {"seq_len", std::to_string(job.train.seq_len)},
       {"eval_windows", std::to_string(job.train.eval_windows)},
       {"aux_loss", absl::StrFormat("%.17g", stats.aux_loss)}});
  if (!written.ok()) return Fail(std::string(written.status().message()));
  std::printf("loss %.9g val_loss %.9g\n", loss, *val);
  return 0;
}
