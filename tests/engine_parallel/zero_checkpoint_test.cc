// ZeRO checkpoints: every rank writes its shards, rank 0 commits one index of
// global shapes; a step saved under one (ZeRO stage, dp) loads under any other
// and training continues as the uninterrupted run does (1e-5; bit for bit
// when the layout is the same); export reads a sharded step.
#include <filesystem>
#include <fstream>

#include "export/hf_export.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine_parallel/dp_harness.h"
#include "absl/strings/str_format.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/crc32.h"

namespace loom::engine {
namespace {

struct Layout {
  int stage;
  int dp;
};

class ZeroCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::WriteFile(dir_ / "train.txt", testing::SyntheticText(20000, 1)); }
  spec::JobSpec Job(int stage) { return testing::ParallelJob(dir_ / "train.txt", stage); }

  // Trains to step 5 under `layout` and saves under root.
  void SaveAt5(Layout layout, const std::string& root) {
    const spec::JobSpec job = Job(layout.stage);
    if (layout.dp == 1) {
      auto loop = TrainingLoop::Create(job);
      ASSERT_TRUE(loop.ok());
      while ((*loop)->step() < 5) ASSERT_TRUE((*loop)->TrainStep().ok());
      ASSERT_TRUE((*loop)->SaveCheckpoint(root).ok());
      return;
    }
    testing::RunDataParallel(job, layout.dp, 5, {},
                             [&](int rank, TrainingLoop& loop, comm::Communicator&) {
                               if (loop.step() != 5) return;
                               auto dir = loop.SaveCheckpoint(root);
                               ASSERT_TRUE(dir.ok()) << dir.status();
                               EXPECT_EQ(dir->empty(), rank != 0);
                             });
  }

  // Restores from root under `layout` and trains to step 10.
  testing::RankResult ResumeTo10(Layout layout, const std::string& root) {
    const spec::JobSpec job = Job(layout.stage);
    if (layout.dp == 1) {
      testing::RankResult r;
      auto loop = TrainingLoop::Create(job);
      EXPECT_TRUE(loop.ok());
      auto loaded = (*loop)->RestoreNewest(root);
      EXPECT_TRUE(loaded.ok()) << loaded.status();
      while ((*loop)->step() < 10) {
        auto p = (*loop)->TrainStep();
        EXPECT_TRUE(p.ok());
        if (!p.ok()) break;
        r.losses.push_back(p->loss);
      }
      EXPECT_TRUE((*loop)->GatherParameters(&r.params).ok());
      return r;
    }
    return testing::RunDataParallel(job, layout.dp, 10,
                                    [&](int, TrainingLoop& loop, comm::Communicator&) {
                                      auto loaded = loop.RestoreNewest(root);
                                      ASSERT_TRUE(loaded.ok()) << loaded.status();
                                      EXPECT_EQ(loaded->step, 5);
                                    })[0];
  }

  testing::ScratchDir dir_;
};

TEST_F(ZeroCheckpointTest, LoadsAcrossStagesAndDpSizes) {
  const testing::RankResult want = testing::RunSingle(Job(0), 10);
  const std::vector<std::pair<Layout, Layout>> pairs = {
      {{3, 2}, {0, 1}}, {{1, 2}, {3, 4}}, {{2, 4}, {1, 2}}, {{0, 1}, {3, 2}}, {{3, 4}, {2, 2}}};
  int i = 0;
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(::testing::Message() << "zero" << from.stage << " dp" << from.dp << " -> zero"
                                      << to.stage << " dp" << to.dp);
    const std::string root = dir_ / ("ckpt" + std::to_string(i++));
    SaveAt5(from, root);
    const testing::RankResult got = ResumeTo10(to, root);
    ASSERT_EQ(got.losses.size(), 5u);
    for (int s = 0; s < 5; ++s) {
      EXPECT_NEAR(got.losses[s], want.losses[5 + s], 1e-5 * want.losses[5 + s]) << "step " << 6 + s;
    }
    EXPECT_LT(testing::MaxRelativeError(got.params, want.params), 1e-5);
  }
}

TEST_F(ZeroCheckpointTest, SameLayoutResumesBitForBit) {
  for (int stage : {1, 3}) {
    const auto straight = testing::RunDataParallel(Job(stage), 2, 10);
    const std::string root = dir_ / ("same" + std::to_string(stage));
    SaveAt5({stage, 2}, root);
    const testing::RankResult resumed = ResumeTo10({stage, 2}, root);
    ASSERT_EQ(resumed.losses.size(), 5u);
    for (int s = 0; s < 5; ++s) EXPECT_EQ(resumed.losses[s], straight[0].losses[5 + s]);
    EXPECT_EQ(resumed.params, straight[0].params);
  }
}

TEST_F(ZeroCheckpointTest, ShardedIndexHasGlobalShapesAndExportReadsIt) {
  const std::string root = dir_ / "z3";
  SaveAt5({3, 2}, root);
  const std::string step = root + "/step_00000005";
  EXPECT_TRUE(std::filesystem::exists(step + "/model-r00000.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(step + "/model-r00001.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(step + "/optimizer-r00001.safetensors"));
  std::ifstream in(step + "/index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  const nlohmann::json& emb = index["tensors"]["model.embed_tokens.weight"];
  EXPECT_EQ(emb["shape"], nlohmann::json::array({256, 32}));
  EXPECT_EQ(emb["shards"].size(), 2u);  // one half per rank, whole rows
  const nlohmann::json& m = index["tensors"]["optimizer.exp_avg.model.embed_tokens.weight"];
  EXPECT_EQ(m["group"], "optimizer");
  EXPECT_EQ(m["shape"], nlohmann::json::array({256, 32}));

  // The parameters the checkpoint holds are those of the uninterrupted run at step 5.
  const testing::RankResult at5 = testing::RunDataParallel(Job(3), 2, 5)[0];
  auto reader = CheckpointReader::Open(step);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto loop = TrainingLoop::Create(Job(0));
  ASSERT_TRUE(loop.ok());
  int64_t offset = 0;
  for (const TensorView& t : (*loop)->model().Parameters()) {
    auto values = reader->Values(t.name);
    ASSERT_TRUE(values.ok()) << values.status();
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ((*values)[i], at5.params[offset + i]) << t.name;
    offset += t.numel();
  }
  ASSERT_TRUE(hf_export::ExportHuggingFace(step, dir_ / "hf").ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ / "hf/model.safetensors"));
}

TEST_F(ZeroCheckpointTest, RefusesShardsThatDoNotTile) {
  const std::string root = dir_ / "bad";
  SaveAt5({2, 2}, root);
  const std::string index_path = root + "/step_00000005/index.json";
  std::ifstream in(index_path);
  nlohmann::json index = nlohmann::json::parse(in);
  in.close();
  // Drop one shard of a moment: the rest no longer covers the tensor. The
  // index's CRC is fixed up so only the tiling check can refuse it.
  nlohmann::json& shards =
      index["tensors"]["optimizer.exp_avg.model.embed_tokens.weight"]["shards"];
  ASSERT_EQ(shards.size(), 2u);
  shards.erase(shards.begin());
  const std::string text = index.dump(1);
  testing::WriteFile(index_path, text);
  const std::string meta_path = root + "/step_00000005/metadata.json";
  std::ifstream meta_in(meta_path);
  nlohmann::json meta = nlohmann::json::parse(meta_in);
  meta_in.close();
  meta["files"]["index.json"] = {
      {"bytes", text.size()},
      {"crc32", absl::StrFormat("%08x", Crc32(0, text.data(), text.size()))}};
  testing::WriteFile(meta_path, meta.dump(1));
  auto reader = CheckpointReader::Open(root + "/step_00000005");
  ASSERT_FALSE(reader.ok());
  // Refused by the reader's bounds on the index (its element count) before
  // the tiling check would see it.
  EXPECT_NE(reader.status().message().find("shards hold 4096 elements"), std::string::npos)
      << reader.status();
}

}  // namespace
}  // namespace loom::engine
