// Tensor and pipeline parallelism on "device" memory: every rank (a thread)
// trains on its own DeviceEmulationOps (addresses that fault on any host
// access) and talks through DeviceEmulationCommunicators (which, like NCCL,
// accept only that memory). Against the same layout on CpuOps with plain Gloo
// groups, every loss, gradient norm, validation loss and final parameter must
// be bit-identical, so a finished run proves the TP collectives, the
// vocabulary-parallel loss, the replicated gradients, the pipeline's boundary
// tensors, its optimizer, clipping, evaluation and checkpoint staging all go
// through the backend.
//
//  - TP on the model (tp2 with and without SP, tp4 whose kv heads are
//    replicated, with SP): the model's forward/backward, ClipByTpGlobalNorm
//    and GatherGlobal on backend memory, AdamW through ops.
//  - PP through the training loop: pp2 1F1B, pp2 interleaved (2 virtual
//    stages), tp2 x pp2 with SP, dp2 x pp2; a checkpoint written at the end
//    is byte-identical to the CPU run's.
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "tests/engine_device/device_emulation_communicator.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/clip_gradients.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

using testing::DeviceEmulationOps;
using Group = std::vector<std::unique_ptr<comm::Communicator>>;
using TensorMap = std::map<std::string, std::vector<float>>;

constexpr double kGradClip = 0.5;  // below the early norms: clipping fires

// The backends of `n` ranks: CpuOps, or DeviceEmulationOps over CpuOps.
std::vector<std::shared_ptr<kernels::Ops>> MakeBackends(int n, bool device) {
  std::vector<std::shared_ptr<kernels::Ops>> ops;
  for (int r = 0; r < n; ++r) {
    if (device) {
      ops.push_back(std::make_shared<DeviceEmulationOps>(kernels::cpu::MakeCpuOps()));
    } else {
      ops.push_back(std::shared_ptr<kernels::Ops>(kernels::cpu::MakeCpuOps()));
    }
  }
  return ops;
}

// A Gloo group over the given ranks' backends; on the device each member is
// wrapped so it accepts only its rank's backend memory.
Group MakeGroup(comm::InProcessStore& store, const std::vector<kernels::Ops*>& members,
                bool device, const std::string& name) {
  Group group = comm::testing::MakeGroup(store, static_cast<int>(members.size()),
                                         absl::Seconds(60), name);
  if (!device) return group;
  std::vector<const DeviceEmulationOps*> ops;
  for (kernels::Ops* o : members) ops.push_back(static_cast<DeviceEmulationOps*>(o));
  return testing::WrapGroup(std::move(group), ops);
}

// Each tensor assembled over the TP group into `out` (under its name); on
// the emulated device the views must be backend memory.
void GatherTensors(kernels::Ops& ops, const std::vector<TensorView>& views, comm::Communicator* tp,
                   bool device, TensorMap* out) {
  for (const TensorView& v : views) {
    if (device) {
      ASSERT_TRUE(DeviceEmulationOps::IsDevicePointer(v.data)) << v.name;
    }
    std::vector<float> global;
    ASSERT_TRUE(GatherGlobal(ops, v, tp, &global).ok());
    (*out)[v.name] = std::move(global);
  }
}

void ExpectSameBits(const TensorMap& got, const TensorMap& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, values] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": " << name;
    ASSERT_EQ(it->second.size(), values.size()) << what << ": " << name;
    EXPECT_EQ(0, std::memcmp(it->second.data(), values.data(), values.size() * sizeof(float)))
        << what << ": " << name << " differs";
  }
}

// ---- TP on the model ----------------------------------------------------------------

struct TpCase {
  const char* name;
  int tp;
  bool sp;
};

struct TpRun {
  std::vector<float> losses, norms, evals;  // per step
  TensorMap params;                           // global tensors
  int64_t forwarded = 0;                      // collectives through the device wrapper
};

spec::ModelSpec TpModel() {
  spec::ModelSpec m;
  m.vocab_size = 250;  // uneven vocabulary shards over 4 ranks
  m.hidden_size = 32;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;  // tp4: each kv head replicated on two ranks
  m.ffn_hidden_size = 64;
  m.max_seq_len = 16;
  return m;
}

// Every rank trains the same micro-batches: 4 steps of the same 2 micro-
// batches [2, 8] (a few ignored targets), clipping, AdamW, evaluation of a
// third batch after each step.
std::vector<TpRun> RunTp(const TpCase& c, bool device) {
  const spec::ModelSpec config = TpModel();
  spec::TrainSpec train;
  train.lr = 3e-3;
  train.warmup_steps = 1;
  train.steps = 4;
  train.weight_decay = 0.1;
  constexpr int64_t kBatch = 2, kSeq = 8, kMicro = 2;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<std::vector<int32_t>> inputs, targets;
  // Two micro-batches trained every step (so the loss falls), then the
  // evaluation batch.
  for (int64_t i = 0; i < kMicro + 1; ++i) {
    std::vector<int32_t> in(kBatch * kSeq), tg(kBatch * kSeq);
    for (int64_t j = 0; j < kBatch * kSeq; ++j) {
      in[j] = token(rng);
      tg[j] = j % 7 == 3 ? -1 : token(rng);
    }
    inputs.push_back(std::move(in));
    targets.push_back(std::move(tg));
  }

  std::vector<std::shared_ptr<kernels::Ops>> ops = MakeBackends(c.tp, device);
  std::vector<kernels::Ops*> members;
  for (auto& o : ops) members.push_back(o.get());
  comm::InProcessStore store;
  Group group = MakeGroup(store, members, device, "tp");
  std::vector<TpRun> runs(c.tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.tp; ++r) {
    threads.emplace_back([&, r] {
      comm::Communicator* tp = group[r].get();
      kernels::Ops& o = *ops[r];
      LlamaModel model(config, spec::Recompute::kNone, ops[r], TensorParallelOptions{tp, c.sp});
      model.InitParameters(5);
      AdamW adamw(model.Parameters(), model.Gradients(), train, o);
      TpRun& run = runs[r];
      for (int64_t step = 1; step <= train.steps; ++step) {
        model.ZeroGradients();
        double loss = 0.0;
        for (int64_t m = 0; m < kMicro; ++m) {
          const size_t i = static_cast<size_t>(m);
          loss += model.ForwardBackward(inputs[i].data(), targets[i].data(), kBatch, kSeq,
                                        1.0f / kMicro);
          ASSERT_TRUE(model.status().ok()) << model.status();
        }
        absl::StatusOr<double> norm =
            ClipGradients(o, GradientPieces(model.Gradients()), {tp}, kGradClip);
        ASSERT_TRUE(norm.ok()) << norm.status();
        adamw.Step(LearningRate(train, step));
        run.losses.push_back(static_cast<float>(loss / kMicro));
        run.norms.push_back(static_cast<float>(*norm));
        run.evals.push_back(model.ForwardLoss(inputs.back().data(), targets.back().data(),
                                              kBatch, kSeq));
        ASSERT_TRUE(model.status().ok()) << model.status();
      }
      GatherTensors(o, model.Parameters(), tp, device, &run.params);
      if (device) {
        run.forwarded = static_cast<testing::DeviceEmulationCommunicator*>(tp)->forwarded();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

class TpDeviceTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpDeviceTest, ModelTrainsBitIdenticalToCpu) {
  const TpCase& c = GetParam();
  const std::vector<TpRun> want = RunTp(c, /*device=*/false);
  const std::vector<TpRun> got = RunTp(c, /*device=*/true);
  ASSERT_EQ(got.size(), want.size());
  int clipped = 0;
  for (float n : want[0].norms) clipped += n > kGradClip ? 1 : 0;
  EXPECT_GT(clipped, 0);
  for (size_t r = 0; r < want.size(); ++r) {
    SCOPED_TRACE("tp rank " + std::to_string(r));
    EXPECT_EQ(got[r].losses, want[r].losses);
    EXPECT_EQ(got[r].norms, want[r].norms);
    EXPECT_EQ(got[r].evals, want[r].evals);
    ExpectSameBits(got[r].params, want[r].params, "parameters");
    // Every rank sees the same loss and the same assembled model.
    EXPECT_EQ(want[r].losses, want[0].losses);
    ExpectSameBits(want[r].params, want[0].params, "parameters vs rank 0");
    EXPECT_GT(got[r].forwarded, 0);
  }
  EXPECT_LT(want[0].losses.back(), want[0].losses.front());
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpDeviceTest,
                         ::testing::Values(TpCase{"tp2", 2, false}, TpCase{"tp2_sp", 2, true},
                                           TpCase{"tp4_sp_replicated_kv", 4, true}),
                         [](const ::testing::TestParamInfo<TpCase>& info) {
                           return std::string(info.param.name);
                         });

// ---- TP, DP x TP and PP (x TP, x DP) through the training loop -----------------------------

struct PpCase {
  const char* name;
  int pp, dp, tp;
  spec::Schedule schedule;
  int virtual_stages;
  bool sp;
};

struct PpRun {
  std::vector<StepProgress> steps;
  TensorMap params;  // this rank's stage's tensors, global
  std::string checkpoint;  // stage 0 / dp 0 / tp 0: the committed step directory
  int64_t forwarded = 0;
};

class PpDeviceTest : public ::testing::TestWithParam<PpCase> {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }

  spec::JobSpec Job() const {
    const PpCase& c = GetParam();
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.model.num_layers = 4;
    job.train.steps = 6;
    job.train.eval_interval = 3;
    job.train.grad_clip = kGradClip;
    job.parallelism.pp = c.pp;
    job.parallelism.dp = c.dp;
    job.parallelism.tp = c.tp;
    job.parallelism.schedule = c.schedule;
    job.parallelism.virtual_stages = c.virtual_stages;
    job.parallelism.sequence_parallel = c.sp;
    return job;
  }

  // Ranks of the pp x dp x tp mesh (tp fastest) as threads; checkpoints
  // under `root`.
  std::vector<PpRun> Run(bool device, const std::string& root) {
    const PpCase& c = GetParam();
    const spec::JobSpec job = Job();
    const int n = c.pp * c.dp * c.tp;
    auto rank_of = [&c](int p, int d, int t) { return (p * c.dp + d) * c.tp + t; };
    std::vector<std::shared_ptr<kernels::Ops>> ops = MakeBackends(n, device);
    comm::InProcessStore store;
    // Keyed by the coordinates the group does not span.
    std::map<std::pair<int, int>, Group> tp_groups, dp_groups, pp_groups;
    auto group_of = [&](auto rank_in_group, int size, const char* name) {
      std::vector<kernels::Ops*> members;
      for (int i = 0; i < size; ++i) members.push_back(ops[rank_in_group(i)].get());
      return MakeGroup(store, members, device, name);
    };
    for (int p = 0; p < c.pp; ++p) {
      for (int d = 0; d < c.dp; ++d) {
        if (c.tp > 1) tp_groups[{p, d}] = group_of([&](int i) { return rank_of(p, d, i); }, c.tp, "tp");
      }
      for (int t = 0; t < c.tp; ++t) {
        if (c.dp > 1) dp_groups[{p, t}] = group_of([&](int i) { return rank_of(p, i, t); }, c.dp, "dp");
      }
    }
    for (int d = 0; d < c.dp; ++d) {
      for (int t = 0; t < c.tp; ++t) {
        if (c.pp > 1) pp_groups[{d, t}] = group_of([&](int i) { return rank_of(i, d, t); }, c.pp, "pp");
      }
    }
    std::vector<PpRun> runs(n);
    std::vector<std::thread> threads;
    for (int p = 0; p < c.pp; ++p) {
      for (int d = 0; d < c.dp; ++d) {
        for (int t = 0; t < c.tp; ++t) {
          threads.emplace_back([&, p, d, t] {
            comm::Communicator* tp = c.tp > 1 ? tp_groups[{p, d}][t].get() : nullptr;
            comm::Communicator* dp = c.dp > 1 ? dp_groups[{p, t}][d].get() : nullptr;
            comm::Communicator* pp = c.pp > 1 ? pp_groups[{d, t}][p].get() : nullptr;
            const int rank = rank_of(p, d, t);
            kernels::Ops& o = *ops[rank];
            absl::StatusOr<std::unique_ptr<TrainingLoop>> loop =
                TrainingLoop::Create(job, d, c.dp, dp, tp, pp, ops[rank]);
            ASSERT_TRUE(loop.ok()) << loop.status();
            PpRun& run = runs[rank];
            while (!(*loop)->done()) {
              absl::StatusOr<StepProgress> s = (*loop)->TrainStep();
              ASSERT_TRUE(s.ok()) << s.status();
              run.steps.push_back(*s);
            }
            absl::StatusOr<std::string> saved = (*loop)->SaveCheckpoint(root);
            ASSERT_TRUE(saved.ok()) << saved.status();
            run.checkpoint = *saved;
            PipelineStage* stage = (*loop)->pipeline_stage();
            ASSERT_EQ(stage != nullptr, c.pp > 1);
            EXPECT_EQ(&(*loop)->ops(), &o);
            if (stage != nullptr) {
              EXPECT_EQ(&stage->ops(), &o);
            }
            GatherTensors(o, stage != nullptr ? stage->Parameters() : (*loop)->model().Parameters(),
                          tp, device, &run.params);
            if (device) {
              for (const TensorView& m : (*loop)->optimizer().States()) {
                ASSERT_TRUE(DeviceEmulationOps::IsDevicePointer(m.data)) << m.name;
              }
              for (comm::Communicator* group : {tp, dp, pp}) {
                if (group == nullptr) continue;
                run.forwarded += static_cast<testing::DeviceEmulationCommunicator*>(group)->forwarded();
              }
            }
          });
        }
      }
    }
    for (std::thread& th : threads) th.join();
    return runs;
  }

  testing::ScratchDir dir_;
};

TEST_P(PpDeviceTest, TrainsBitIdenticalToCpu) {
  const std::string cpu_root = dir_ / "cpu_ckpt", dev_root = dir_ / "dev_ckpt";
  const std::vector<PpRun> want = Run(/*device=*/false, cpu_root);
  const std::vector<PpRun> got = Run(/*device=*/true, dev_root);
  ASSERT_EQ(got.size(), want.size());
  int clipped = 0, evaluated = 0;
  for (const StepProgress& s : want[0].steps) {
    clipped += s.grad_norm > kGradClip ? 1 : 0;
    evaluated += s.val_loss.has_value() ? 1 : 0;
  }
  EXPECT_GT(clipped, 0);
  EXPECT_EQ(evaluated, 2);
  for (size_t r = 0; r < want.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(got[r].steps.size(), want[r].steps.size());
    for (size_t i = 0; i < want[r].steps.size(); ++i) {
      const StepProgress& a = got[r].steps[i];
      const StepProgress& b = want[r].steps[i];
      EXPECT_EQ(a.loss, b.loss) << "step " << b.step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << b.step;
      EXPECT_EQ(a.val_loss, b.val_loss) << "step " << b.step;
      // Every rank reports the same numbers (the loss and norm are reduced).
      EXPECT_EQ(b.loss, want[0].steps[i].loss);
      EXPECT_EQ(b.grad_norm, want[0].steps[i].grad_norm);
    }
    ExpectSameBits(got[r].params, want[r].params, "parameters");
    EXPECT_GT(got[r].forwarded, 0);
  }
  EXPECT_LT(want[0].steps.back().loss, want[0].steps.front().loss);
  // The checkpoint the device wrote is the CPU's, byte for byte.
  ASSERT_FALSE(want[0].checkpoint.empty());
  ASSERT_FALSE(got[0].checkpoint.empty());
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(want[0].checkpoint)) {
    const std::string name = entry.path().filename().string();
    const std::string a = testing::ReadFile(got[0].checkpoint + "/" + name);
    ASSERT_FALSE(a.empty()) << name;
    EXPECT_TRUE(a == testing::ReadFile(entry.path().string())) << name << " differs";
    ++files;
  }
  EXPECT_GE(files, 2);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PpDeviceTest,
    ::testing::Values(PpCase{"tp2", 1, 1, 2, spec::Schedule::k1F1B, 1, false},
                      PpCase{"tp2_sp", 1, 1, 2, spec::Schedule::k1F1B, 1, true},
                      PpCase{"dp2_tp2", 1, 2, 2, spec::Schedule::k1F1B, 1, false},
                      PpCase{"pp2_1f1b", 2, 1, 1, spec::Schedule::k1F1B, 1, false},
                      PpCase{"pp2_interleaved", 2, 1, 1, spec::Schedule::kInterleaved, 2, false},
                      PpCase{"tp2_pp2_sp", 2, 1, 2, spec::Schedule::k1F1B, 1, true},
                      PpCase{"dp2_pp2", 2, 2, 1, spec::Schedule::k1F1B, 1, false}),
    [](const ::testing::TestParamInfo<PpCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace loom::engine
