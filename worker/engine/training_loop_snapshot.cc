// The training loop's in-memory snapshots (in-place recovery,
// docs/fault_tolerance.md): every piece of state this rank holds, from the
// list checkpoints use (CheckpointPieces) but with the replicated pieces a
// checkpoint leaves to another rank, plus the MoE layers' selection biases
// and the step counters. The data position and every random stream are
// functions of the step: the sampler draws step t's windows from (seed, t),
// the parameter init from the seed alone, and nothing else in a step draws
// random numbers; what else lives across steps is either rebuilt by a new
// loop (ZeRO-3's gathered units, the pipeline's buffers, gradients, which each
// step zeroes) or, like the MoE statistics, started afresh by every step.
#include <cstring>

#include "absl/strings/str_format.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/state_piece.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

constexpr char kMoeBiasPrefix[] = "moe_bias.";

}  // namespace

SnapshotManifest TrainingLoop::SnapshotLayoutAndSources(int rank,
                                                        std::vector<SnapshotSource>* sources) {
  SnapshotManifest m;
  const spec::ParallelismSpec& par = spec_.parallelism;
  m.owner.rank = rank;
  m.owner.layout = absl::StrFormat("dp%d tp%d pp%d cp%d ep%d zero%d v%d %s%s", ctx_.dp_size,
                                   ctx_.tp_size(), ctx_.pp_size(), ctx_.cp_size(), ctx_.ep_size(),
                                   zero_stage(), ctx_.pp_size() > 1 ? par.virtual_stages : 1,
                                   ctx_.pp_size() > 1 ? spec::ScheduleName(par.schedule) : "-",
                                   ctx_.tp != nullptr && par.sequence_parallel ? " sp" : "");
  m.owner.place =
      absl::StrFormat("dp %d/%d tp %d/%d pp %d/%d cp %d/%d ep %d/%d", ctx_.dp_rank, ctx_.dp_size,
                      ctx_.tp_rank(), ctx_.tp_size(), ctx_.stage(), ctx_.pp_size(), ctx_.cp_rank(),
                      ctx_.cp_size(), ctx_.ep_rank(), ctx_.ep_size());
  m.step = step_;
  m.tokens = tokens_;
  m.optimizer_step = optimizer_step();
  sources->clear();
  for (const StatePiece& p : CheckpointPieces()) {
    m.pieces.push_back({p.name, p.part, p.local.shape, p.local.GlobalShape(), p.local.shard_axis,
                        p.local.shard_offset, p.begin, p.count, 0, p.write});
    sources->push_back({p.data, false});
  }
  const std::vector<LlamaModel*> parts = Parts();
  for (size_t i = 0; i < parts.size(); ++i) {  // [moe] state, not parameters; host memory
    for (const TensorView& b : parts[i]->ExpertBiases()) {
      m.pieces.push_back({kMoeBiasPrefix + b.name, static_cast<int64_t>(i), b.shape, b.shape, -1, 0,
                          0, b.numel(), 0});
      sources->push_back({b.data, true});
    }
  }
  LayOutSnapshotPieces(&m);
  return m;
}

SnapshotManifest TrainingLoop::SnapshotLayout(int rank) {
  std::vector<SnapshotSource> sources;
  return SnapshotLayoutAndSources(rank, &sources);
}

absl::Status TrainingLoop::CaptureSnapshot(Snapshot* into, int rank) {
  Phase("snapshot");
  std::vector<SnapshotSource> sources;
  SnapshotManifest manifest = SnapshotLayoutAndSources(rank, &sources);
  into->Reset(std::move(manifest));
  float* out = into->data();
  const bool host_backend = HostAddressable(*ops_);
  const std::vector<SnapshotPiece>& pieces = into->manifest().pieces;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t bytes = pieces[i].count * static_cast<int64_t>(sizeof(float));
    if (bytes == 0) continue;
    if (sources[i].host || host_backend) {
      std::memcpy(out + pieces[i].offset, sources[i].data, static_cast<size_t>(bytes));
    } else {
      ops_->CopyDeviceToHost(out + pieces[i].offset, sources[i].data, bytes);
    }
  }
  Phase("running");
  return absl::OkStatus();
}

absl::Status TrainingLoop::RestoreSnapshot(const Snapshot& from, int rank) {
  if (from.empty()) return absl::FailedPreconditionError("snapshot: nothing to restore (empty)");
  std::vector<SnapshotSource> sources;
  const SnapshotManifest want = SnapshotLayoutAndSources(rank, &sources);
  if (absl::Status s = CheckSnapshotFits(want, from.manifest()); !s.ok()) return s;
  const bool host_backend = HostAddressable(*ops_);
  const float* in = from.data();
  for (size_t i = 0; i < want.pieces.size(); ++i) {
    const SnapshotPiece& p = want.pieces[i];
    const int64_t bytes = p.count * static_cast<int64_t>(sizeof(float));
    if (bytes == 0) continue;
    if (sources[i].host || host_backend) {
      std::memcpy(sources[i].data, in + p.offset, static_cast<size_t>(bytes));
    } else {
      ops_->CopyHostToDevice(sources[i].data, in + p.offset, bytes);
    }
  }
  step_ = from.manifest().step;
  tokens_ = from.manifest().tokens;
  set_optimizer_step(from.manifest().optimizer_step);
  // [moe] A step cut short leaves its routing counts behind; every step
  // starts from none.
  for (LlamaModel* part : Parts()) part->TakeMoeStats();
  return absl::OkStatus();
}

}  // namespace loom::engine
