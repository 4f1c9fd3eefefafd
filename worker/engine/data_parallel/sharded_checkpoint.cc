#include "worker/engine/data_parallel/sharded_checkpoint.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/model/host_floats.h"

namespace loom::engine {
namespace {

constexpr int kSlots = 2;           // files per rank at most
constexpr int kIntsPerSlot = kDigestInts;  // one encoded FileDigest (checkpoint_writer.h)

std::string ShardFileName(const char* kind, int rank) {
  return absl::StrFormat("%s-tp00-pp00-dp%02d.safetensors", kind, rank);
}

// Host copies of this rank's shards for the writer (the originals on a host
// backend): the parameter shard (stage 3), the whole parameters (stages 1, 2,
// rank 0 only) and the moments.
struct HostShards {
  std::vector<TensorView> params;
  float* param_shard = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  std::unique_ptr<HostStaging> params_staging;
  std::vector<std::vector<float>> storage;
};

float* HostCopy(kernels::Ops& ops, float* data, int64_t count, HostShards* shards) {
  if (HostAddressable(ops) || data == nullptr) return data;
  std::vector<float>& copy = shards->storage.emplace_back(static_cast<size_t>(count));
  ops.CopyDeviceToHost(copy.data(), data, count * static_cast<int64_t>(sizeof(float)));
  return copy.data();
}

std::unique_ptr<HostShards> StageOwnShards(LlamaModel& model, DataParallelEngine& engine,
                                           int rank) {
  auto shards = std::make_unique<HostShards>();
  kernels::Ops& ops = model.ops();
  const int64_t n = engine.partition().shard_size();
  if (engine.zero_stage() == 3) {
    shards->param_shard = HostCopy(ops, engine.parameter_shard(), n, shards.get());
  } else if (rank == 0) {
    shards->params_staging =
        std::make_unique<HostStaging>(ops, model.Parameters(), /*download=*/true);
    shards->params = shards->params_staging->host();
  }
  ShardedAdamW* opt = engine.sharded_optimizer();
  shards->exp_avg = HostCopy(ops, opt->exp_avg(), n, shards.get());
  shards->exp_avg_sq = HostCopy(ops, opt->exp_avg_sq(), n, shards.get());
  return shards;
}

// The files rank `rank` writes. Data pointers (host memory) are set only for
// this rank's own files (`own` non-null); other ranks' files are described
// for the index.
std::vector<CheckpointFile> RankFiles(LlamaModel& model, DataParallelEngine& engine, int rank,
                                      const HostShards* own) {
  const FlatPartition& part = engine.partition();
  const std::vector<OwnedPiece> pieces = part.OwnedPieces(rank);
  auto sharded = [&](const std::string& file, const std::string& group, const std::string& prefix,
                     float* base) {
    CheckpointFile f{file, group, {}, {}};
    for (const OwnedPiece& p : pieces) {
      const FlatTensor& t = part.tensors()[p.tensor];
      const int64_t local = p.flat_begin - t.offset;
      for (const RectSlice& s : FlatRangeToSlices(t.shape, local, p.count)) {
        const std::string global = prefix + t.name;
        float* data = own != nullptr ? base + p.shard_offset + (s.flat_begin - local) : nullptr;
        f.tensors.push_back({absl::StrCat(global, "@", absl::StrJoin(s.offset, ",")), s.shape, data});
        f.slices.push_back({global, t.shape, s.offset});
      }
    }
    return f;
  };
  std::vector<CheckpointFile> files;
  if (engine.zero_stage() == 3) {
    files.push_back(sharded(ShardFileName("model", rank), "model", "",
                            own != nullptr ? own->param_shard : nullptr));
  } else if (rank == 0) {
    // Rank 0 writes whole tensors; the index needs only their names and shapes.
    std::vector<TensorView> params = own != nullptr ? own->params : model.Parameters();
    files.push_back({"model-tp00-pp00.safetensors", "model", std::move(params), {}});
  }
  CheckpointFile m = sharded(ShardFileName("optimizer", rank), "optimizer", "optimizer.exp_avg.",
                             own != nullptr ? own->exp_avg : nullptr);
  CheckpointFile v = sharded("", "", "optimizer.exp_avg_sq.",
                             own != nullptr ? own->exp_avg_sq : nullptr);
  for (size_t i = 0; i < v.tensors.size(); ++i) {
    m.tensors.push_back(v.tensors[i]);
    m.slices.push_back(v.slices[i]);
  }
  files.push_back(std::move(m));
  return files;
}

}  // namespace

absl::StatusOr<std::string> SaveShardedCheckpoint(const std::string& root,
                                                  const CheckpointContent& content,
                                                  LlamaModel& model, DataParallelEngine& engine,
                                                  comm::Communicator& comm, int64_t keep) {
  const int rank = comm.rank(), ranks = comm.size();
  for (const TensorView& t : model.Parameters()) {
    if (t.sharded() || t.replicas != 1) {
      // DP shards of TP slices would need the TP coordinates in the files and
      // index; TrainingLoop saves ZeRO under TP as global tensors instead.
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint: DP-sharded files hold whole tensors only (", t.name,
          " is a TP shard); save ZeRO under TP through TrainingLoop::SaveCheckpoint"));
    }
  }
  // 1. Rank 0 opens the temporary directory and tells everyone its name.
  absl::StatusOr<std::string> begun = std::string();
  int32_t header[2] = {0, 0};  // started, pid
  if (rank == 0) {
    begun = BeginCheckpointStep(root, content.step, ::getpid());
    header[0] = begun.ok() ? 1 : 0;
    header[1] = static_cast<int32_t>(::getpid());
  }
  kernels::Ops& ops = model.ops();
  if (absl::Status s = BroadcastHostInts(ops, &comm, header, 2, 0); !s.ok()) {
    return s;
  }
  if (header[0] != 1) {
    if (rank == 0) return begun.status();
    return absl::InternalError(absl::StrCat("DP rank 0 could not start the checkpoint of step ",
                                            content.step, " under ", root));
  }
  const std::string tmp =
      CheckpointTempDir(root, content.step, static_cast<int64_t>(header[1]));

  // 2. Every rank writes its files; the digests travel to rank 0.
  std::vector<int32_t> mine_digests(static_cast<size_t>(kSlots * kIntsPerSlot), 0);
  absl::Status write_status;
  // The writer reads host memory: a device backend's shards are copied down.
  const std::unique_ptr<HostShards> own = StageOwnShards(model, engine, rank);
  const std::vector<CheckpointFile> mine = RankFiles(model, engine, rank, own.get());
  for (size_t i = 0; i < mine.size() && write_status.ok(); ++i) {
    absl::StatusOr<FileDigest> d = WriteCheckpointFile(tmp, mine[i]);
    if (!d.ok()) {
      write_status = d.status();
      break;
    }
    EncodeFileDigest(*d, &mine_digests[i * kIntsPerSlot]);
  }
  std::vector<int32_t> digests(static_cast<size_t>(ranks) * mine_digests.size(), 0);
  if (absl::Status s = AllGatherHostInts(ops, &comm, mine_digests.data(),
                                         static_cast<int64_t>(mine_digests.size()), digests.data());
      !s.ok()) {
    return s;
  }

  // 3. Rank 0 commits when every file arrived, and tells everyone.
  absl::StatusOr<std::string> committed = std::string();
  int32_t ok = 0;
  if (rank == 0) {
    CheckpointContent all = content;
    all.files.clear();
    std::vector<FileDigest> file_digests;
    std::vector<std::string> missing;
    for (int r = 0; r < ranks; ++r) {
      std::vector<CheckpointFile> files = RankFiles(model, engine, r, r == 0 ? own.get() : nullptr);
      for (size_t i = 0; i < files.size(); ++i) {
        const int32_t* slot = &digests[(r * kSlots + i) * kIntsPerSlot];
        if (slot[0] != 1) missing.push_back(files[i].name);
        file_digests.push_back(DecodeFileDigest(slot));
        all.files.push_back(std::move(files[i]));
      }
    }
    if (!missing.empty()) {
      committed = absl::InternalError(absl::StrCat(
          "checkpoint of step ", content.step, ": not every rank wrote its shard (",
          absl::StrJoin(missing, ", "), ")", write_status.ok() ? "" : ": " + write_status.ToString()));
    } else {
      committed = CommitCheckpointStep(root, tmp, all, file_digests, keep);
    }
    ok = committed.ok() ? 1 : 0;
  }
  if (absl::Status s = BroadcastHostInts(ops, &comm, &ok, 1, 0); !s.ok()) {
    return s;
  }
  if (rank == 0) return committed;
  if (!write_status.ok()) return write_status;
  if (ok != 1) {
    return absl::InternalError(absl::StrCat("DP rank 0 failed to commit the checkpoint of step ",
                                            content.step, " under ", root));
  }
  return std::string();
}

std::vector<FlatSlice> ShardedRestoreTargets(LlamaModel& model, DataParallelEngine& engine) {
  std::vector<FlatSlice> out;
  const FlatPartition& part = engine.partition();
  auto pieces = [&](const std::string& prefix, float* base) {
    for (const OwnedPiece& p : engine.owned_pieces()) {
      const FlatTensor& t = part.tensors()[p.tensor];
      out.push_back({prefix + t.name, t.shape, p.flat_begin - t.offset, p.count,
                     base + p.shard_offset});
    }
  };
  if (engine.zero_stage() == 3) {
    pieces("", engine.parameter_shard());
  } else {
    for (const TensorView& t : model.Parameters()) out.push_back({t.name, t.shape, 0, t.numel(), t.data});
  }
  pieces("optimizer.exp_avg.", engine.sharded_optimizer()->exp_avg());
  pieces("optimizer.exp_avg_sq.", engine.sharded_optimizer()->exp_avg_sq());
  return out;
}

RestoreStaging::RestoreStaging(kernels::Ops& ops, std::vector<FlatSlice> targets)
    : ops_(ops), device_(std::move(targets)) {
  if (HostAddressable(ops)) {
    host_ = device_;
    device_.clear();
    return;
  }
  storage_.reserve(device_.size());
  for (const FlatSlice& t : device_) {
    std::vector<float>& copy = storage_.emplace_back(static_cast<size_t>(t.count), 0.0f);
    FlatSlice h = t;
    h.data = copy.data();
    host_.push_back(std::move(h));
  }
}

void RestoreStaging::Upload() {
  for (size_t i = 0; i < device_.size(); ++i) {
    ops_.CopyHostToDevice(device_[i].data, host_[i].data,
                          device_[i].count * static_cast<int64_t>(sizeof(float)));
  }
}

}  // namespace loom::engine
