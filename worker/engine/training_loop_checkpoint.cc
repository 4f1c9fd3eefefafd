// The training loop's checkpoints, one path for every layout: the state this
// rank holds is a list of pieces (a parameter or AdamW moment, or ZeRO's
// range of one, each with its place in the global tensor; an EP rank's routed
// experts under their global names); the ranks that hold a unique piece
// write it (ParallelContext::writes_shards) and one rank commits the step
// (checkpoint/distributed_save.h); loading copies each piece out of whatever
// shards the step holds, saved under any layout.
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/checkpoint/collective_restore.h"
#include "worker/engine/checkpoint/distributed_save.h"
#include "worker/engine/checkpoint/resume_state.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/expert_parallel/ep_gradients.h"
#include "worker/engine/model/moe_stats.h"
#include "worker/engine/state_piece.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

constexpr char kExpAvg[] = "optimizer.exp_avg.";
constexpr char kExpAvgSq[] = "optimizer.exp_avg_sq.";

// The global rectangles of elements [begin, begin + count) of the local
// tensor `local` (a TP shard or a whole tensor), in local order.
std::vector<RectSlice> GlobalRects(const TensorView& local, int64_t begin, int64_t count) {
  return ShardRangeToGlobalSlices(local.shape, local.shard_axis, local.shard_offset, begin, count);
}

}  // namespace

std::vector<StatePiece> TrainingLoop::CheckpointPieces() {
  std::vector<StatePiece> out;
  std::map<std::string, TensorView> moments;  // the unsharded optimizer's
  if (optimizer_) {
    for (TensorView& m : optimizer_->States()) moments[m.name] = std::move(m);
  }
  const std::vector<LlamaModel*> parts = Parts();
  for (size_t i = 0; i < parts.size(); ++i) {
    LlamaModel* part = parts[i];
    const int64_t part_index = static_cast<int64_t>(i);
    const bool has_embedding = part->part().embedding;
    auto writes = [&](const TensorView& p, bool dp_sharded) {
      // A tied head's copy of the embedding: the embedding's holder writes it.
      if (p.name == kTiedEmbedding && !has_embedding) return false;
      // [ep] A routed expert is this EP rank's alone (its global name).
      return ctx_.writes_shards(dp_sharded, p.replicas, IsExpertParameter(p.name));
    };
    const std::vector<TensorView> params = part->Parameters();
    DataParallelEngine* engine = i < dp_engines_.size() ? dp_engines_[i].get() : nullptr;
    if (engine == nullptr || engine->zero_stage() == 0) {
      for (const TensorView& p : params) {
        const bool w = writes(p, false);
        out.push_back({p, p.name, 0, p.numel(), p.data, w, part_index});
        for (const char* prefix : {kExpAvg, kExpAvgSq}) {
          const TensorView& m = moments.at(prefix + p.name);
          out.push_back({p, m.name, 0, p.numel(), m.data, w, part_index});
        }
      }
      continue;
    }
    // ZeRO: the moments (and at stage 3 the parameters) are this DP rank's
    // flat ranges; below stage 3 the parameters are whole on every DP rank.
    const FlatPartition& partition = engine->partition();
    ShardedAdamW* opt = engine->sharded_optimizer();
    for (const OwnedPiece& o : engine->owned_pieces()) {
      const TensorView& p = params[static_cast<size_t>(o.tensor)];
      const int64_t begin = o.flat_begin - partition.tensors()[static_cast<size_t>(o.tensor)].offset;
      const bool w = writes(p, true);
      if (engine->zero_stage() == 3) {
        out.push_back({p, p.name, begin, o.count, engine->parameter_shard() + o.shard_offset, w,
                       part_index});
      }
      out.push_back({p, kExpAvg + p.name, begin, o.count, opt->exp_avg() + o.shard_offset, w,
                     part_index});
      out.push_back({p, kExpAvgSq + p.name, begin, o.count, opt->exp_avg_sq() + o.shard_offset, w,
                     part_index});
    }
    if (engine->zero_stage() < 3) {
      for (const TensorView& p : params) {
        out.push_back({p, p.name, 0, p.numel(), p.data, writes(p, false), part_index});
      }
    }
  }
  return out;
}

absl::StatusOr<std::string> TrainingLoop::SaveCheckpoint(const std::string& root) {
  Phase("checkpoint");
  CheckpointContent content;
  content.step = step_;
  content.model = spec_.model;
  content.state = ResumeState(spec_,
                              {.dp = ctx_.dp_size, .tp = ctx_.tp_size(), .pp = ctx_.pp_size(),
                               .cp = ctx_.cp_size(), .ep = ctx_.ep_size(), .zero_stage = zero_stage()},
                              {.step = step_, .tokens = tokens_, .optimizer_step = optimizer_step()});
  if (spec_.model.moe.enabled()) {  // [moe] the selection biases are state, not parameters
    absl::StatusOr<nlohmann::json> biases = ExpertBiasesToJson(Parts(), ctx_.pp);
    if (!biases.ok()) return biases.status();
    content.state["moe_bias"] = *std::move(biases);
  }
  CheckpointFile model{"", "model", {}, {}}, optimizer{"", "optimizer", {}, {}};
  // The writer reads host memory: a device backend's pieces are copied down.
  std::vector<std::vector<float>> host;
  for (const StatePiece& piece : CheckpointPieces()) {
    if (!piece.write) continue;
    const float* src = piece.data;
    if (!HostAddressable(*ops_)) {
      std::vector<float>& copy = host.emplace_back(static_cast<size_t>(piece.count));
      ops_->CopyDeviceToHost(copy.data(), piece.data,
                             piece.count * static_cast<int64_t>(sizeof(float)));
      src = copy.data();
    }
    CheckpointFile& file = piece.name.rfind("optimizer.", 0) == 0 ? optimizer : model;
    for (const RectSlice& r : GlobalRects(piece.local, piece.begin, piece.count)) {
      file.tensors.push_back({absl::StrCat(piece.name, "@", absl::StrJoin(r.offset, ",")), r.shape,
                              const_cast<float*>(src) + (r.flat_begin - piece.begin)});
      file.slices.push_back({piece.name, piece.local.GlobalShape(), r.offset});
    }
  }
  content.files = {std::move(model), std::move(optimizer)};
  return SaveDistributedStep(*ops_, ctx_.MeshGroups(), root, content, spec_.checkpoint.keep,
                             commit_gate_);
}

absl::StatusOr<LoadedCheckpoint> TrainingLoop::RestoreNewest(const std::string& root) {
  // The loader writes host memory; on a device backend the pieces go up only
  // once a step has loaded completely (a refused step leaves them untouched).
  const std::vector<StatePiece> pieces = CheckpointPieces();
  const bool staged = !HostAddressable(*ops_);
  std::vector<std::vector<float>> host(staged ? pieces.size() : 0);
  std::vector<CheckpointRect> into;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StatePiece& piece = pieces[i];
    float* base = piece.data;
    if (staged) {
      host[i].assign(static_cast<size_t>(piece.count), 0.0f);
      base = host[i].data();
    }
    for (const RectSlice& r : GlobalRects(piece.local, piece.begin, piece.count)) {
      into.push_back({piece.name, piece.local.GlobalShape(), r.offset, r.shape,
                      base + (r.flat_begin - piece.begin)});
    }
  }
  // Each rank reads only the files its pieces need; the ranks agree on the
  // step (collective_restore.h), so a corrupt file refuses it everywhere.
  absl::StatusOr<LoadedCheckpoint> loaded =
      RestoreNewestOnMesh(*ops_, ctx_.MeshGroups(), root, spec_.model, into);
  if (!loaded.ok()) return loaded.status();
  for (size_t i = 0; staged && i < pieces.size(); ++i) {
    ops_->CopyHostToDevice(pieces[i].data, host[i].data(),
                           pieces[i].count * static_cast<int64_t>(sizeof(float)));
  }
  const nlohmann::json& state = loaded->state;
  auto get_int = [&state](const char* key, int64_t fallback) {
    return state.contains(key) && state[key].is_number_integer() ? state[key].get<int64_t>()
                                                                  : fallback;
  };
  step_ = loaded->step;
  tokens_ = get_int("tokens", step_ * spec_.train.global_batch_size * spec_.train.seq_len);
  set_optimizer_step(get_int("optimizer_step", step_));
  if (spec_.model.moe.enabled() && state.contains("moe_bias")) {  // [moe] each part its layers'
    if (absl::Status s = RestoreExpertBiases(state["moe_bias"], Parts()); !s.ok()) return s;
  }
  return loaded;
}

}  // namespace loom::engine
