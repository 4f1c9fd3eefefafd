// In-place recovery's rollback, in process, for every kind of layout: ranks
// are threads with real Gloo groups built as the trainer builds them
// (mesh_attempt.h). Each rank trains to step k + 1 taking a snapshot after
// every step and copying it to its buddy over a pair group in the background;
// then (as after a failure) a new attempt builds new groups and new loops,
// the survivors roll back to their own snapshot of step k and one
// "relaunched" rank, which lost its memory, receives its snapshot from its
// buddy. Every later step's loss and every final parameter equal the
// uninterrupted run's bit for bit. The same snapshots written as a
// checkpoint step (a shrink's spill) equal the checkpoint of that step. Also: rolling every rank back inside its
// own loop, and a snapshot of another rank, layout or rank number refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/engine/test_util.h"
#include "tests/snapshot/mesh_attempt.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/checkpoint/resume_state.h"
#include "worker/engine/snapshot/snapshot_spill.h"
#include "worker/engine/snapshot_keeper.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

using testing::MeshAttempt;
using testing::MeshLayout;
using testing::NodeRing;
using testing::RunRanks;

constexpr int64_t kSteps = 6;
constexpr int64_t kRestoreStep = 3;

struct Case {
  std::string name;
  MeshLayout layout;
  // The buddy of each rank (the ring: -1 none); its ward is the inverse.
  std::vector<int> buddy;  // NodeRing of the nodes the ranks are placed on
  int relaunched = 0;      // the rank that restores from its buddy's copy
  bool moe = false;
  bool tied = false;
  int layers = 2;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

int WardOf(const Case& c, int rank) {
  for (size_t r = 0; r < c.buddy.size(); ++r) {
    if (c.buddy[r] == rank) return static_cast<int>(r);
  }
  return -1;
}

struct RankRun {
  std::vector<double> losses;  // steps trained in the run's last attempt, in order
  std::vector<int64_t> steps;
  std::vector<float> params;  // GatherParameters after the last step
};

class SnapshotRestoreTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { testing::WriteTinyCorpus(dir_); }

  spec::JobSpec Job() const {
    const Case& c = GetParam();
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.train.steps = kSteps;
    job.train.eval_interval = 3;
    job.train.grad_clip = 0.5;  // clipping active: the norm crosses every group
    job.model.num_layers = c.layers;
    job.model.tie_embeddings = c.tied;
    if (c.moe) {
      spec::MoeSpec& m = job.model.moe;
      m.num_experts = 4;
      m.top_k = 2;
      m.expert_ffn_hidden_size = 16;
      m.num_shared_experts = 1;
      m.first_dense_layers = 1;
      m.aux_loss_coef = 0.01;
      m.bias_update_rate = 0.01;  // the selection biases are state that moves
    }
    c.layout.ApplyTo(&job);
    return job;
  }

  std::vector<int> RingPeers(int rank) const {
    const Case& c = GetParam();
    return {c.buddy[static_cast<size_t>(rank)], WardOf(c, rank)};
  }

  // Trains a fresh loop per rank to the end, without snapshots.
  std::vector<RankRun> Reference() {
    const Case& c = GetParam();
    const spec::JobSpec job = Job();
    MeshAttempt attempt(store_, "reference", c.layout, [](int) { return std::vector<int>{}; });
    std::vector<RankRun> out(static_cast<size_t>(c.layout.world()));
    RunRanks(c.layout.world(), [&](int r) {
      auto loop = TrainingLoop::Create(job, attempt.Context(r));
      ASSERT_TRUE(loop.ok()) << loop.status();
      Train(**loop, nullptr, kSteps, &out[static_cast<size_t>(r)]);
      ASSERT_TRUE((*loop)->GatherParameters(&out[static_cast<size_t>(r)].params).ok());
    });
    return out;
  }

  // Steps `loop` until `until`, snapshots through `keeper` when given.
  static void Train(TrainingLoop& loop, SnapshotKeeper* keeper, int64_t until, RankRun* run) {
    while (loop.step() < until) {
      absl::StatusOr<StepProgress> p = loop.TrainStep();
      ASSERT_TRUE(p.ok()) << p.status();
      if (keeper != nullptr) {
        ASSERT_TRUE(keeper->AfterStep(loop, &*p).ok());
        ASSERT_TRUE(p->snapshot.has_value());
        EXPECT_EQ(p->snapshot->own_steps.back(), p->step);
      }
      if (run != nullptr) {
        run->losses.push_back(p->loss);
        run->steps.push_back(p->step);
      }
    }
  }

  std::unique_ptr<SnapshotKeeper> NewKeeper(int rank) {
    SnapshotKeeperOptions options;
    options.interval = 1;
    options.rank = rank;
    options.chunk_bytes = 4096;  // many chunks even for the tiny model
    return std::make_unique<SnapshotKeeper>(options);
  }

  // Attempt 1: every rank snapshots after every step, each copy sent to its
  // buddy; it stops at k + 1 (the failure). Returns each rank's keeper.
  std::vector<std::unique_ptr<SnapshotKeeper>> AttemptOne(const std::string& name) {
    const Case& c = GetParam();
    const spec::JobSpec job = Job();
    const int n = c.layout.world();
    std::vector<std::unique_ptr<SnapshotKeeper>> keepers(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) keepers[static_cast<size_t>(r)] = NewKeeper(r);
    MeshAttempt attempt(store_, name, c.layout, [&](int r) { return RingPeers(r); });
    RunRanks(n, [&](int r) {
      SnapshotKeeper& keeper = *keepers[static_cast<size_t>(r)];
      const int ward = WardOf(c, r);
      keeper.AttachRing(attempt.Pair(r, c.buddy[static_cast<size_t>(r)]), attempt.Pair(r, ward),
                        ward);
      auto loop = TrainingLoop::Create(job, attempt.Context(r));
      ASSERT_TRUE(loop.ok()) << loop.status();
      Train(**loop, &keeper, kRestoreStep + 1, nullptr);
      keeper.WaitForCopies();
      keeper.DetachRing();
    });
    return keepers;
  }

  void ExpectSameAsReference(const std::vector<RankRun>& got, const std::vector<RankRun>& ref) {
    for (size_t r = 0; r < ref.size(); ++r) {
      ASSERT_EQ(got[r].steps.size(), static_cast<size_t>(kSteps - kRestoreStep)) << "rank " << r;
      for (size_t i = 0; i < got[r].steps.size(); ++i) {
        const size_t at = static_cast<size_t>(got[r].steps[i] - 1);
        EXPECT_EQ(got[r].losses[i], ref[r].losses[at])
            << "rank " << r << " step " << got[r].steps[i];
      }
      EXPECT_TRUE(got[r].params == ref[r].params) << "rank " << r << ": final parameters differ";
    }
  }

  testing::ScratchDir dir_;
  comm::InProcessStore store_;
};

TEST_P(SnapshotRestoreTest, NewAttemptFromOwnSnapshotsAndABuddysCopyMatchesTheUninterruptedRun) {
  const Case& c = GetParam();
  const spec::JobSpec job = Job();
  const int n = c.layout.world();
  const std::vector<RankRun> ref = Reference();
  std::vector<std::unique_ptr<SnapshotKeeper>> keepers = AttemptOne("attempt-1");
  for (int r = 0; r < n; ++r) {
    const SnapshotKeeper& keeper = *keepers[static_cast<size_t>(r)];
    const int ward = WardOf(c, r);
    const SnapshotProgress held = keeper.Holdings();
    EXPECT_EQ(held.own_steps,
              (std::vector<int64_t>{kRestoreStep - 1, kRestoreStep, kRestoreStep + 1}));
    if (ward >= 0) {
      EXPECT_EQ(held.ward_rank, ward);
      EXPECT_EQ(held.ward_steps,
                (std::vector<int64_t>{kRestoreStep - 1, kRestoreStep, kRestoreStep + 1}));
    }
    EXPECT_GT(held.snapshot_bytes, 0);
  }
  // The relaunched rank's process is new: it holds nothing.
  const int lost = c.relaunched;
  const int helper = c.buddy[static_cast<size_t>(lost)];
  keepers[static_cast<size_t>(lost)] = NewKeeper(lost);
  std::vector<RankRun> got(static_cast<size_t>(n));
  MeshAttempt attempt(store_, "attempt-2", c.layout, [&](int r) {
    std::vector<int> peers = RingPeers(r);
    if (r == lost) peers.push_back(helper);
    if (r == helper) peers.push_back(lost);
    return peers;
  });
  RunRanks(n, [&](int r) {
    SnapshotKeeper& keeper = *keepers[static_cast<size_t>(r)];
    LoopOptions options;
    options.initialize_parameters = false;  // the snapshot overwrites every piece
    auto loop = TrainingLoop::Create(job, attempt.Context(r), nullptr, options);
    ASSERT_TRUE(loop.ok()) << loop.status();
    if (r == lost) {
      ASSERT_TRUE(keeper.RestoreFromPeer(**loop, *attempt.Pair(r, helper), kRestoreStep).ok());
    } else {
      absl::Status s = keeper.RestoreOwn(**loop, kRestoreStep);
      ASSERT_TRUE(s.ok()) << s;
    }
    if (r == helper) {
      absl::Status s = keeper.SendCopyTo(*attempt.Pair(r, lost), lost, kRestoreStep);
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ((*loop)->step(), kRestoreStep);
    // The newest it holds is the restore step (survivors keep older ones).
    const std::vector<int64_t> own = keeper.Holdings().own_steps;
    ASSERT_FALSE(own.empty());
    EXPECT_EQ(own.back(), kRestoreStep);
    const int ward = WardOf(c, r);
    keeper.AttachRing(attempt.Pair(r, c.buddy[static_cast<size_t>(r)]), attempt.Pair(r, ward),
                      ward);
    Train(**loop, &keeper, kSteps, &got[static_cast<size_t>(r)]);
    keeper.WaitForCopies();
    keeper.DetachRing();
    ASSERT_TRUE((*loop)->GatherParameters(&got[static_cast<size_t>(r)].params).ok());
  });
  ExpectSameAsReference(got, ref);
}

TEST_P(SnapshotRestoreTest, RollingBackInsideTheSameLoopMatchesTheUninterruptedRun) {
  const Case& c = GetParam();
  const spec::JobSpec job = Job();
  const int n = c.layout.world();
  const std::vector<RankRun> ref = Reference();
  std::vector<RankRun> got(static_cast<size_t>(n));
  MeshAttempt attempt(store_, "same-loop", c.layout, [](int) { return std::vector<int>{}; });
  RunRanks(n, [&](int r) {
    std::unique_ptr<SnapshotKeeper> keeper = NewKeeper(r);
    keeper->AttachRing(nullptr, nullptr, -1);  // no buddy: own snapshots only
    auto loop = TrainingLoop::Create(job, attempt.Context(r));
    ASSERT_TRUE(loop.ok()) << loop.status();
    Train(**loop, keeper.get(), kRestoreStep + 2, nullptr);
    keeper->DetachRing();
    // Three generations of its own: k, k + 1 and k + 2; k - 1 is gone.
    EXPECT_FALSE(keeper->RestoreOwn(**loop, kRestoreStep - 1).ok());
    ASSERT_TRUE(keeper->RestoreOwn(**loop, kRestoreStep).ok());
    EXPECT_EQ((*loop)->step(), kRestoreStep);
    Train(**loop, nullptr, kSteps, &got[static_cast<size_t>(r)]);
    ASSERT_TRUE((*loop)->GatherParameters(&got[static_cast<size_t>(r)].params).ok());
  });
  for (size_t r = 0; r < ref.size(); ++r) {
    ASSERT_EQ(got[r].steps.size(), static_cast<size_t>(kSteps - kRestoreStep));
    for (size_t i = 0; i < got[r].steps.size(); ++i) {
      EXPECT_EQ(got[r].losses[i], ref[r].losses[static_cast<size_t>(got[r].steps[i] - 1)])
          << "rank " << r << " step " << got[r].steps[i];
    }
    EXPECT_TRUE(got[r].params == ref[r].params) << "rank " << r;
  }
}

// No room for the relaunched rank (a shrink): the survivors write their own
// snapshots of step k and the buddy its copy of the lost rank's as a
// checkpoint step (snapshot_spill.h). It is the checkpoint the uninterrupted
// run saves at step k: every tensor bit for bit, and the same state.
TEST_P(SnapshotRestoreTest, SnapshotsWrittenAsACheckpointEqualTheCheckpointOfThatStep) {
  const Case& c = GetParam();
  const spec::JobSpec job = Job();
  const int n = c.layout.world();
  const std::string saved_root = dir_ / "saved";
  const std::string spilled_root = dir_ / "spilled";
  {
    MeshAttempt reference(store_, "saved", c.layout, [](int) { return std::vector<int>{}; });
    RunRanks(n, [&](int r) {
      auto loop = TrainingLoop::Create(job, reference.Context(r));
      ASSERT_TRUE(loop.ok()) << loop.status();
      Train(**loop, nullptr, kRestoreStep, nullptr);
      absl::StatusOr<std::string> saved = (*loop)->SaveCheckpoint(saved_root);
      ASSERT_TRUE(saved.ok()) << saved.status();
    });
  }
  std::vector<std::unique_ptr<SnapshotKeeper>> keepers = AttemptOne("spill-1");
  // The lost rank's memory is gone; its buddy writes its state.
  const int lost = c.relaunched;
  const int helper = c.buddy[static_cast<size_t>(lost)];
  keepers[static_cast<size_t>(lost)].reset();
  const std::string dir = SpillDir(spilled_root, kRestoreStep, 1);
  std::filesystem::create_directories(dir);
  std::vector<FileDigest> digests(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (r == lost) continue;
    SnapshotKeeper& keeper = *keepers[static_cast<size_t>(r)];
    absl::StatusOr<std::shared_ptr<const Snapshot>> own = keeper.OwnSnapshot(kRestoreStep);
    ASSERT_TRUE(own.ok()) << own.status();
    absl::StatusOr<FileDigest> d = WriteSpilledRank(dir, **own);
    ASSERT_TRUE(d.ok()) << d.status();
    digests[static_cast<size_t>(r)] = *d;
    if (r == helper) {
      absl::StatusOr<std::shared_ptr<const Snapshot>> copy = keeper.WardCopy(lost, kRestoreStep);
      ASSERT_TRUE(copy.ok()) << copy.status();
      d = WriteSpilledRank(dir, **copy);
      ASSERT_TRUE(d.ok()) << d.status();
      digests[static_cast<size_t>(lost)] = *d;
    }
  }
  std::vector<SpilledRank> ranks;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<SpilledRank> spilled = ReadSpilledRank(dir, r, digests[static_cast<size_t>(r)]);
    ASSERT_TRUE(spilled.ok()) << spilled.status();
    ranks.push_back(*std::move(spilled));
  }
  // A torn description (a digest that does not match) is refused.
  FileDigest wrong = digests[0];
  wrong.crc32 ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(ReadSpilledRank(dir, 0, wrong).status()));
  const SnapshotManifest& m = (*keepers[static_cast<size_t>(helper)]->OwnSnapshot(kRestoreStep))->manifest();
  CheckpointContent content;
  content.step = kRestoreStep;
  content.model = job.model;
  content.state = ResumeState(job,
                              {.dp = c.layout.dp, .tp = c.layout.tp, .pp = c.layout.pp,
                               .cp = c.layout.cp, .ep = c.layout.ep, .zero_stage = c.layout.zero},
                              {.step = m.step, .tokens = m.tokens, .optimizer_step = m.optimizer_step});
  absl::StatusOr<std::string> committed =
      CommitSpilledStep(spilled_root, dir, content, ranks, /*keep=*/2, nullptr);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(NewestCommittedStep(spilled_root), kRestoreStep);
  EXPECT_FALSE(std::filesystem::exists(dir));

  absl::StatusOr<CheckpointReader> saved =
      CheckpointReader::Open((std::filesystem::path(saved_root) / StepDirName(kRestoreStep)).string());
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<CheckpointReader> spilled = CheckpointReader::Open(*committed);
  ASSERT_TRUE(spilled.ok()) << spilled.status();
  ASSERT_EQ(spilled->tensors().size(), saved->tensors().size());
  for (const CheckpointTensorInfo& t : saved->tensors()) {
    const CheckpointTensorInfo* other = spilled->Find(t.name);
    ASSERT_NE(other, nullptr) << t.name;
    EXPECT_EQ(other->shape, t.shape) << t.name;
    EXPECT_EQ(other->group, t.group) << t.name;
    absl::StatusOr<std::vector<float>> want = saved->Values(t.name);
    absl::StatusOr<std::vector<float>> got = spilled->Values(t.name);
    ASSERT_TRUE(want.ok() && got.ok()) << t.name;
    EXPECT_TRUE(*want == *got) << t.name << " differs";
  }
  EXPECT_EQ(spilled->state(), saved->state());
  EXPECT_EQ(spilled->step(), kRestoreStep);
}

std::vector<Case> Cases() {
  auto layout = [](int pp, int dp, int ep, int cp, int tp, int zero) {
    MeshLayout l;
    l.pp = pp;
    l.dp = dp;
    l.ep = ep;
    l.cp = cp;
    l.tp = tp;
    l.zero = zero;
    return l;
  };
  std::vector<Case> cases;
  // Four nodes of one rank: buddy = the next node, ward = the previous.
  cases.push_back({"dp4_zero1", layout(1, 4, 1, 1, 1, 1), NodeRing({1, 1, 1, 1}), 2});
  cases.push_back({"dp2_zero3", layout(1, 2, 1, 1, 1, 3), NodeRing({1, 1}), 1});
  // Two nodes of two ranks: the same local index on the other node.
  const std::vector<int> two_by_two = NodeRing({2, 2});
  Case tp_pp{"tp2_pp2_1f1b_tied", layout(2, 1, 1, 1, 2, 0), two_by_two, 3};
  tp_pp.tied = true;
  tp_pp.layout.sequence_parallel = true;
  cases.push_back(tp_pp);
  Case interleaved{"tp2_pp2_interleaved", layout(2, 1, 1, 1, 2, 0), two_by_two, 0};
  interleaved.layout.schedule = spec::Schedule::kInterleaved;
  interleaved.layout.virtual_stages = 2;
  interleaved.layers = 4;
  cases.push_back(interleaved);
  cases.push_back({"cp2_dp2_zero1", layout(1, 2, 1, 2, 1, 1), two_by_two, 1});
  Case ep{"ep2_dp2_zero2_moe", layout(1, 2, 2, 1, 1, 2), two_by_two, 1};
  ep.moe = true;
  cases.push_back(ep);
  cases.push_back({"pp2_dp2_zero3", layout(2, 2, 1, 1, 1, 3), two_by_two, 2});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, SnapshotRestoreTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// A snapshot names its owner: another rank's place, another layout, or
// another rank number is refused with the difference, and nothing changes.
TEST(SnapshotRefusalTest, AnotherPlaceLayoutOrRankIsRefused) {
  testing::ScratchDir dir;
  testing::WriteTinyCorpus(dir);
  spec::JobSpec job = testing::TinyJob(dir / "train.txt", "");
  job.train.steps = 4;
  comm::InProcessStore store;
  MeshLayout dp2;
  dp2.dp = 2;
  dp2.zero = 1;
  dp2.ApplyTo(&job);
  std::vector<std::unique_ptr<Snapshot>> taken(2);
  MeshAttempt attempt(store, "refusal", dp2, [](int) { return std::vector<int>{}; });
  RunRanks(2, [&](int r) {
    auto loop = TrainingLoop::Create(job, attempt.Context(r));
    ASSERT_TRUE(loop.ok());
    ASSERT_TRUE((*loop)->TrainStep().ok());
    taken[static_cast<size_t>(r)] = std::make_unique<Snapshot>();
    ASSERT_TRUE((*loop)->CaptureSnapshot(taken[static_cast<size_t>(r)].get(), r).ok());
  });
  // Rank 1 of the same layout: another place (ZeRO-1's moment ranges differ too).
  {
    MeshAttempt again(store, "refusal-2", dp2, [](int) { return std::vector<int>{}; });
    RunRanks(2, [&](int r) {
      auto loop = TrainingLoop::Create(job, again.Context(r));
      ASSERT_TRUE(loop.ok());
      if (r != 1) return;
      absl::Status s = (*loop)->RestoreSnapshot(*taken[0], /*rank=*/1);
      EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
      EXPECT_NE(s.message().find("rank 0's state, not rank 1's"), std::string::npos) << s;
      s = (*loop)->RestoreSnapshot(*taken[0]);  // rank not given: the place still differs
      EXPECT_NE(s.message().find("place in the mesh differs"), std::string::npos) << s;
      EXPECT_NE(s.message().find("dp 0/2"), std::string::npos) << s;
      EXPECT_EQ((*loop)->step(), 0);
      EXPECT_TRUE((*loop)->RestoreSnapshot(*taken[1], 1).ok());
      EXPECT_EQ((*loop)->step(), 1);
    });
  }
  // One process: another layout.
  spec::JobSpec single = job;
  single.parallelism = spec::ParallelismSpec{};
  auto loop = TrainingLoop::Create(single);
  ASSERT_TRUE(loop.ok());
  absl::Status s = (*loop)->RestoreSnapshot(*taken[0]);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("its layout differs"), std::string::npos) << s;
  EXPECT_NE(s.message().find("dp2 tp1 pp1 cp1 ep1 zero1"), std::string::npos) << s;
}

// A rank's description is input like any file a rank writes: it may name
// only its own two files, and a digest must say it is the file its writer
// meant.
TEST(SnapshotSpillTest, ADescriptionNamingAnotherFileIsRefused) {
  testing::ScratchDir dir;
  auto describe = [&](const std::string& name) {
    const std::string text = absl::StrCat(
        R"({"rank": 1, "step": 3, "moe_bias": {}, "files": [{"name": ")", name,
        R"(", "group": "model", "tensors": [], "slices": [], "bytes": 0, "crc32": 0}]})");
    absl::StatusOr<FileDigest> d = WriteFileDurably(dir / "spilled-r00001.json", text);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : FileDigest{};
  };
  FileDigest d = describe("model-r00001.safetensors");
  absl::StatusOr<SpilledRank> read = ReadSpilledRank(dir.path(), 1, d);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->files.size(), 1u);
  for (const std::string forged : {"model-r00000.safetensors", "../model-r00001.safetensors",
                                   "index.json"}) {
    d = describe(forged);
    read = ReadSpilledRank(dir.path(), 1, d);
    EXPECT_TRUE(absl::IsDataLoss(read.status())) << forged << ": " << read.status();
  }
  // Rank 1's description is not rank 2's.
  d = describe("model-r00001.safetensors");
  std::filesystem::rename(dir / "spilled-r00001.json", dir / "spilled-r00002.json");
  EXPECT_TRUE(absl::IsDataLoss(ReadSpilledRank(dir.path(), 2, d).status()));
}

}  // namespace
}  // namespace loom::engine
