// loom-trainer --standalone as a process: 20 steps straight against 10 steps,
// process exit, and 10 more resumed from the checkpoint (bit-identical
// losses); path resolution; and the exit codes and messages of its errors.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/test_util.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result RunTrainer(const ScratchDir& dir, const std::string& args) {
  const std::string out = dir / "stdout", err = dir / "stderr";
  const std::string cmd =
      std::string(LOOM_TRAINER_PATH) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

std::vector<nlohmann::json> Lines(const std::string& jsonl) {
  std::vector<nlohmann::json> out;
  std::istringstream in(jsonl);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

constexpr char kJob[] = R"(name: standalone-test
model: {vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 64, max_seq_len: 32}
train: {steps: 20, global_batch_size: 8, micro_batch_size: 2, seq_len: 16, lr: 3.0e-3,
        warmup_steps: 3, eval_interval: 5, eval_windows: 4, seed: 11}
data: {train_path: data/train.txt, val_path: data/val.txt, format: FORMAT}
checkpoint: {dir: ckpt, interval: 10, keep: 2}
)";

std::string Job(const std::string& format = "text") {
  std::string job = kJob;
  job.replace(job.find("FORMAT"), 6, format);
  return job;
}

class StandaloneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_ / "spec/data");
    WriteFile(dir_ / "spec/data/train.txt", testing::SyntheticText(20000, 3));
    WriteFile(dir_ / "spec/data/val.txt", testing::SyntheticText(2000, 4));
    WriteFile(dir_ / "spec/job.yaml", Job());
  }
  Result Train(const std::string& work, const std::string& extra = "") {
    return RunTrainer(dir_, "--standalone " + (dir_ / "spec/job.yaml") + " --work_dir=" +
                                (dir_ / work) + " --progress_format=jsonl " + extra);
  }
  ScratchDir dir_;
};

TEST_F(StandaloneTest, StoppedAndResumedRunMatchesStraightRunBitForBit) {
  const Result straight = Train("a");
  ASSERT_EQ(straight.code, 0) << straight.err;
  const auto all = Lines(straight.out);
  ASSERT_EQ(all.size(), 20u);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "a/ckpt/step_00000020/metadata.json"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "a/ckpt/step_00000010/metadata.json"));

  const Result first = Train("b", "--stop_after_step=10");
  ASSERT_EQ(first.code, 0) << first.err;
  const Result second = Train("b");
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_THAT(second.err, HasSubstr("resumed from " + (dir_ / "b/ckpt/step_00000010")));
  auto resumed = Lines(first.out);
  for (auto& l : Lines(second.out)) resumed.push_back(l);
  ASSERT_EQ(resumed.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(resumed[i]["step"], all[i]["step"]);
    // Doubles printed with round-trip precision: equal values, bit for bit.
    EXPECT_EQ(resumed[i]["loss"].get<double>(), all[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(resumed[i]["tokens"], all[i]["tokens"]);
    EXPECT_EQ(resumed[i].value("val_loss", -1.0), all[i].value("val_loss", -1.0));
  }
  ASSERT_TRUE(all[19].contains("val_loss"));
  EXPECT_LT(all[19]["loss"].get<double>(), all[0]["loss"].get<double>());

  // Finished: a rerun resumes at the end and trains nothing.
  const Result again = Train("b");
  EXPECT_EQ(again.code, 0);
  EXPECT_EQ(again.out, "");
}

TEST_F(StandaloneTest, TextProgressAndCheckpointNextToSpecWithoutWorkDir) {
  const Result r = RunTrainer(dir_, "--standalone " + (dir_ / "spec/job.yaml") + " --stop_after_step=2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 1/20 loss "));
  EXPECT_THAT(r.out, HasSubstr("step 2/20 loss "));
  EXPECT_THAT(r.err, HasSubstr("no checkpoint under " + (dir_ / "spec/ckpt")));
}

TEST_F(StandaloneTest, MissingDataFile) {
  std::filesystem::remove(dir_ / "spec/data/train.txt");
  const Result r = Train("w");
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr(dir_ / "spec/data/train.txt"));
  EXPECT_THAT(r.err, HasSubstr("cannot open"));
}

TEST_F(StandaloneTest, WrongMagic) {
  WriteFile(dir_ / "spec/job.yaml", Job("bin"));
  const Result r = Train("w");
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("token file " + (dir_ / "spec/data/train.txt") + ": wrong magic"));
}

TEST_F(StandaloneTest, InvalidSpecNamesTheField) {
  std::string job = Job();
  job.replace(job.find("num_heads: 4"), 12, "num_heads: 3");
  WriteFile(dir_ / "spec/job.yaml", job);
  const Result r = Train("w");
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("model.num_heads"));
  EXPECT_THAT(r.err, HasSubstr(dir_ / "spec/job.yaml"));
}

TEST_F(StandaloneTest, CorruptCheckpoints) {
  ASSERT_EQ(Train("c", "--stop_after_step=10").code, 0);
  const std::string shard = dir_ / "c/ckpt/step_00000010/optimizer-r00000.safetensors";
  std::string bytes = ReadFile(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  WriteFile(shard, bytes);
  // The only checkpoint is corrupt: refuse to start over it, naming the file.
  const Result refused = Train("c");
  EXPECT_EQ(refused.code, 3);
  EXPECT_THAT(refused.err, HasSubstr(shard + ": checksum mismatch"));
  EXPECT_EQ(refused.out, "");
}

TEST(StandaloneFlagsTest, BadFlagIsAOneLineUsageError) {
  ScratchDir dir;
  const Result r = RunTrainer(dir, "--standalone x.yaml --no_such_flag=1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown flag --no_such_flag"));
  EXPECT_THAT(r.err, HasSubstr("usage: loom-trainer --standalone JOB.yaml"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_EQ(RunTrainer(dir, "").code, 2);
}

}  // namespace
}  // namespace loom::engine
