#include "worker/trainer/spill_snapshots.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/resume_state.h"
#include "worker/engine/snapshot/snapshot_spill.h"

namespace loom::trainer {
namespace {

constexpr char kErrorPrefix[] = "error: ";

std::string SpillKey(int64_t step, int rank) {
  return absl::StrCat("loom/spill/", step, "/r", rank);
}

// Writes one rank's state and tells the store either way.
absl::Status WriteAndAnnounce(const std::string& dir, int64_t step, int rank,
                              const absl::StatusOr<std::shared_ptr<const engine::Snapshot>>& from,
                              comm::Store& store) {
  absl::StatusOr<engine::FileDigest> written =
      from.ok() ? engine::WriteSpilledRank(dir, **from) : absl::StatusOr<engine::FileDigest>(from.status());
  const std::string value = written.ok() ? engine::FormatDigest(*written)
                                         : absl::StrCat(kErrorPrefix, written.status().message());
  if (absl::Status s = store.Set(SpillKey(step, rank), value); !s.ok()) {
    return written.ok() ? s : written.status();
  }
  return written.status();
}

}  // namespace

absl::Status SpillSnapshots(const loom::v1::StopRanks& order, engine::SnapshotKeeper& keeper,
                            const SpillContext& c) {
  auto event = [&c](const std::string& message) {
    if (c.on_event) c.on_event(message);
  };
  const loom::v1::RankAssignment& a = *c.assignment;
  const int64_t step = order.spill_step();
  const int rank = a.rank();
  const std::set<int> failed(order.failed_ranks().begin(), order.failed_ranks().end());
  if (a.checkpoint_dir().empty()) {
    return absl::FailedPreconditionError("spill: the job has no checkpoint directory");
  }
  if (failed.count(rank) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spill: rank ", rank, " is named among the failed ranks"));
  }
  const std::string& root = a.checkpoint_dir();
  if (const int64_t newest = engine::NewestCommittedStep(root); newest >= step) {
    event(absl::StrCat("spill of step ", step, " not needed: the checkpoint of step ", newest,
                       " is as new"));
    return absl::OkStatus();
  }
  const std::string dir = engine::SpillDir(root, step, c.attempt);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("spill: create ", dir, ": ", ec.message()));

  absl::Status mine = WriteAndAnnounce(dir, step, rank, keeper.OwnSnapshot(step), *c.store);
  if (!mine.ok()) return mine;
  if (failed.count(c.ward_rank) > 0) {
    if (absl::Status s = WriteAndAnnounce(dir, step, c.ward_rank,
                                          keeper.WardCopy(c.ward_rank, step), *c.store);
        !s.ok()) {
      return s;
    }
    event(absl::StrCat("wrote its own snapshot of step ", step, " and rank ", c.ward_rank,
                       "'s copy into ", dir));
  } else {
    event(absl::StrCat("wrote its own snapshot of step ", step, " into ", dir));
  }

  // The lowest surviving rank commits.
  int committer = 0;
  while (failed.count(committer) > 0) ++committer;
  if (rank != committer) return absl::OkStatus();
  const int world = a.world_size();
  std::vector<engine::SpilledRank> ranks;
  const absl::Time give_up = absl::Now() + c.timeout;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<std::string> value =
        c.store->Get(SpillKey(step, r), std::max(absl::ZeroDuration(), give_up - absl::Now()));
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("spill of step ", step, ": rank ", r, "'s files: ",
                                       value.status().message()));
    }
    if (absl::StartsWith(*value, kErrorPrefix)) {
      return absl::FailedPreconditionError(
          absl::StrCat("spill of step ", step, ": rank ", r, "'s state was not written: ",
                       value->substr(sizeof(kErrorPrefix) - 1)));
    }
    absl::StatusOr<engine::FileDigest> digest = engine::ParseDigest(*value);
    if (!digest.ok()) return digest.status();
    absl::StatusOr<engine::SpilledRank> spilled = engine::ReadSpilledRank(dir, r, *digest);
    if (!spilled.ok()) return spilled.status();
    ranks.push_back(*std::move(spilled));
  }
  // The step counters are every rank's alike: this rank's own snapshot's.
  absl::StatusOr<std::shared_ptr<const engine::Snapshot>> own = keeper.OwnSnapshot(step);
  if (!own.ok()) return own.status();
  const engine::SnapshotManifest& m = (*own)->manifest();
  const loom::v1::Layout& l = a.layout();
  engine::CheckpointContent content;
  content.step = step;
  content.model = c.job->model;
  content.state = engine::ResumeState(
      *c.job,
      {.dp = std::max<int64_t>(1, l.dp()), .tp = std::max<int64_t>(1, l.tp()),
       .pp = std::max<int64_t>(1, l.pp()), .cp = std::max<int64_t>(1, l.cp()),
       .ep = std::max<int64_t>(1, l.ep()), .zero_stage = l.zero_stage()},
      {.step = m.step, .tokens = m.tokens, .optimizer_step = m.optimizer_step});
  absl::StatusOr<std::string> committed =
      engine::CommitSpilledStep(root, dir, std::move(content), ranks, c.job->checkpoint.keep, c.gate);
  if (!committed.ok()) return committed.status();
  event(absl::StrCat("committed the in-memory snapshots of step ", step, " of all ", world,
                     " ranks as ", *committed));
  return absl::OkStatus();
}

}  // namespace loom::trainer
