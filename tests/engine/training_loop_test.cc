// The training loop on a tiny model: determinism, bit-identical resume,
// gradient accumulation and data parallelism equivalences, evaluation by its
// documented definition, checkpoint fallback, and its errors.
#include <filesystem>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "tests/engine/train_steps.h"
#include "tests/engine/thread_communicator.h"
#include "worker/engine/data/token_dataset.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/training_loop.h"
#include "worker/engine/training_run.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::WriteFile;

class TrainingLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }
  spec::JobSpec Job() { return testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt"); }

  static std::unique_ptr<TrainingLoop> Make(const spec::JobSpec& job) {
    auto loop = TrainingLoop::Create(job);
    EXPECT_TRUE(loop.ok()) << loop.status();
    return loop.ok() ? std::move(*loop) : nullptr;
  }

  ScratchDir dir_;
};

TEST_F(TrainingLoopTest, ProgressRecordsAndLearning) {
  spec::JobSpec job = Job();
  auto loop = Make(job);
  ASSERT_NE(loop, nullptr);
  const auto steps = testing::TrainUntil(*loop, 20);
  ASSERT_EQ(steps.size(), 20u);
  for (const StepProgress& p : steps) {
    EXPECT_EQ(p.total_steps, 20);
    EXPECT_EQ(p.tokens, p.step * 8 * 16);
    EXPECT_DOUBLE_EQ(p.lr, LearningRate(job.train, p.step));
    EXPECT_GT(p.grad_norm, 0);
    EXPECT_GT(p.step_seconds, 0);
    EXPECT_GT(p.peak_rss_bytes, 0);
    EXPECT_EQ(p.val_loss.has_value(), p.step % 5 == 0) << p.step;
  }
  // Starts near ln(256) and learns.
  EXPECT_NEAR(steps[0].loss, std::log(256.0), 0.3);
  EXPECT_LT(steps.back().loss, steps[0].loss - 1.0);
  EXPECT_TRUE(loop->done());
  EXPECT_FALSE(loop->TrainStep().ok());
}

TEST_F(TrainingLoopTest, FlopsPerToken) {
  auto loop = Make(Job());
  ASSERT_NE(loop, nullptr);
  // Tiny model by hand: per layer q,o 32x32, k,v 16x32, gate,up,down 64x32,
  // two norms of 32; final norm 32; lm_head 256x32 (the embedding is a lookup).
  const double layer = 2 * 32 * 32 + 2 * 16 * 32 + 3 * 64 * 32 + 2 * 32;
  const double n = 2 * layer + 32 + 256 * 32;
  EXPECT_DOUBLE_EQ(loop->flops_per_token(), 6 * n + 12.0 * 2 * 32 * 16);
  EXPECT_EQ(loop->model().NumParameters(), static_cast<int64_t>(n) + 256 * 32);
}

TEST_F(TrainingLoopTest, SameSeedSameLossesBitForBit) {
  auto a = Make(Job());
  auto b = Make(Job());
  const auto la = testing::TrainUntil(*a, 8), lb = testing::TrainUntil(*b, 8);
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(la[i].loss, lb[i].loss);
    EXPECT_EQ(la[i].grad_norm, lb[i].grad_norm);
  }
  spec::JobSpec other = Job();
  other.train.seed = 8;
  auto c = Make(other);
  EXPECT_NE(testing::TrainUntil(*c, 1)[0].loss, la[0].loss);
}

TEST_F(TrainingLoopTest, ResumeIsBitIdentical) {
  const std::string root = dir_ / "ckpt";
  auto straight = Make(Job());
  const auto all = testing::TrainUntil(*straight, 20);
  {
    auto first = Make(Job());
    testing::TrainUntil(*first, 10);
    auto saved = first->SaveCheckpoint(root);
    ASSERT_TRUE(saved.ok()) << saved.status();
  }
  auto second = Make(Job());
  auto loaded = second->RestoreNewest(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 10);
  EXPECT_EQ(second->step(), 10);
  const auto rest = testing::TrainUntil(*second, 20);
  ASSERT_EQ(rest.size(), 10u);
  for (size_t i = 0; i < rest.size(); ++i) {
    const StepProgress& want = all[10 + i];
    EXPECT_EQ(rest[i].step, want.step);
    EXPECT_EQ(rest[i].loss, want.loss) << "step " << want.step;
    EXPECT_EQ(rest[i].grad_norm, want.grad_norm) << "step " << want.step;
    EXPECT_EQ(rest[i].tokens, want.tokens);
    EXPECT_EQ(rest[i].val_loss, want.val_loss) << "step " << want.step;
  }
  const auto pa = straight->model().Parameters(), pb = second->model().Parameters();
  for (size_t t = 0; t < pa.size(); ++t) {
    ASSERT_EQ(0, std::memcmp(pa[t].data, pb[t].data, pa[t].numel() * 4)) << pa[t].name;
  }
}

TEST_F(TrainingLoopTest, AccumulationMatchesOneBigMicroBatch) {
  spec::JobSpec small = Job(), big = Job();
  big.train.micro_batch_size = 8;
  auto a = Make(small), b = Make(big);
  const auto la = testing::TrainUntil(*a, 3), lb = testing::TrainUntil(*b, 3);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(la[i].loss, lb[i].loss, 1e-5 * lb[i].loss);
    EXPECT_NEAR(la[i].grad_norm, lb[i].grad_norm, 1e-4 * lb[i].grad_norm);
  }
}

TEST_F(TrainingLoopTest, DataParallelMatchesSingleRank) {
  const spec::JobSpec job = Job();
  auto single = Make(job);
  const auto want = testing::TrainUntil(*single, 4);
  auto group = std::make_shared<testing::ThreadGroup>(2);
  std::vector<std::vector<StepProgress>> got(2);
  std::vector<std::vector<float>> params(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      testing::ThreadCommunicator comm(group, rank);
      auto loop = TrainingLoop::Create(job, rank, 2, &comm);
      ASSERT_TRUE(loop.ok()) << loop.status();
      got[rank] = testing::TrainUntil(**loop, 4);
      auto saved = (*loop)->SaveCheckpoint(dir_ / "dp_ckpt");  // rank 0 writes, all wait
      ASSERT_TRUE(saved.ok()) << saved.status();
      EXPECT_EQ(saved->empty(), rank != 0);
      for (const TensorView& p : (*loop)->model().Parameters()) {
        params[rank].insert(params[rank].end(), p.data, p.data + p.numel());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(got[0].size(), 4u);
  ASSERT_EQ(got[1].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got[0][i].loss, got[1][i].loss);  // the all-reduced loss is the same everywhere
    EXPECT_NEAR(got[0][i].loss, want[i].loss, 1e-5 * want[i].loss) << "step " << i + 1;
    EXPECT_NEAR(got[0][i].grad_norm, want[i].grad_norm, 1e-4 * want[i].grad_norm);
  }
  EXPECT_EQ(params[0], params[1]);  // replicas stay identical
  EXPECT_TRUE(std::filesystem::exists(dir_ / "dp_ckpt/step_00000004/metadata.json"));
}

TEST_F(TrainingLoopTest, EvaluateFollowsTheDocumentedWindows) {
  auto loop = Make(Job());
  ASSERT_NE(loop, nullptr);
  testing::TrainUntil(*loop, 2);
  auto val = loop->Evaluate();
  ASSERT_TRUE(val.ok()) << val.status();
  // Recomputed from the file: window i = bytes [16 i, 16 i + 16], one at a time.
  const std::string text = testing::ReadFile(dir_ / "val.txt");
  double sum = 0;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> in(16), tg(16);
    for (int t = 0; t < 16; ++t) {
      in[t] = static_cast<unsigned char>(text[16 * i + t]);
      tg[t] = static_cast<unsigned char>(text[16 * i + t + 1]);
    }
    sum += loop->model().ForwardLoss(in.data(), tg.data(), 1, 16);
  }
  EXPECT_NEAR(*val, sum / 4, 1e-5 * (sum / 4));
}

TEST_F(TrainingLoopTest, NewestCheckpointCorruptFallsBack) {
  const std::string root = dir_ / "ckpt";
  {
    auto loop = Make(Job());
    RunOptions run;
    run.checkpoint_root = root;
    spec::JobSpec job = Job();
    ASSERT_TRUE(RunTraining(*loop, run).ok());  // no interval: only the final step
  }
  {
    spec::JobSpec job = Job();
    job.checkpoint.interval = 5;
    job.checkpoint.keep = 3;
    auto loop = Make(job);
    RunOptions run;
    run.checkpoint_root = dir_ / "ckpt2";
    ASSERT_TRUE(RunTraining(*loop, run).ok());
  }
  EXPECT_TRUE(std::filesystem::exists(root + "/step_00000020"));
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "ckpt2")) {
    kept.push_back(e.path().filename().string());
  }
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"step_00000010", "step_00000015", "step_00000020"}));

  const std::string shard = dir_ / "ckpt2/step_00000020/model-r00000.safetensors";
  std::string bytes = testing::ReadFile(shard);
  WriteFile(shard, bytes.substr(0, bytes.size() / 2));
  auto loop = Make(Job());
  std::vector<std::string> events;
  RunOptions run;
  run.checkpoint_root = dir_ / "ckpt2";
  run.stop_after_step = 16;
  run.on_event = [&](const std::string& e) { events.push_back(e); };
  std::vector<int64_t> resumed;  // once, when the load is over, before any step
  run.on_resumed = [&](int64_t step) { resumed.push_back(step); };
  ASSERT_TRUE(RunTraining(*loop, run).ok());
  EXPECT_EQ(resumed, std::vector<int64_t>{15});
  EXPECT_EQ(loop->step(), 16);
  ASSERT_GE(events.size(), 2u);
  EXPECT_THAT(events[0], HasSubstr("step_00000020/model-r00000.safetensors: size mismatch"));
  EXPECT_THAT(events[1], HasSubstr("resumed from"));
  EXPECT_THAT(events[1], HasSubstr("at step 15"));
}

TEST_F(TrainingLoopTest, CreateErrorsNameTheCause) {
  spec::JobSpec job = Job();
  job.data.train_path = dir_ / "missing.txt";
  auto missing = TrainingLoop::Create(job);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.txt"));

  job = Job();
  job.data.format = spec::DataFormat::kBin;  // a text file is not a token file
  auto magic = TrainingLoop::Create(job);
  EXPECT_THAT(magic.status().message(), HasSubstr("train.txt: wrong magic"));

  job = Job();
  job.train.global_batch_size = 7;
  EXPECT_THAT(TrainingLoop::Create(job).status().message(),
              HasSubstr("train.global_batch_size=7 must be divisible by parallelism.dp=1 x train.micro_batch_size"));
  job = Job();
  job.train.seq_len = 64;
  EXPECT_THAT(TrainingLoop::Create(job).status().message(), HasSubstr("model.max_seq_len=32"));
  job = Job();
  job.train.eval_windows = 1000;
  EXPECT_THAT(TrainingLoop::Create(job).status().message(), HasSubstr("val.txt"));

  job = Job();
  auto loop = Make(job);
  std::filesystem::create_directories(dir_ / "bad/step_00000005");
  WriteFile(dir_ / "bad/step_00000005/metadata.json", "not json");
  auto restored = loop->RestoreNewest(dir_ / "bad");
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(restored.status().message(), HasSubstr("step_00000005/metadata.json"));
  EXPECT_EQ(loop->step(), 0);
}

}  // namespace
}  // namespace loom::engine
