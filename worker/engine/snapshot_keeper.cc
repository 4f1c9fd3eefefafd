#include "worker/engine/snapshot_keeper.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

SnapshotKeeper::SnapshotKeeper(SnapshotKeeperOptions options) : options_(std::move(options)) {}

SnapshotKeeper::~SnapshotKeeper() { DetachRing(); }

void SnapshotKeeper::AttachRing(comm::Communicator* to_buddy, comm::Communicator* from_ward,
                                int ward_rank) {
  DetachRing();
  SnapshotTransferOptions transfer;
  transfer.chunk_bytes = options_.chunk_bytes;
  transfer.tag = kBuddyCopyTag;
  transfer.leave_out_held = true;  // the buddy's own snapshot holds the replicated pieces
  copier_ = std::make_unique<SnapshotCopier>(
      SnapshotCopier::Ring{to_buddy, from_ward != nullptr && ward_rank >= 0 ? from_ward : nullptr},
      transfer, options_.background_copies);
  std::lock_guard<std::mutex> lock(ward_mu_);
  ring_ward_ = from_ward != nullptr ? ward_rank : -1;
  reported_copy_failure_ = false;
}

void SnapshotKeeper::DetachRing() { copier_.reset(); }

void SnapshotKeeper::CommitWardCopy(int ward_rank, std::shared_ptr<Snapshot> copy) {
  std::lock_guard<std::mutex> lock(ward_mu_);
  if (ward_rank_ != ward_rank) {  // a new ward: the old one's copies are of no use now
    ward_.Clear();
    ward_rank_ = ward_rank;
  }
  ward_.Commit(std::move(copy));
}

std::vector<uint64_t> SnapshotKeeper::HeldPieceKeys() const {
  // The newest own snapshot's pieces: every snapshot of an attempt has the
  // same, so they are the ones this step's capture is about to take. Before
  // the first capture there are none and the ward's copy comes whole.
  std::vector<uint64_t> keys;
  const std::vector<int64_t> steps = own_.Steps();
  if (steps.empty()) return keys;
  std::shared_ptr<const Snapshot> newest = own_.Find(steps.back());
  if (newest == nullptr) return keys;
  for (const SnapshotPiece& p : newest->manifest().pieces) {
    if (p.count > 0) keys.push_back(SnapshotPieceKey(p));
  }
  return keys;
}

void SnapshotKeeper::NoteCopyFailures() {
  if (copier_ == nullptr || reported_copy_failure_ || !options_.on_event) return;
  const SnapshotCopier::SendResult sent = copier_->last_send();
  const absl::Status received = copier_->last_receive();
  if (!sent.status.ok()) {
    options_.on_event(absl::StrCat("snapshot copy of step ", sent.step,
                                   " to the buddy failed: ", sent.status.message()));
    reported_copy_failure_ = true;
  } else if (!received.ok()) {
    options_.on_event(absl::StrCat("snapshot copy from the ward failed: ", received.message()));
    reported_copy_failure_ = true;
  }
}

absl::Status SnapshotKeeper::AfterStep(TrainingLoop& loop, StepProgress* p) {
  if (!Due(p->step)) {
    p->snapshot = Holdings();
    return absl::OkStatus();
  }
  // The previous copies first: the buffer about to be overwritten may be the
  // one being sent, and the buddy must hold a copy of the previous step
  // before this rank starts on the next.
  const auto wait_start = std::chrono::steady_clock::now();
  if (copier_ != nullptr) copier_->WaitIdle();
  const double waited = Since(wait_start);
  NoteCopyFailures();
  if (copier_ != nullptr && copier_->has_ward()) {
    int ward;
    {
      std::lock_guard<std::mutex> lock(ward_mu_);
      ward = ring_ward_;
    }
    // Posted before this rank's own copy starts: the ward may be sending already.
    copier_->ReceiveFromWard(
        p->step, ward_.BeginWrite(), HeldPieceKeys(),
        [this, ward](std::shared_ptr<Snapshot> copy) { CommitWardCopy(ward, std::move(copy)); });
  }
  std::shared_ptr<Snapshot> snapshot = own_.BeginWrite();
  const auto capture_start = std::chrono::steady_clock::now();
  if (absl::Status s = loop.CaptureSnapshot(snapshot.get(), options_.rank); !s.ok()) return s;
  const double captured = Since(capture_start);
  own_.Commit(snapshot);
  if (copier_ != nullptr && copier_->has_buddy()) copier_->SendToBuddy(snapshot);
  p->snapshot = Holdings();
  p->snapshot->capture_seconds = captured;
  p->snapshot->wait_seconds = waited;
  return absl::OkStatus();
}

void SnapshotKeeper::WaitForCopies() {
  if (copier_ != nullptr) copier_->WaitIdle();
}

absl::Status SnapshotKeeper::RestoreOwn(TrainingLoop& loop, int64_t step) {
  absl::StatusOr<std::shared_ptr<const Snapshot>> snapshot = OwnSnapshot(step);
  if (!snapshot.ok()) return snapshot.status();
  if (absl::Status s = loop.RestoreSnapshot(**snapshot, options_.rank); !s.ok()) return s;
  own_.DropAfter(step);
  ward_.DropAfter(step);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SnapshotKeeper::RollBackBefore(TrainingLoop& loop, int64_t step) {
  int64_t newest = -1;
  for (int64_t s : own_.Steps()) {
    if (s < step) newest = std::max(newest, s);
  }
  if (newest < 0) {
    return absl::NotFoundError(absl::StrCat("rank ", options_.rank,
                                            " holds no snapshot of its own before step ", step,
                                            " (it holds steps [", absl::StrJoin(own_.Steps(), ","),
                                            "])"));
  }
  if (absl::Status s = RestoreOwn(loop, newest); !s.ok()) return s;
  return newest;
}

absl::Status SnapshotKeeper::RestoreFromPeer(TrainingLoop& loop, comm::Communicator& pair,
                                             int64_t step) {
  SnapshotTransferOptions transfer;
  transfer.chunk_bytes = options_.chunk_bytes;
  transfer.tag = kRestoreCopyTag;
  std::shared_ptr<Snapshot> snapshot = own_.BeginWrite();
  if (absl::Status s = ReceiveSnapshot(pair, step, snapshot.get(), transfer); !s.ok()) return s;
  if (absl::Status s = loop.RestoreSnapshot(*snapshot, options_.rank); !s.ok()) return s;
  own_.Commit(std::move(snapshot));
  own_.DropAfter(step);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Snapshot>> SnapshotKeeper::OwnSnapshot(int64_t step) const {
  std::shared_ptr<const Snapshot> snapshot = own_.Find(step);
  if (snapshot == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, " holds no snapshot of step ", step,
                     " of its own (it holds steps [", absl::StrJoin(own_.Steps(), ","), "])"));
  }
  return snapshot;
}

absl::StatusOr<std::shared_ptr<const Snapshot>> SnapshotKeeper::WardCopy(int owner, int64_t step) {
  std::shared_ptr<Snapshot> copy;
  int held_ward;
  {
    std::lock_guard<std::mutex> lock(ward_mu_);
    held_ward = ward_rank_;
    if (ward_rank_ == owner) copy = ward_.FindWritable(step);
  }
  if (copy == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, " holds no copy of rank ", owner,
                     "'s snapshot of step ", step, " (it holds rank ", held_ward, "'s steps [",
                     absl::StrJoin(ward_.Steps(), ","), "])"));
  }
  // The pieces this rank holds itself were left out of the copy: they come
  // from its own snapshot of the same step (no copy is in flight now).
  if (!copy->borrowed().empty()) {
    std::shared_ptr<const Snapshot> own = own_.Find(step);
    if (own == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", options_.rank, " holds rank ", owner, "'s copy of step ", step,
                       " without its own snapshot of that step to complete it"));
    }
    if (absl::Status s = copy->FillBorrowed(*own); !s.ok()) return s;
  }
  return std::shared_ptr<const Snapshot>(std::move(copy));
}

absl::Status SnapshotKeeper::SendCopyTo(comm::Communicator& pair, int owner, int64_t step) {
  SnapshotTransferOptions transfer;
  transfer.chunk_bytes = options_.chunk_bytes;
  transfer.tag = kRestoreCopyTag;
  absl::StatusOr<std::shared_ptr<const Snapshot>> copy = WardCopy(owner, step);
  if (!copy.ok()) {
    (void)SendSnapshot(pair, step, nullptr, transfer);  // tells the peer: none
    return copy.status();
  }
  return SendSnapshot(pair, step, copy->get(), transfer);
}

SnapshotProgress SnapshotKeeper::Holdings() const {
  SnapshotProgress out;
  out.own_steps = own_.Steps();
  out.snapshot_bytes = own_.newest_bytes();
  {
    std::lock_guard<std::mutex> lock(ward_mu_);
    out.ward_rank = ward_rank_;
    // A copy with borrowed pieces counts only beside this rank's own
    // snapshot of its step, which completes it.
    for (int64_t step : ward_.Steps()) {
      std::shared_ptr<const Snapshot> copy = ward_.Find(step);
      if (copy != nullptr && (copy->borrowed().empty() || own_.Find(step) != nullptr)) {
        out.ward_steps.push_back(step);
      }
    }
  }
  if (out.ward_steps.empty()) out.ward_rank = -1;
  if (copier_ != nullptr) {
    const SnapshotCopier::SendResult sent = copier_->last_send();
    if (sent.status.ok() && sent.step >= 0) {
      out.copy_seconds = sent.stats.seconds;
      out.copy_bytes = sent.stats.bytes;
    }
  }
  return out;
}

}  // namespace loom::engine
