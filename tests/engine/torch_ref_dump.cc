// Test tool for the PyTorch reference (torch_reference.py): trains a small
// model for a few steps, checkpoints and exports it to the Hugging Face
// layout, then dumps Loom's loss and every parameter gradient on one batch,
// and its validation loss, so the script can recompute them in plain torch.
//   engine_torch_ref_dump OUT_DIR [--tied]
// Writes OUT_DIR/{train.txt,val.txt,ckpt/,hf/,dump.safetensors}.
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "tests/engine/test_util.h"
#include "worker/engine/checkpoint/safetensors.h"
#include "worker/engine/export/hf_export.h"
#include "worker/engine/training_loop.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "engine_torch_ref_dump: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::engine;
  if (argc < 2) return Fail("usage: engine_torch_ref_dump OUT_DIR [--tied]");
  const std::string out = argv[1];
  const bool tied = argc > 2 && std::string(argv[2]) == "--tied";
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
  auto loop = TrainingLoop::Create(job);
  if (!loop.ok()) return Fail(std::string(loop.status().message()));
  // A few steps so the weights are no longer at their initialization.
  for (int i = 0; i < 3; ++i) {
    if (auto p = (*loop)->TrainStep(); !p.ok()) return Fail(std::string(p.status().message()));
  }
  if (auto s = (*loop)->SaveCheckpoint(out + "/ckpt"); !s.ok()) {
    return Fail(std::string(s.status().message()));
  }
  if (auto s = ExportHuggingFace(out + "/ckpt", out + "/hf"); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  Batch batch;
  (*loop)->FillTrainMicroBatch(4, 0, &batch);
  LlamaModel& model = (*loop)->model();
  model.ZeroGradients();
  const float loss = model.ForwardBackward(batch.inputs.data(), batch.targets.data(), batch.batch,
                                           batch.seq, 1.0f);
  auto val = (*loop)->Evaluate();
  if (!val.ok()) return Fail(std::string(val.status().message()));

  std::vector<TensorView> dump;
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
       {"eval_windows", std::to_string(job.train.eval_windows)}});
  if (!written.ok()) return Fail(std::string(written.status().message()));
  std::printf("loss %.9g val_loss %.9g\n", loss, *val);
  return 0;
}
