// Checkpoints under pipeline parallelism, across layouts. Ranks are threads
// with real Gloo groups (pp x dp x tp mesh, tp fastest). A run trains 5 of 10
// steps and saves; a run of another layout restores it and trains steps 6-10,
// which must equal the uninterrupted single-process run within 1e-5 relative
// (loss, gradient norm, validation loss, and every parameter afterwards):
// dp2·tp2 -> tp2·pp2, pp2 -> one process, one process -> pp2 interleaved, and
// the resharding matrix over seven layouts (every ordered pair).
// Resuming the same layout (dp2·tp2·pp2) reproduces the uninterrupted run of
// that layout bit for bit. The committed index lists every tensor once, whole.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "tests/comm/mesh_groups.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "tests/engine/train_steps.h"
#include "tests/engine_pipeline/pipeline_layout.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

constexpr int kSteps = 10;
constexpr int kSaveAt = 5;
constexpr double kTolerance = 1e-5;

using Layout = testing::PipelineLayout;

struct RankRun {
  absl::Status restore = absl::OkStatus();
  int64_t restored_step = 0;
  std::vector<StepProgress> steps;
  testing::TensorMap params;  // this rank's tensors, assembled over TP
  std::string saved;          // SaveCheckpoint's result
  std::vector<std::string> files_read;  // the restored step's data files this rank read
  std::vector<std::string> refused;     // newer steps the restore refused
};

class PipelineCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }

  spec::JobSpec Job() const {
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.model.num_layers = 4;
    job.train.steps = kSteps;
    job.train.grad_clip = 0.5;
    job.checkpoint.keep = 0;
    return job;
  }

  // Every rank of the layout: restores from `restore_root` (when given; a
  // NOT_FOUND is a fresh start), trains up to step `until`, then saves under
  // `save_root` (when given).
  std::vector<RankRun> Run(spec::JobSpec job, const Layout& l, const std::string& restore_root,
                           int64_t until, const std::string& save_root) {
    l.ApplyTo(&job);
    const comm::testing::MeshGroups mesh(l.pp, l.dp, l.tp);
    std::vector<RankRun> runs(mesh.size());
    mesh.RunRanks([&](int p, int d, int t) {
      comm::Communicator* tp_comm = mesh.Tp(p, d, t);
      comm::Communicator* dp_comm = mesh.Dp(p, d, t);
      comm::Communicator* pp_comm = mesh.Pp(p, d, t);
      RankRun& run = runs[mesh.Rank(p, d, t)];
      absl::StatusOr<std::unique_ptr<TrainingLoop>> created =
          TrainingLoop::Create(job, d, l.dp, dp_comm, tp_comm, pp_comm);
      ASSERT_TRUE(created.ok()) << created.status();
      TrainingLoop& loop = **created;
      if (!restore_root.empty()) {
        absl::StatusOr<LoadedCheckpoint> loaded = loop.RestoreNewest(restore_root);
        run.restore = loaded.status();
        if (loaded.ok()) {
          run.restored_step = loaded->step;
          run.files_read = loaded->files_read;
          run.refused = loaded->refused;
        }
      }
      while (loop.step() < until) {
        absl::StatusOr<StepProgress> step = loop.TrainStep();
        ASSERT_TRUE(step.ok()) << step.status();
        run.steps.push_back(*step);
      }
      if (!save_root.empty()) {
        absl::StatusOr<std::string> saved = loop.SaveCheckpoint(save_root);
        ASSERT_TRUE(saved.ok()) << saved.status();
        run.saved = *saved;
      }
      // Through GatherParameters (collective over DP): ZeRO-3 holds shards.
      std::vector<float> flat;
      ASSERT_TRUE(loop.GatherParameters(&flat).ok());
      const std::vector<TensorView> params = loop.pipeline_stage() != nullptr
          ? loop.pipeline_stage()->Parameters() : loop.model().Parameters();
      int64_t offset = 0;
      for (TensorView v : params) {
        ASSERT_LE(offset + v.numel(), static_cast<int64_t>(flat.size()));
        v.data = flat.data() + offset;
        offset += v.numel();
        std::vector<float> global;
        ASSERT_TRUE(GatherGlobal(v, tp_comm, &global).ok());
        run.params[v.name] = std::move(global);
      }
    });
    return runs;
  }

  // Each rank's steps are the reference's from `first_step` on; the ranks'
  // tensors together are the reference's.
  static void ExpectContinues(const std::vector<RankRun>& runs, const RankRun& reference,
                              int64_t first_step, double tolerance) {
    testing::TensorMap covered;
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const RankRun& run = runs[r];
      ASSERT_EQ(run.steps.size(), reference.steps.size() - first_step);
      for (size_t s = 0; s < run.steps.size(); ++s) {
        const StepProgress& a = run.steps[s];
        const StepProgress& b = reference.steps[first_step + s];
        testing::ExpectStepNear(a, b, tolerance);
        EXPECT_EQ(a.tokens, b.tokens) << "step " << b.step;
      }
      for (const auto& [name, values] : run.params) {
        auto it = reference.params.find(name);
        ASSERT_NE(it, reference.params.end()) << name;
        ASSERT_EQ(values.size(), it->second.size()) << name;
        if (tolerance == 0.0) {
          EXPECT_EQ(values, it->second) << name;
        } else {
          EXPECT_LE(testing::NormRelDiff(values, it->second), tolerance) << name;
        }
        covered[name] = values;
      }
    }
    EXPECT_EQ(covered.size(), reference.params.size());
  }

  static void ExpectRestored(const std::vector<RankRun>& runs) {
    for (const RankRun& run : runs) {
      EXPECT_TRUE(run.restore.ok()) << run.restore;
      EXPECT_EQ(run.restored_step, kSaveAt);
    }
  }

  RankRun Reference() { return Run(Job(), {}, "", kSteps, "")[0]; }

  testing::ScratchDir dir_;
};

TEST_F(PipelineCheckpointTest, Dp2Tp2ResumesAtTp2Pp2) {
  const std::string root = dir_ / "ckpt";
  Run(Job(), {.dp = 2, .tp = 2}, "", kSaveAt, root);
  const std::vector<RankRun> resumed = Run(Job(), {.pp = 2, .tp = 2}, root, kSteps, "");
  ExpectRestored(resumed);
  ExpectContinues(resumed, Reference(), kSaveAt, kTolerance);
}

TEST_F(PipelineCheckpointTest, Pp2ResumesInOneProcess) {
  const std::string root = dir_ / "ckpt";
  const std::vector<RankRun> saved = Run(Job(), {.pp = 2}, "", kSaveAt, root);
  // Stage 0 commits; the other stage's call returns "".
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].saved, root + "/step_00000005");
  EXPECT_EQ(saved[1].saved, "");

  // One index of whole global tensors: parameters and both moments, each once.
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(saved[0].saved);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const RankRun reference = Reference();
  EXPECT_EQ(reader->tensors().size(), 3 * reference.params.size());
  for (const CheckpointTensorInfo& info : reader->tensors()) {
    ASSERT_EQ(info.shards.size(), 1u) << info.name;
    EXPECT_EQ(info.shards[0].shape, info.shape) << info.name;
  }
  EXPECT_NE(reader->Find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(reader->Find("model.embed_tokens.weight")->file, "model-r00000.safetensors");
  ASSERT_NE(reader->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(reader->Find("lm_head.weight")->file, "model-r00001.safetensors");
  EXPECT_EQ(reader->state()["layout"]["pp"], 2);

  const std::vector<RankRun> resumed = Run(Job(), {}, root, kSteps, "");
  ExpectRestored(resumed);
  ExpectContinues(resumed, reference, kSaveAt, kTolerance);
}

// Under dp2·tp2·pp2 with ZeRO-1 each rank writes only what it holds uniquely
// (mesh rank = tp + 2 * (dp + 2 * pp)): TP slices from both TP ranks of DP
// rank 0; a norm weight (replicated over TP and, its parameter, over DP)
// once; its moments (ZeRO's DP shards) from TP rank 0 of each DP rank.
TEST_F(PipelineCheckpointTest, EachPieceWrittenOnceWithItsPlace) {
  const std::string root = dir_ / "ckpt";
  const std::vector<RankRun> saved =
      Run(Job(), {.pp = 2, .dp = 2, .tp = 2, .zero_stage = 1}, "", kSaveAt, root);
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(saved[0].saved);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CheckpointTensorInfo* q = reader->Find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(q->shards.size(), 2u);
  std::set<std::string> q_files;
  for (const CheckpointShardInfo& s : q->shards) q_files.insert(s.file);
  EXPECT_EQ(q_files, (std::set<std::string>{"model-r00000.safetensors", "model-r00001.safetensors"}));
  EXPECT_EQ(q->shards[0].shape[0] + q->shards[1].shape[0], q->shape[0]);  // rows split over TP
  const CheckpointTensorInfo* norm = reader->Find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  ASSERT_EQ(norm->shards.size(), 1u);
  EXPECT_EQ(norm->shards[0].file, "model-r00004.safetensors");
  const CheckpointTensorInfo* m = reader->Find("optimizer.exp_avg.model.norm.weight");
  ASSERT_NE(m, nullptr);
  for (const CheckpointShardInfo& s : m->shards) {
    EXPECT_TRUE(s.file == "optimizer-r00004.safetensors" || s.file == "optimizer-r00006.safetensors")
        << s.file;
  }
  EXPECT_EQ(reader->state()["layout"]["tp"], 2);
}

TEST_F(PipelineCheckpointTest, OneProcessResumesAtPp2Interleaved) {
  const std::string root = dir_ / "ckpt";
  Run(Job(), {}, "", kSaveAt, root);
  const std::vector<RankRun> resumed =
      Run(Job(), {.pp = 2, .schedule = spec::Schedule::kInterleaved, .virtual_stages = 2}, root,
          kSteps, "");
  ExpectRestored(resumed);
  ExpectContinues(resumed, Reference(), kSaveAt, kTolerance);
}

// Same layout: the resumed steps are the uninterrupted run's bit for bit,
// also with the optimizer states (ZeRO 1, 2) and the parameters (ZeRO 3)
// sharded over DP.
class PipelineBitForBitTest : public PipelineCheckpointTest,
                              public ::testing::WithParamInterface<int> {};

TEST_P(PipelineBitForBitTest, Dp2Tp2Pp2ResumeIsBitForBit) {
  const Layout layout{.pp = 2, .dp = 2, .tp = 2, .zero_stage = GetParam()};
  const std::string root = dir_ / "ckpt";
  const std::vector<RankRun> whole = Run(Job(), layout, "", kSteps, "");
  Run(Job(), layout, "", kSaveAt, root);
  const std::vector<RankRun> resumed = Run(Job(), layout, root, kSteps, "");
  ExpectRestored(resumed);
  ASSERT_EQ(resumed.size(), whole.size());
  for (size_t r = 0; r < whole.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(resumed[r].steps.size(), static_cast<size_t>(kSteps - kSaveAt));
    for (size_t s = 0; s < resumed[r].steps.size(); ++s) {
      const StepProgress& a = resumed[r].steps[s];
      const StepProgress& b = whole[r].steps[kSaveAt + s];
      EXPECT_EQ(a.loss, b.loss) << "step " << b.step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << b.step;
      EXPECT_EQ(a.val_loss, b.val_loss) << "step " << b.step;
    }
    EXPECT_EQ(resumed[r].params, whole[r].params);
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, PipelineBitForBitTest, ::testing::Values(0, 1, 2, 3));

// A ZeRO-2 pipeline's checkpoint holds whole global tensors: one process
// resumes it.
TEST_F(PipelineCheckpointTest, Dp2Pp2Zero2ResumesInOneProcess) {
  const std::string root = dir_ / "ckpt";
  Run(Job(), {.pp = 2, .dp = 2, .zero_stage = 2}, "", kSaveAt, root);
  const std::vector<RankRun> resumed = Run(Job(), {}, root, kSteps, "");
  ExpectRestored(resumed);
  ExpectContinues(resumed, Reference(), kSaveAt, kTolerance);
}

// Tied embeddings across stages: the checkpoint holds the embedding once (the
// first stage's); the last stage's copy loads from it. A tied pp2·dp2 ZeRO-1
// run resumes bit for bit and in one process.
TEST_F(PipelineCheckpointTest, TiedAcrossStagesResumes) {
  spec::JobSpec job = Job();
  job.model.tie_embeddings = true;
  const Layout layout{.pp = 2, .dp = 2, .zero_stage = 1};
  const std::string root = dir_ / "ckpt";
  const std::vector<RankRun> whole = Run(job, layout, "", kSteps, "");
  Run(job, layout, "", kSaveAt, root);
  const std::vector<RankRun> resumed = Run(job, layout, root, kSteps, "");
  ExpectRestored(resumed);
  for (size_t r = 0; r < whole.size(); ++r) {
    ASSERT_EQ(resumed[r].steps.size(), static_cast<size_t>(kSteps - kSaveAt));
    for (size_t s = 0; s < resumed[r].steps.size(); ++s) {
      EXPECT_EQ(resumed[r].steps[s].loss, whole[r].steps[kSaveAt + s].loss) << "rank " << r;
    }
    EXPECT_EQ(resumed[r].params, whole[r].params) << "rank " << r;
  }
  const std::vector<RankRun> one = Run(job, {}, root, kSteps, "");
  ExpectRestored(one);
  ExpectContinues(one, Run(job, {}, "", kSteps, "")[0], kSaveAt, kTolerance);
}

// The resharding matrix: a checkpoint saved at step 5 under each of seven
// layouts (one process, ZeRO-3, TP x PP, ZeRO-1 under TP, interleaved PP,
// ZeRO-3 under TP, ZeRO-3 under TP x PP) resumes under each of the other six, and every resumed run ends
// the uninterrupted one-process run within 1e-5 (losses, gradient norms,
// parameters).
TEST_F(PipelineCheckpointTest, ReshardingMatrix) {
  const std::vector<std::pair<std::string, Layout>> layouts = {
      {"one process", {}},
      {"dp2 zero3", {.dp = 2, .zero_stage = 3}},
      {"tp2 pp2", {.pp = 2, .tp = 2}},
      {"dp2 tp2 zero1", {.dp = 2, .tp = 2, .zero_stage = 1}},
      {"pp2 interleaved", {.pp = 2, .schedule = spec::Schedule::kInterleaved, .virtual_stages = 2}},
      {"dp2 tp2 zero3", {.dp = 2, .tp = 2, .zero_stage = 3}},
      {"dp2 tp2 pp2 zero3", {.pp = 2, .dp = 2, .tp = 2, .zero_stage = 3}},
  };
  const RankRun reference = Reference();
  for (size_t from = 0; from < layouts.size(); ++from) {
    const std::string root = dir_ / ("matrix-" + std::to_string(from));
    Run(Job(), layouts[from].second, "", kSaveAt, root);
    for (size_t to = 0; to < layouts.size(); ++to) {
      if (to == from) continue;
      SCOPED_TRACE(layouts[from].first + " -> " + layouts[to].first);
      const std::vector<RankRun> resumed = Run(Job(), layouts[to].second, root, kSteps, "");
      ExpectRestored(resumed);
      ExpectContinues(resumed, reference, kSaveAt, kTolerance);
    }
  }
}

// An empty root is a fresh start under PP as under any layout.
// The mesh rank in a file name: "model-r00003.safetensors" -> 3.
int FileRank(const std::string& file) {
  const size_t at = file.find("-r");
  return at == std::string::npos ? -1 : std::stoi(file.substr(at + 2, 5));
}

// A rank restoring tp2·pp2 reads only the files of its own stage (mesh rank
// = tp + 2 * pp), TP rank 0 only its own pair (its slices and the replicated
// tensors it wrote), and fewer files than the step holds.
TEST_F(PipelineCheckpointTest, Tp2Pp2RankReadsOnlyItsStagesFiles) {
  const std::string root = dir_ / "ckpt";
  const Layout layout{.pp = 2, .tp = 2};
  Run(Job(), layout, "", kSaveAt, root);
  size_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(root + "/step_00000005")) {
    total += e.path().extension() == ".safetensors" ? 1 : 0;
  }
  ASSERT_EQ(total, 8u);  // model and optimizer of each of the 4 ranks
  const std::vector<RankRun> resumed = Run(Job(), layout, root, kSaveAt, "");
  ASSERT_EQ(resumed.size(), 4u);
  ExpectRestored(resumed);
  for (size_t r = 0; r < resumed.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const std::vector<std::string>& read = resumed[r].files_read;
    EXPECT_FALSE(read.empty());
    EXPECT_LT(read.size(), total);
    for (const std::string& f : read) EXPECT_EQ(FileRank(f) / 2, static_cast<int>(r) / 2) << f;
    if (r % 2 == 0) {
      const std::string own = absl::StrFormat("r%05d.safetensors", r);
      EXPECT_EQ(std::set<std::string>(read.begin(), read.end()),
                (std::set<std::string>{"model-" + own, "optimizer-" + own}));
    }
  }
}

// A corrupt file that only stage 0 needs refuses the newest step on EVERY
// rank: stage 1 (which never reads it) falls back with stage 0 to the older
// step instead of loading the newer one alone.
TEST_F(PipelineCheckpointTest, CorruptFileRefusesTheStepOnEveryRank) {
  const std::string root = dir_ / "ckpt";
  const Layout layout{.pp = 2, .tp = 2};
  Run(Job(), layout, "", 3, root);
  Run(Job(), layout, root, kSaveAt, root);
  const std::string victim = root + "/step_00000005/model-r00000.safetensors";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));  // the last data byte: size kept, CRC broken
  }
  const std::vector<RankRun> resumed = Run(Job(), layout, root, 3, "");
  for (size_t r = 0; r < resumed.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(resumed[r].restore.ok()) << resumed[r].restore;
    EXPECT_EQ(resumed[r].restored_step, 3);
    ASSERT_EQ(resumed[r].refused.size(), 1u);
    EXPECT_NE(resumed[r].refused[0].find("step_00000005"), std::string::npos)
        << resumed[r].refused[0];
  }
  // Rank 0 needs the file and names it; a stage-1 rank says who refused.
  const std::string& first = resumed[0].refused[0];
  EXPECT_NE(first.find("model-r00000.safetensors"), std::string::npos) << first;
  EXPECT_NE(first.find("checksum mismatch"), std::string::npos) << first;
  const std::string& last = resumed[3].refused[0];
  EXPECT_NE(last.find("refused by"), std::string::npos) << last;
}

TEST_F(PipelineCheckpointTest, EmptyRootIsAFreshStart) {
  const std::vector<RankRun> runs = Run(Job(), {.pp = 2}, dir_ / "none", 1, "");
  for (const RankRun& run : runs) {
    EXPECT_TRUE(absl::IsNotFound(run.restore)) << run.restore;
    EXPECT_EQ(run.steps.size(), 1u);
  }
}

}  // namespace
}  // namespace loom::engine
