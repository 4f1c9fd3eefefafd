#include "worker/engine/data_parallel/dp_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/engine/memory/release.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/parallel/host_floats.h"

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
  int64_t unit = 0;
  for (const TensorView& v : views) {
    if (v.data != base + offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data-parallel engine: the model's ", what, " are not one contiguous array (", v.name,
          " is not where the previous tensor ends)"));
    }
    // [pp] A tied head's copy of the embedding (named as the embedding) sits
    // after the final norm and belongs to the head's unit: units never go back.
    unit = std::max(unit, UnitOfParameter(v.name, layers));
    out.push_back({v.name, v.shape, offset, v.numel(), unit});
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
    e->optimizer_ = std::make_unique<ShardedAdamW>(e->ops_, shard, train);
    memory->Add(MemoryKind::kOptimizerStates, 2 * shard * kF);
  }
  if (e->stage_ >= 2) {
    e->grad_shard_ = e->AllocateFloats(shard);
    e->ops_.Fill(e->grad_shard_.f32(), shard, 0.0f);
    memory->Add(MemoryKind::kGradients, shard * kF);
    ReleaseToZero(model->ops(), e->grads_, total);
    memory->Sub(MemoryKind::kGradients, total * kF);
  }
  if (e->stage_ == 3) {
    e->param_shard_ = e->AllocateFloats(shard);
    e->ops_.Fill(e->param_shard_.f32(), shard, 0.0f);
    memory->Add(MemoryKind::kParameters, shard * kF);
  }
  for (const TensorView& g : model->Gradients()) e->replicas_.push_back(g.replicas);
  for (const OwnedPiece& p : e->owned_) {
    const FlatTensor& t = e->partition_.tensors()[p.tensor];
    AdamWPiece a;
    a.param = e->stage_ == 3 ? e->param_shard_.f32() + p.shard_offset : e->params_ + p.flat_begin;
    a.grad = e->stage_ >= 2 ? e->grad_shard_.f32() + p.shard_offset : e->grads_ + p.flat_begin;
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
      ops_(model->ops()),
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
  // The staging buffers in pending_ outlive the tasks that use them.
  worker_.Drain().IgnoreError();
}


void DataParallelEngine::Note(const absl::Status& s) {
  if (!s.ok() && status_.ok()) status_ = s;
}

kernels::Buffer DataParallelEngine::AllocateFloats(int64_t count) {
  return ops_.Allocate(count * kF);
}

CommWorker::Handle DataParallelEngine::Post(std::function<absl::Status()> collective,
                                            PendingComm pending) {
  memory_->Add(MemoryKind::kCommBuffers, pending.comm_bytes);
  pending.handle = worker_.Submit(std::move(collective));
  CommWorker::Handle handle = pending.handle;
  pending_.push_back(std::move(pending));
  return handle;
}

void DataParallelEngine::Complete(const CommWorker::Handle& handle) {
  if (handle == nullptr) return;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->handle != handle) continue;
    PendingComm done = std::move(*it);
    pending_.erase(it);
    const absl::Status s = worker_.Wait(done.handle);
    Note(s);
    if (done.finish) done.finish(s.ok());
    memory_->Sub(MemoryKind::kCommBuffers, done.comm_bytes);
    return;  // done.buffers are freed here, after the collective
  }
}

void DataParallelEngine::CompleteAll() {
  while (!pending_.empty()) Complete(pending_.front().handle);
  Note(worker_.Drain());
}

void DataParallelEngine::ShardParameters() {
  if (stage_ != 3) return;
  for (const FlatBucket& b : partition_.buckets()) {
    const int64_t lo = partition_.OwnedBegin(b, rank_), hi = partition_.OwnedEnd(b, rank_);
    ops_.Fill(param_shard_.f32() + b.shard_offset, b.chunk, 0.0f);
    if (hi > lo) ops_.CopyDeviceToDevice(param_shard_.f32() + b.shard_offset, params_ + lo, (hi - lo) * kF);
    ReleaseToZero(ops_, params_ + b.begin, b.size());
  }
  memory_->Sub(MemoryKind::kParameters, partition_.total() * kF);
}

void DataParallelEngine::BeginStep() {
  status_ = absl::OkStatus();
  if (stage_ <= 1) {
    model_->ZeroGradients();
  } else {
    ops_.Fill(grad_shard_.f32(), partition_.shard_size(), 0.0f);
  }
}

void DataParallelEngine::BeginMicroBatch(bool last) {
  training_pass_ = true;
  last_micro_ = last;
}

absl::Status DataParallelEngine::EndMicroBatch() {
  training_pass_ = false;
  if (stage_ >= 2) {
    CompleteAll();
    for (auto& handles : reducing_) handles.clear();
  }
  return status_;
}

CommWorker::Handle DataParallelEngine::SubmitGather(int b, const float* src, int64_t src_count,
                                                    float* device_dst, float* host_dst) {
  const FlatBucket& k = partition_.buckets()[b];
  const int64_t padded = k.chunk * ranks_;
  PendingComm pending;
  // The input: this rank's chunk as is when it is whole and apart from the
  // output, else a zero-padded copy (stage 1 gathers from inside the output).
  const float* in = src;
  const auto at = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
  const bool inside_output = device_dst != nullptr && at(src) >= at(device_dst) &&
                             at(src) < at(device_dst + k.size());
  if (src_count != k.chunk || inside_output) {
    kernels::Buffer copy = AllocateFloats(k.chunk);
    if (src_count > 0) ops_.CopyDeviceToDevice(copy.data(), src, src_count * kF);
    if (src_count < k.chunk) ops_.Fill(copy.f32() + src_count, k.chunk - src_count, 0.0f);
    in = copy.f32();
    pending.comm_bytes += k.chunk * kF;
    pending.buffers.push_back(std::move(copy));
  }
  // The output: the bucket itself when no padding is needed, else staging
  // that the calling thread copies out.
  float* out = device_dst;
  if (padded != k.size() || device_dst == nullptr) {
    kernels::Buffer staging = AllocateFloats(padded);
    out = staging.f32();
    pending.comm_bytes += padded * kF;
    pending.buffers.push_back(std::move(staging));
    pending.finish = [this, out, device_dst, host_dst, size = k.size()](bool ok) {
      if (!ok) return;
      if (device_dst != nullptr) {
        ops_.CopyDeviceToDevice(device_dst, out, size * kF);
      } else {
        ops_.CopyDeviceToHost(host_dst, out, size * kF);
      }
    };
  }
  comm::Communicator* comm = comm_;
  const size_t in_count = static_cast<size_t>(k.chunk), out_count = static_cast<size_t>(padded);
  return Post([comm, in, in_count, out, out_count]() {
    return comm->AllGather(std::span<const float>(in, in_count), std::span<float>(out, out_count));
  }, std::move(pending));
}

CommWorker::Handle DataParallelEngine::SubmitReduceScatter(int b) {
  const FlatBucket& k = partition_.buckets()[b];
  const int64_t padded = k.chunk * ranks_;
  PendingComm pending;
  const float* in = grads_ + k.begin;
  if (padded != k.size()) {
    kernels::Buffer copy = AllocateFloats(padded);
    ops_.CopyDeviceToDevice(copy.data(), grads_ + k.begin, k.size() * kF);
    ops_.Fill(copy.f32() + k.size(), padded - k.size(), 0.0f);
    in = copy.f32();
    pending.comm_bytes += padded * kF;
    pending.buffers.push_back(std::move(copy));
  }
  kernels::Buffer reduced = AllocateFloats(k.chunk);
  float* out = reduced.f32();
  pending.comm_bytes += k.chunk * kF;
  pending.buffers.push_back(std::move(reduced));
  pending.finish = [this, b, out](bool ok) {
    const FlatBucket& k = partition_.buckets()[b];
    if (ok) ops_.Axpy(k.chunk, 1.0f, out, grad_shard_.f32() + k.shard_offset);
    // The bucket's gradient is now in the shard: free it, which also zeroes
    // it for the next micro-batch's accumulation.
    ReleaseToZero(ops_, grads_ + k.begin, k.size());
    if (grad_live_[b]) {
      grad_live_[b] = 0;
      memory_->Sub(MemoryKind::kGradients, k.size() * kF);
    }
  };
  comm::Communicator* comm = comm_;
  const size_t in_count = static_cast<size_t>(padded), out_count = static_cast<size_t>(k.chunk);
  return Post([comm, in, in_count, out, out_count]() {
    return comm->ReduceScatter(std::span<const float>(in, in_count),
                               std::span<float>(out, out_count));
  }, std::move(pending));
}

void DataParallelEngine::Acquire(int64_t unit, bool wait) {
  if (!held_[unit]) {
    held_[unit] = true;
    for (int b : unit_buckets_[unit]) {
      if (holders_[b]++ > 0) continue;
      const FlatBucket& k = partition_.buckets()[b];
      memory_->Add(MemoryKind::kParameters, k.size() * kF);
      gathering_[b] = SubmitGather(b, param_shard_.f32() + k.shard_offset, k.chunk,
                                   params_ + k.begin);
    }
  }
  if (!wait) return;
  for (int b : unit_buckets_[unit]) {
    if (gathering_[b]) {
      Complete(gathering_[b]);
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
      Complete(gathering_[b]);
      gathering_[b] = nullptr;
    }
    const FlatBucket& k = partition_.buckets()[b];
    ReleaseToZero(ops_, params_ + k.begin, k.size());
    memory_->Sub(MemoryKind::kParameters, k.size() * kF);
  }
}

void DataParallelEngine::MarkGradientsLive(int64_t unit) {
  for (int b : partition_.BucketsInUnit(unit)) {
    if (grad_live_[b]) continue;
    grad_live_[b] = 1;
    memory_->Add(MemoryKind::kGradients, partition_.buckets()[b].size() * kF);
  }
}

int64_t DataParallelEngine::WholeModelUnit(int64_t unit) const {
  const ModelPart& part = model_->part();
  const int64_t local_layers = part.num_layers < 0 ? layers_ - part.first_layer : part.num_layers;
  if (unit == 0) return 0;
  if (unit <= local_layers) return part.first_layer + unit;
  return layers_ + 1;
}

void DataParallelEngine::BeforeUse(int64_t unit, bool backward) {
  unit = WholeModelUnit(unit);
  if (unit == 0 && !backward) {
    memory_->Set(MemoryKind::kActivations, model_->ActivationBytes());
  }
  const int64_t head = layers_ + 1;
  // Backward writes the unit's full-size gradient (also under PP, where it
  // stays whole until ReduceWholeGradients at the end of the step).
  if (stage_ >= 2 && backward) {
    MarkGradientsLive(unit);
    if (unit == head && tied_) MarkGradientsLive(0);  // lm_head's gradient is embed's
  }
  if (stage_ != 3) return;
  Acquire(unit, /*wait=*/true);
  const int64_t next = backward ? unit - 1 : unit + 1;
  if (backward ? next >= 1 : next <= head) Acquire(next, /*wait=*/false);
}

void DataParallelEngine::AfterUse(int64_t unit, bool backward) {
  unit = WholeModelUnit(unit);
  const int64_t head = layers_ + 1;
  // The embedding's backward comes right after the lowest unit that backward reads.
  if (stage_ >= 2 && backward && unit == (layers_ > 0 ? 1 : head)) {
    MarkGradientsLive(0);
  }
  if (stage_ != 3) return;
  if (!backward && training_pass_ && unit == head) return;  // backward starts with it
  Release(unit);
}

void DataParallelEngine::GradientsReady(int64_t unit) {
  unit = WholeModelUnit(unit);
  const bool reduce = stage_ >= 2 ? training_pass_ : training_pass_ && last_micro_;
  if (!reduce) return;
  // No Synchronize before posting (this runs once per layer in backward): a
  // communicator orders itself after the backend's work (NCCL waits on an
  // event of the compute stream when it launches; a CPU backend has finished
  // each op when it returns).
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
    for (const CommWorker::Handle& h : reducing_[unit + kReduceWindow]) Complete(h);
    reducing_[unit + kReduceWindow].clear();
  }
}

absl::Status DataParallelEngine::FinishReduction() {
  for (auto& w : pending_all_reduce_) Note(w->Wait());
  pending_all_reduce_.clear();
  CompleteAll();
  return status_;
}

absl::Status DataParallelEngine::ReduceWholeGradients() {
  status_ = absl::OkStatus();
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const FlatBucket& k = buckets[b];
    if (stage_ <= 1) {
      pending_all_reduce_.push_back(comm_->AllReduceAsync(
          std::span<float>(grads_ + k.begin, static_cast<size_t>(k.size())), comm::ReduceOp::kSum));
    } else {
      SubmitReduceScatter(static_cast<int>(b));
    }
  }
  return FinishReduction();
}

std::vector<GradientPiece> DataParallelEngine::GradientPieces() {
  std::vector<GradientPiece> out;
  if (stage_ <= 1) {  // every rank holds the whole reduced gradient
    for (size_t i = 0; i < partition_.tensors().size(); ++i) {
      const FlatTensor& t = partition_.tensors()[i];
      out.push_back({grads_ + t.offset, t.numel, replicas_[i]});
    }
    return out;
  }
  for (size_t i = 0; i < owned_.size(); ++i) {
    out.push_back({const_cast<float*>(pieces_[i].grad), pieces_[i].count,
                   replicas_[owned_[i].tensor]});
  }
  return out;
}

void DataParallelEngine::CountInNormOnce(const std::string& tensor, int holders) {
  for (size_t i = 0; i < partition_.tensors().size(); ++i) {
    if (partition_.tensors()[i].name == tensor) replicas_[i] *= holders;
  }
}

absl::Status DataParallelEngine::GatherOptimizerStates(float* exp_avg, float* exp_avg_sq) {
  if (stage_ == 0) return absl::FailedPreconditionError("stage 0 has no sharded optimizer states");
  status_ = absl::OkStatus();
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  for (float* full : {exp_avg, exp_avg_sq}) {
    const float* shard = full == exp_avg ? optimizer_->exp_avg() : optimizer_->exp_avg_sq();
    for (size_t b = 0; b < buckets.size(); ++b) {
      const FlatBucket& k = buckets[b];
      Complete(SubmitGather(static_cast<int>(b), shard + k.shard_offset, k.chunk, full + k.begin));
    }
  }
  CompleteAll();
  return status_;
}

void DataParallelEngine::ScatterOptimizerStates(const float* exp_avg, const float* exp_avg_sq) {
  if (stage_ == 0) return;
  for (const FlatBucket& k : partition_.buckets()) {
    const int64_t lo = partition_.OwnedBegin(k, rank_), hi = partition_.OwnedEnd(k, rank_);
    if (hi <= lo) continue;
    ops_.CopyDeviceToDevice(optimizer_->exp_avg() + k.shard_offset, exp_avg + lo, (hi - lo) * kF);
    ops_.CopyDeviceToDevice(optimizer_->exp_avg_sq() + k.shard_offset, exp_avg_sq + lo,
                            (hi - lo) * kF);
  }
}

absl::Status DataParallelEngine::MaterializeParameters() {
  if (stage_ != 3) return absl::OkStatus();
  status_ = absl::OkStatus();
  memory_->Add(MemoryKind::kParameters, partition_.total() * kF);
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const FlatBucket& k = buckets[b];
    Complete(SubmitGather(static_cast<int>(b), param_shard_.f32() + k.shard_offset, k.chunk,
                          params_ + k.begin));
  }
  CompleteAll();
  return status_;
}

absl::Status DataParallelEngine::OptimizerStep(double lr) {
  if (stage_ == 0) return absl::FailedPreconditionError("stage 0 updates with the caller's AdamW");
  optimizer_->Step(pieces_, lr);
  if (stage_ == 3) return absl::OkStatus();  // parameters stay sharded
  // Two buckets in flight at most: the staging of one gather is freed before
  // the next-but-one is posted.
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  CommWorker::Handle previous;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t lo = partition_.OwnedBegin(buckets[b], rank_);
    const int64_t hi = partition_.OwnedEnd(buckets[b], rank_);
    CommWorker::Handle h =
        SubmitGather(static_cast<int>(b), params_ + lo, hi - lo, params_ + buckets[b].begin);
    Complete(previous);
    previous = h;
  }
  CompleteAll();
  return status_;
}

absl::Status DataParallelEngine::GatherParameters(std::vector<float>* out) {
  out->assign(static_cast<size_t>(partition_.total()), 0.0f);
  if (stage_ != 3) {
    ops_.CopyDeviceToHost(out->data(), params_, partition_.total() * kF);
    return absl::OkStatus();
  }
  status_ = absl::OkStatus();
  const std::vector<FlatBucket>& buckets = partition_.buckets();
  CommWorker::Handle previous;
  for (size_t b = 0; b < buckets.size(); ++b) {
    CommWorker::Handle h =
        SubmitGather(static_cast<int>(b), param_shard_.f32() + buckets[b].shard_offset,
                     buckets[b].chunk, nullptr, out->data() + buckets[b].begin);
    Complete(previous);
    previous = h;
  }
  CompleteAll();
  return status_;
}

}  // namespace loom::engine
