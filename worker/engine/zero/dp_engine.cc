#include "worker/engine/zero/dp_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/engine/memory/release.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/grad_clip.h"

namespace loom::engine {
namespace {

constexpr int64_t kF = static_cast<int64_t>(sizeof(float));

// The views must tile one array in order; returns the flat tensors.
absl::StatusOr<std::vector<FlatTensor>> FlatLayout(const std::vector<TensorView>& views,
                                                   int64_t layers, const char* what) {
  std::vector<FlatTensor> out;
  if (views.empty()) return out;
  const float* base = views[0].data;
  int64_t offset = 0;
  for (const TensorView& v : views) {
    if (v.data != base + offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data-parallel engine: the model's ", what, " are not one contiguous array (", v.name,
          " is not where the previous tensor ends)"));
    }
    out.push_back({v.name, v.shape, offset, v.numel(), UnitOfParameter(v.name, layers)});
    offset += v.numel();
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataParallelEngine>> DataParallelEngine::Create(
    LlamaModel* model, comm::Communicator* comm, const DataParallelOptions& options,
    const spec::TrainSpec& train, MemoryTracker* memory) {
  if (options.zero_stage < 0 || options.zero_stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.zero_stage=", options.zero_stage,
                                                   " must be 0, 1, 2 or 3"));
  }
  if (comm == nullptr || comm->size() < 2) {
    return absl::InvalidArgumentError("data-parallel engine: needs a DP group of two or more ranks");
  }
  const int64_t layers = model->config().num_layers;
  const std::vector<TensorView> params = model->Parameters();
  absl::StatusOr<std::vector<FlatTensor>> flat = FlatLayout(params, layers, "parameters");
  if (!flat.ok()) return flat.status();
  if (absl::StatusOr<std::vector<FlatTensor>> g = FlatLayout(model->Gradients(), layers, "gradients");
      !g.ok()) {
    return g.status();
  }
  PartitionOptions po;
  po.ranks = comm->size();
  po.bucket_floats = std::max<int64_t>(1, options.bucket_bytes / kF);
  po.split_at_units = options.zero_stage >= 2;
  absl::StatusOr<FlatPartition> partition =
      FlatPartition::Build(std::move(*flat), LlamaModel::NumUnits(model->config()), po);
  if (!partition.ok()) return partition.status();
  std::unique_ptr<DataParallelEngine> e(new DataParallelEngine(
      model, comm, options.zero_stage, std::move(*partition), memory));
  const int64_t total = e->partition_.total();
  const int64_t shard = e->partition_.shard_size();
  e->params_ = params.empty() ? nullptr : params[0].data;
  e->grads_ = params.empty() ? nullptr : model->Gradients()[0].data;
  // The model has allocated (and written) both flat arrays.
  memory->Add(MemoryKind::kParameters, total * kF);
  memory->Add(MemoryKind::kGradients, total * kF);
  if (e->stage_ >= 1) {
    e->optimizer_ = std::make_unique<ShardedAdamW>(shard, train);
    memory->Add(MemoryKind::kOptimizerStates, 2 * shard * kF);
  }
  if (e->stage_ >= 2) {
    e->grad_shard_.assign(static_cast<size_t>(shard), 0.0f);
    memory->Add(MemoryKind::kGradients, shard * kF);
    ReleaseToZero(model->ops(), e->grads_, total);
    memory->Sub(MemoryKind::kGradients, total * kF);
  }
  if (e->stage_ == 3) {
    e->param_shard_.assign(static_cast<size_t>(shard), 0.0f);
    memory->Add(MemoryKind::kParameters, shard * kF);
  }
  for (const OwnedPiece& p : e->owned_) {
    const FlatTensor& t = e->partition_.tensors()[p.tensor];
    AdamWPiece a;
    a.param = e->stage_ == 3 ? e->param_shard_.data() + p.shard_offset : e->params_ + p.flat_begin;
    a.grad = e->stage_ >= 2 ? e->grad_shard_.data() + p.shard_offset : e->grads_ + p.flat_begin;
    a.count = p.count;
    a.state_offset = p.shard_offset;
    a.decay = t.shape.size() >= 2;  // as AdamW::DecaysWeight
    e->pieces_.push_back(a);
  }
  const int64_t units = LlamaModel::NumUnits(model->config());
  e->unit_buckets_.assign(units, {});
  for (int64_t u = 0; u < units; ++u) {
    e->unit_buckets_[u] = e->partition_.BucketsInUnit(u);
    if (e->tied_ && u == units - 1) {
      for (int b : e->partition_.BucketsInUnit(0)) e->unit_buckets_[u].push_back(b);
    }
  }
  e->held_.assign(units, false);
  e->reducing_.assign(units, {});
  e->holders_.assign(e->partition_.buckets().size(), 0);
  e->gathering_.assign(e->partition_.buckets().size(), nullptr);
  e->grad_live_.assign(e->partition_.buckets().size(), 0);
  model->SetHooks(e.get());
  return e;
}

DataParallelEngine::DataParallelEngine(LlamaModel* model, comm::Communicator* comm, int stage,
                                       FlatPartition partition, MemoryTracker* memory)
    : model_(model),
      comm_(comm),
      stage_(stage),
      ranks_(comm->size()),
      rank_(comm->rank()),
      layers_(model->config().num_layers),
      tied_(model->config().tie_embeddings),
      partition_(std::move(partition)),
      memory_(memory) {
  owned_ = partition_.OwnedPieces(rank_);
}

DataParallelEngine::~DataParallelEngine() {
  model_->SetHooks(nullptr);
  for (auto& w : pending_all_reduce_) w->Wait().IgnoreError();
  worker_.Drain().IgnoreError();
}

void DataParallelEngine::Note(const absl::Status& s) {
  if (!s.ok() && status_.ok()) status_ = s;
}

void DataParallelEngine::ShardParameters() {
  if (stage_ != 3) return;
  for (const FlatBucket& b : partition_.buckets()) {
    const int64_t lo = partition_.OwnedBegin(b, rank_), hi = partition_.OwnedEnd(b, rank_);
    std::fill_n(param_shard_.data() + b.shard_offset, b.chunk, 0.0f);
    if (hi > lo) std::memcpy(param_shard_.data() + b.shard_offset, params_ + lo, (hi - lo) * kF);
    ReleaseToZero(model_->ops(), params_ + b.begin, b.size());
  }
  memory_->Sub(MemoryKind::kParameters, partition_.total() * kF);
}

void DataParallelEngine::BeginStep() {
  status_ = absl::OkStatus();
  if (stage_ <= 1) {
    model_->ZeroGradients();
  } else {
    std::fill(grad_shard_.begin(), grad_shard_.end(), 0.0f);
  }
}

void DataParallelEngine::BeginMicroBatch(bool last) {
  training_pass_ = true;
  last_micro_ = last;
}

absl::Status DataParallelEngine::EndMicroBatch() {
  training_pass_ = false;
  if (stage_ >= 2) {
    Note(worker_.Drain());
    for (auto& handles : reducing_) handles.clear();
  }
  return status_;
}

CommWorker::Handle DataParallelEngine::SubmitGather(int b, const float* src, int64_t src_count,
                                                    float* dst) {
  return worker_.Submit([this, b, src, src_count, dst]() -> absl::Status {
    const FlatBucket& k = partition_.buckets()[b];
    const int64_t padded = k.chunk * ranks_;
    std::vector<float> in(static_cast<size_t>(k.chunk), 0.0f);
    if (src_count > 0) std::memcpy(in.data(), src, src_count * kF);
    int64_t staged = k.chunk;
    std::vector<float> out;
    std::span<float> out_span(dst, static_cast<size_t>(k.size()));
    if (padded != k.size()) {
      out.assign(static_cast<size_t>(padded), 0.0f);
      out_span = std::span<float>(out);
      staged += padded;
    }
    memory_->Add(MemoryKind::kCommBuffers, staged * kF);
    absl::Status s = comm_->AllGather(in, out_span);
    if (s.ok() && !out.empty()) std::memcpy(dst, out.data(), k.size() * kF);
    memory_->Sub(MemoryKind::kCommBuffers, staged * kF);
    return s;
  });
}

CommWorker::Handle DataParallelEngine::SubmitReduceScatter(int b) {
  return worker_.Submit([this, b]() -> absl::Status {
    const FlatBucket& k = partition_.buckets()[b];
    const int64_t padded = k.chunk * ranks_;
    std::vector<float> in;
    std::span<const float> in_span(grads_ + k.begin, static_cast<size_t>(k.size()));
    int64_t staged = k.chunk;
    if (padded != k.size()) {
      in.assign(static_cast<size_t>(padded), 0.0f);
      std::memcpy(in.data(), grads_ + k.begin, k.size() * kF);
      in_span = std::span<const float>(in);
      staged += padded;
    }
    std::vector<float> out(static_cast<size_t>(k.chunk));
    memory_->Add(MemoryKind::kCommBuffers, staged * kF);
    absl::Status s = comm_->ReduceScatter(in_span, std::span<float>(out));
    if (s.ok()) {
      float* acc = grad_shard_.data() + k.shard_offset;
      for (int64_t i = 0; i < k.chunk; ++i) acc[i] += out[static_cast<size_t>(i)];
    }
    // The bucket's gradient is now in the shard: free it, which also zeroes
    // it for the next micro-batch's accumulation.
    ReleaseToZero(model_->ops(), grads_ + k.begin, k.size());
    {
      std::lock_guard<std::mutex> lock(live_mu_);
      if (grad_live_[b]) {
        grad_live_[b] = 0;
        memory_->Sub(MemoryKind::kGradients, k.size() * kF);
      }
    }
    memory_->Sub(MemoryKind::kCommBuffers, staged * kF);
    return s;
  });
}

void DataParallelEngine::Acquire(int64_t unit, bool wait) {
  if (!held_[unit]) {
    held_[unit] = true;
    for (int b : unit_buckets_[unit]) {
      if (holders_[b]++ > 0) continue;
      const FlatBucket& k = partition_.buckets()[b];
      memory_->Add(MemoryKind::kParameters, k.size() * kF);
      gathering_[b] = SubmitGather(b, param_shard_.data() + k.shard_offset, k.chunk,
                                   params_ + k.begin);
    }
  }
  if (!wait) return;
  for (int b : unit_buckets_[unit]) {
    if (gathering_[b]) {
      Note(worker_.Wait(gathering_[b]));
      gathering_[b] = nullptr;
    }
  }
}

void DataParallelEngine::Release(int64_t unit) {
  if (!held_[unit]) return;
  held_[unit] = false;
  for (int b : unit_buckets_[unit]) {
    if (--holders_[b] > 0) continue;
    if (gathering_[b]) {
      Note(worker_.Wait(gathering_[b]));
      gathering_[b] = nullptr;
    }
    const FlatBucket& k = partition_.buckets()[b];
    ReleaseToZero(model_->ops(), params_ + k.begin, k.size());
    memory_->Sub(MemoryKind::kParameters, k.size() * kF);
  }
}

void DataParallelEngine::MarkGradientsLive(int64_t unit) {
  std::lock_guard<std::mutex> lock(live_mu_);
  for (int b : partition_.BucketsInUnit(unit)) {
    if (grad_live_[b]) continue;
    grad_live_[b] = 1;
    memory_->Add(MemoryKind::kGradients, partition_.buckets()[b].size() * kF);
  }
}

void DataParallelEngine::BeforeUse(int64_t unit, bool backward) {
  if (unit == 0 && !backward) {
    memory_->Set(MemoryKind::kActivations, model_->ActivationBytes());
  }
  const int64_t head = layers_ + 1;
  if (stage_ >= 2 && backward && training_pass_) {
    MarkGradientsLive(unit);
    if (unit == head && tied_) MarkGradientsLive(0);  // lm_head's gradient is embed's
  }
  if (stage_ != 3) return;
  Acquire(unit, /*wait=*/true);
  const int64_t next = backward ? unit - 1 : unit + 1;
  if (backward ? next >= 1 : next <= head) Acquire(next, /*wait=*/false);
}

void DataParallelEngine::AfterUse(int64_t unit, bool backward) {
  const int64_t head = layers_ + 1;
  // The embedding's backward comes right after the lowest unit that backward reads.
  if (stage_ >= 2 && backward && training_pass_ && unit == (layers_ > 0 ? 1 : head)) {
    MarkGradientsLive(0);
  }
  if (stage_ != 3) return;
  if (!backward && training_pass_ && unit == head) return;  // backward starts with it
  Release(unit);
}

void DataParallelEngine::GradientsReady(int64_t unit) {
  const bool reduce = stage_ >= 2 ? training_pass_ : training_pass_ && last_micro_;
  if (!reduce) return;
  model_->ops().Synchronize();
  for (int b : partition_.BucketsReadyAt(unit)) {
    const FlatBucket& k = partition_.buckets()[b];
    if (stage_ <= 1) {
      pending_all_reduce_.push_back(comm_->AllReduceAsync(
          std::span<float>(grads_ + k.begin, static_cast<size_t>(k.size())), comm::ReduceOp::kSum));
    } else {
      reducing_[unit].push_back(SubmitReduceScatter(b));
    }
  }
  if (stage_ >= 2 && unit + kReduceWindow < static_cast<int64_t>(reducing_.size())) {
    for (const CommWorker::Handle& h : reducing_[unit + kReduceWindow]) Note(worker_.Wait(h));
    reducing_[unit + kReduceWindow].clear();
  }
}

absl::StatusOr<double> DataParallelEngine::ReduceAndClip(float* loss, double max_norm) {
  for (auto& w : pending_all_reduce_) Note(w->Wait());
  pending_all_reduce_.clear();
  Note(worker_.Drain());
  if (!status_.ok()) return status_;
  double norm = 0.0;
  if (stage_ <= 1) {
    if (absl::Status s = comm_->AllReduce(std::span<float>(loss, 1)); !s.ok()) return s;
    const std::vector<TensorView> grads = model_->Gradients();
    if (stage_ == 0) return ClipByGlobalNorm(grads, max_norm);
    norm = GlobalNorm(grads);
  } else {
    double sum = 0.0;
    for (const AdamWPiece& p : pieces_) {
      double partial = 0.0;
      for (int64_t i = 0; i < p.count; ++i) partial += static_cast<double>(p.grad[i]) * p.grad[i];
      sum += partial;
    }
    float both[2] = {*loss, static_cast<float>(sum)};
    if (absl::Status s = comm_->AllReduce(std::span<float>(both, 2)); !s.ok()) return s;
    *loss = both[0];
    norm = std::sqrt(static_cast<double>(both[1]));
  }
  if (max_norm > 0.0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (const AdamWPiece& p : pieces_) {
      float* g = const_cast<float*>(p.grad);
      for (int64_t i = 0; i < p.count; ++i) g[i] *= scale;
    }
  }
  return norm;
}

absl::Status DataParallelEngine::OptimizerStep(double lr) {
  if (stage_ == 0) return absl::FailedPreconditionError("stage 0 updates with the caller's AdamW");
  optimizer_->Step(pieces_, lr);
  if (stage_ == 3) return absl::OkStatus();  // parameters stay sharded
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t lo = partition_.OwnedBegin(buckets[b], rank_);
    const int64_t hi = partition_.OwnedEnd(buckets[b], rank_);
    SubmitGather(static_cast<int>(b), params_ + lo, hi - lo, params_ + buckets[b].begin);
  }
  return worker_.Drain();
}

absl::Status DataParallelEngine::GatherParameters(std::vector<float>* out) {
  out->assign(static_cast<size_t>(partition_.total()), 0.0f);
  if (stage_ != 3) {
    std::memcpy(out->data(), params_, partition_.total() * kF);
    return absl::OkStatus();
  }
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    SubmitGather(static_cast<int>(b), param_shard_.data() + buckets[b].shard_offset,
                 buckets[b].chunk, out->data() + buckets[b].begin);
  }
  return worker_.Drain();
}

}  // namespace loom::engine
