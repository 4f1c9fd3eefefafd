// Checkpoint commit, keep, loading and the refusal/fallback policy, on plain
// tensors (no model needed).
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/one_writer_checkpoint.h"
#include "tests/engine/test_util.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/checkpoint/crc32.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::CommitCheckpoint;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

// A stand-in "model": two tensors whose values encode the step.
struct State {
  std::vector<float> w = std::vector<float>(12);
  std::vector<float> n = std::vector<float>(4);
  std::vector<float> m = std::vector<float>(12);
  spec::ModelSpec model;
  void Fill(float base) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = base + static_cast<float>(i);
    for (size_t i = 0; i < n.size(); ++i) n[i] = -base - static_cast<float>(i);
    for (size_t i = 0; i < m.size(); ++i) m[i] = base * 0.5f;
  }
  std::vector<TensorView> Params() { return {{"w", {3, 4}, w.data()}, {"n", {4}, n.data()}}; }
  std::vector<TensorView> All() {
    auto v = Params();
    v.push_back({"optimizer.exp_avg.w", {3, 4}, m.data()});
    return v;
  }
  CheckpointContent Content(int64_t step) {
    CheckpointContent c;
    c.step = step;
    c.model = model;
    c.files = {{"model-tp00-pp00.safetensors", "model", Params()},
               {"optimizer-tp00-pp00-dp00.safetensors", "optimizer", {All()[2]}}};
    c.state = {{"tokens", step * 100}};
    return c;
  }
};

void Save(const std::string& root, State& s, int64_t step, int64_t keep) {
  s.Fill(static_cast<float>(step));
  auto dir = CommitCheckpoint(root, s.Content(step), keep);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root + "/" + StepDirName(step));
}

std::vector<std::string> Entries(const std::string& root) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointTest, CommitLayoutAndIndex) {
  ScratchDir dir;
  State s;
  Save(dir.path(), s, 10, 2);
  EXPECT_EQ(Entries(dir.path()), std::vector<std::string>{"step_00000010"});
  const std::string step_dir = dir / "step_00000010";
  EXPECT_EQ(Entries(step_dir),
            (std::vector<std::string>{"index.json", "metadata.json", "model-tp00-pp00.safetensors",
                                      "optimizer-tp00-pp00-dp00.safetensors"}));
  auto index = nlohmann::json::parse(ReadFile(step_dir + "/index.json"));
  EXPECT_EQ(index["tensors"]["w"]["shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(index["tensors"]["w"]["dtype"], "F32");
  EXPECT_EQ(index["tensors"]["w"]["shards"][0]["file"], "model-tp00-pp00.safetensors");
  EXPECT_EQ(index["tensors"]["optimizer.exp_avg.w"]["group"], "optimizer");
  auto meta = nlohmann::json::parse(ReadFile(step_dir + "/metadata.json"));
  EXPECT_EQ(meta["step"], 10);
  EXPECT_EQ(meta["state"]["tokens"], 1000);
  const std::string shard = ReadFile(step_dir + "/model-tp00-pp00.safetensors");
  EXPECT_EQ(meta["files"]["model-tp00-pp00.safetensors"]["bytes"], shard.size());
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08x", Crc32(0, shard.data(), shard.size()));
  EXPECT_EQ(meta["files"]["model-tp00-pp00.safetensors"]["crc32"], crc);
}

TEST(CheckpointTest, KeepsNewestAndLoadsNewest) {
  ScratchDir dir;
  State s;
  for (int64_t step : {5, 10, 15, 20}) Save(dir.path(), s, step, 2);
  EXPECT_EQ(Entries(dir.path()), (std::vector<std::string>{"step_00000015", "step_00000020"}));
  State t;
  auto loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 20);
  EXPECT_TRUE(loaded->refused.empty());
  EXPECT_EQ(loaded->state["tokens"], 2000);
  EXPECT_EQ(t.w[3], 23.0f);
  EXPECT_EQ(t.n[1], -21.0f);
  EXPECT_EQ(t.m[0], 10.0f);
}

// Version 1 steps (the same index format) still load; a version this build
// does not know is refused naming it. A rectangle of a tensor is assembled
// from its shards.
TEST(CheckpointTest, VersionsAndRectangles) {
  ScratchDir dir;
  State s;
  Save(dir.path(), s, 10, 0);
  const std::string meta_path = dir.path() + "/step_00000010/metadata.json";
  nlohmann::json meta = nlohmann::json::parse(ReadFile(meta_path));
  EXPECT_EQ(meta["version"], kCheckpointVersion);
  meta["version"] = 1;
  WriteFile(meta_path, meta.dump());
  State t;
  auto loaded = LoadCheckpointStep(dir.path() + "/step_00000010", t.model, t.All());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(t.w[3], 13.0f);

  std::vector<float> rect(4);  // w[1:3, 1:3]
  loaded = LoadCheckpointStep(dir.path() + "/step_00000010", t.model,
                              std::vector<CheckpointRect>{{"w", {3, 4}, {1, 1}, {2, 2}, rect.data()}});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(rect, (std::vector<float>{15, 16, 19, 20}));

  meta["version"] = kCheckpointVersion + 1;
  WriteFile(meta_path, meta.dump());
  loaded = LoadCheckpointStep(dir.path() + "/step_00000010", t.model, t.All());
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(),
              HasSubstr(absl::StrCat("version ", kCheckpointVersion + 1, " cannot be read")));
}

TEST(CheckpointTest, RewritingAStepReplacesIt) {
  ScratchDir dir;
  State s;
  Save(dir.path(), s, 10, 0);
  s.Fill(99);
  ASSERT_TRUE(CommitCheckpoint(dir.path(), s.Content(10), 0).ok());
  EXPECT_EQ(Entries(dir.path()), std::vector<std::string>{"step_00000010"});
  State t;
  ASSERT_TRUE(LoadNewestCheckpoint(dir.path(), t.model, t.All()).ok());
  EXPECT_EQ(t.w[0], 99.0f);
}

TEST(CheckpointTest, NothingToLoad) {
  ScratchDir dir;
  State t;
  auto loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  auto missing = LoadNewestCheckpoint(dir / "absent", t.model, t.All());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// Each way of breaking the newest step: refused naming the file and the
// fault, and the previous step loads instead.
struct Damage {
  const char* name;
  std::function<void(const std::string& step_dir)> apply;
  const char* file;
  const char* fault;
};

TEST(CheckpointTest, DamagedNewestFallsBackToPrevious) {
  const std::string shard = "model-tp00-pp00.safetensors";
  const Damage damages[] = {
      {"truncated shard",
       [&](const std::string& d) {
         const std::string b = ReadFile(d + "/" + shard);
         WriteFile(d + "/" + shard, b.substr(0, b.size() - 10));
       },
       "model-tp00-pp00.safetensors", "size mismatch"},
      {"flipped data byte",
       [&](const std::string& d) {
         std::string b = ReadFile(d + "/" + shard);
         b[b.size() - 2] ^= 0x40;
         WriteFile(d + "/" + shard, b);
       },
       "model-tp00-pp00.safetensors", "checksum mismatch"},
      {"corrupt header with a matching checksum",
       [&](const std::string& d) {
         std::string b = ReadFile(d + "/" + shard);
         b[8] = '#';
         WriteFile(d + "/" + shard, b);
         auto meta = nlohmann::json::parse(ReadFile(d + "/metadata.json"));
         char crc[9];
         std::snprintf(crc, sizeof(crc), "%08x", Crc32(0, b.data(), b.size()));
         meta["files"][shard]["crc32"] = crc;
         WriteFile(d + "/metadata.json", meta.dump());
       },
       "model-tp00-pp00.safetensors", "corrupt header"},
      {"missing metadata",
       [&](const std::string& d) { fs::remove(d + "/metadata.json"); }, "metadata.json",
       "missing"},
      {"garbage metadata",
       [&](const std::string& d) { WriteFile(d + "/metadata.json", "{\"format\": 3"); },
       "metadata.json", "not a valid JSON"},
      {"missing shard",
       [&](const std::string& d) { fs::remove(d + "/" + shard); }, "model-tp00-pp00.safetensors",
       "missing"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    ScratchDir dir;
    State s;
    Save(dir.path(), s, 10, 3);
    Save(dir.path(), s, 20, 3);
    damage.apply(dir / "step_00000020");
    State t;
    auto loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 10);
    EXPECT_EQ(t.w[0], 10.0f);
    ASSERT_EQ(loaded->refused.size(), 1u);
    EXPECT_THAT(loaded->refused[0], HasSubstr(std::string("step_00000020/") + damage.file));
    EXPECT_THAT(loaded->refused[0], HasSubstr(damage.fault));
    // The damaged step alone is refused outright, and leaves tensors untouched.
    State u;
    auto direct = LoadCheckpointStep(dir / "step_00000020", u.model, u.All());
    EXPECT_FALSE(direct.ok());
    EXPECT_EQ(u.w[0], 0.0f);
  }
}

TEST(CheckpointTest, WrongModelShapeIsRefused) {
  ScratchDir dir;
  State s;
  Save(dir.path(), s, 10, 2);
  State t;
  t.model.hidden_size = 256;
  auto loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("model.hidden_size=128 but the job has 256"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("step_00000010/metadata.json"));

  // Same config, a tensor of another shape.
  State u;
  std::vector<TensorView> into = u.All();
  into[0].shape = {4, 3};
  auto shaped = LoadCheckpointStep(dir / "step_00000010", u.model, into);
  ASSERT_FALSE(shaped.ok());
  EXPECT_THAT(shaped.status().message(), HasSubstr("tensor w has shape [3, 4]"));
  EXPECT_EQ(u.n[0], 0.0f);  // nothing copied
}

TEST(CheckpointTest, NewestOfAnotherShapeFallsBackToPrevious) {
  ScratchDir dir;
  State s;
  Save(dir.path(), s, 10, 3);
  // Step 20 was written for another model: its w is [4, 3] under another config.
  State other;
  other.model.ffn_hidden_size = 1000;
  CheckpointContent c = other.Content(20);
  c.files[0].tensors[0].shape = {4, 3};
  ASSERT_TRUE(CommitCheckpoint(dir.path(), c, 3).ok());
  State t;
  auto loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 10);
  ASSERT_EQ(loaded->refused.size(), 1u);
  EXPECT_THAT(loaded->refused[0], HasSubstr("step_00000020/metadata.json: model mismatch"));
  EXPECT_THAT(loaded->refused[0], HasSubstr("model.ffn_hidden_size=1000 but the job has 384"));
  // Same config but a tensor of another shape: refused by the tensor check.
  other.model = t.model;
  CheckpointContent d = other.Content(30);
  d.files[0].tensors[0].shape = {4, 3};
  ASSERT_TRUE(CommitCheckpoint(dir.path(), d, 3).ok());
  loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 10);
  ASSERT_EQ(loaded->refused.size(), 2u);
  EXPECT_THAT(loaded->refused[0], HasSubstr("tensor w has shape [4, 3] but the model has [3, 4]"));
}

TEST(CheckpointTest, EveryStepRefusedIsAnError) {
  ScratchDir dir;
  State s;
  Save(dir.path(), s, 10, 2);
  Save(dir.path(), s, 20, 2);
  fs::remove(dir / "step_00000010/metadata.json");
  fs::remove(dir / "step_00000020/index.json");
  State t;
  auto loaded = LoadNewestCheckpoint(dir.path(), t.model, t.All());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("step_00000020/index.json"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("step_00000010/metadata.json"));
}

TEST(CheckpointTest, StaleTemporariesAreIgnoredAndCleaned) {
  ScratchDir dir;
  fs::create_directories(dir / ".step_00000030.tmp-1");
  WriteFile(dir / ".step_00000030.tmp-1/model-tp00-pp00.safetensors", "partial");
  State s;
  Save(dir.path(), s, 10, 2);
  EXPECT_EQ(Entries(dir.path()), std::vector<std::string>{"step_00000010"});
  EXPECT_EQ(ResolveStepDir(dir.path()).value(), dir / "step_00000010");
  EXPECT_EQ(ResolveStepDir(dir / "step_00000010").value(), dir / "step_00000010");
}

}  // namespace
}  // namespace loom::engine
