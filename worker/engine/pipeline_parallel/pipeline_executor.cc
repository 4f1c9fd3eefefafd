#include "worker/engine/pipeline_parallel/pipeline_executor.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/topology/instruction.h"

namespace loom::engine {
namespace {

using topology::Instruction;
using topology::OpKind;

constexpr int kActivation = 0;
constexpr int kGradient = 1;
constexpr int kEvaluation = 2;

}  // namespace

uint32_t PipelineTag(int kind, int64_t boundary, int64_t mb) {
  // 2 bits of kind, 10 of boundary, 20 of micro-batch.
  return (static_cast<uint32_t>(kind) << 30) | (static_cast<uint32_t>(boundary & 0x3FF) << 20) |
         static_cast<uint32_t>(mb & 0xFFFFF);
}

PipelineExecutor::Tensor PipelineExecutor::Acquire(int64_t floats) {
  const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
  // The smallest free buffer that fits (micro-batches share one size;
  // evaluation batches may be smaller).
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it) {
    if (it->bytes() >= bytes && (best == pool_.end() || it->bytes() < best->bytes())) best = it;
  }
  Tensor t;
  t.floats = floats;
  if (best != pool_.end()) {
    t.buffer = std::move(*best);
    pool_.erase(best);
  } else {
    t.buffer = stage_->ops().AllocateFloats(std::max<int64_t>(floats, 1));
  }
  return t;
}

void PipelineExecutor::Release(Tensor t) {
  if (!t.buffer.empty()) pool_.push_back(std::move(t.buffer));
}

absl::Status PipelineExecutor::Send(int64_t peer, uint32_t tag, Tensor data) {
  if (pp_ == nullptr) return absl::InternalError("pipeline send without a pp group");
  // No Synchronize: the communicator orders itself after the backend's work
  // (docs/engine.md, "Device memory").
  auto pending = std::make_unique<PendingSend>();
  pending->data = std::move(data);
  pending->work = pp_->SendAsync(
      std::span<const float>(pending->data.data(), static_cast<size_t>(pending->data.floats)),
      static_cast<int>(peer), tag);
  sends_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Recv(int64_t peer, uint32_t tag, Tensor* data) {
  if (pp_ == nullptr) return absl::InternalError("pipeline receive without a pp group");
  return pp_->RecvAsync(std::span<float>(data->data(), static_cast<size_t>(data->floats)),
                        static_cast<int>(peer), tag)
      ->Wait();
}

absl::Status PipelineExecutor::WaitSends() {
  absl::Status first;
  for (auto& s : sends_) {
    absl::Status w = s->work->Wait();
    if (first.ok() && !w.ok()) first = w;
  }
  for (auto& s : sends_) Release(std::move(s->data));  // every send has finished
  sends_.clear();
  return first;
}

absl::Status PipelineExecutor::RunStep(float loss_scale, const PipelineStepHooks& hooks) {
  const PipelinePlan& plan = stage_->plan();
  const int64_t pp = plan.pp;
  std::map<int64_t, Batch> batches;
  std::map<Key, Tensor> act_in, grad_in, act_out, grad_out;
  double loss_sum = 0.0;
  std::map<int64_t, int64_t> backwards;  // per chunk, this step
  auto batch_of = [&](int64_t mb) -> const Batch& {
    auto it = batches.find(mb);
    if (it == batches.end()) {
      it = batches.emplace(mb, Batch{}).first;
      hooks.fill(mb, &it->second);
    }
    return it->second;
  };
  auto where = [&](const Instruction& in) {
    return absl::StrCat("pipeline stage ", plan.stage, " instruction ",
                        topology::FormatInstruction(in));
  };
  // Removes and returns map[key], or fails naming the instruction.
  auto take = [&](std::map<Key, Tensor>& map, const Key& key, const Instruction& in,
                  const char* what) -> absl::StatusOr<Tensor> {
    auto it = map.find(key);
    if (it == map.end()) {
      return absl::FailedPreconditionError(absl::StrCat(where(in), ": no ", what, " for it"));
    }
    Tensor v = std::move(it->second);
    map.erase(it);
    return v;
  };
  for (const Instruction& in : plan.instructions) {
    const Key key{in.microbatch, in.chunk};
    if (in.chunk < 0 || in.chunk >= stage_->num_chunks()) {
      return absl::InvalidArgumentError(absl::StrCat(where(in), ": the stage has ",
                                                     stage_->num_chunks(), " chunks"));
    }
    const PipelineChunk& ch = stage_->chunk(in.chunk);
    LlamaModel& model = stage_->model(in.chunk);
    switch (in.op) {
      case OpKind::kForward: {
        if (ch.head) break;  // computed with the backward
        const Batch& b = batch_of(in.microbatch);
        Tensor y = Acquire(model.PartActivationFloats(b.batch, b.seq));
        if (hooks.before_pass) hooks.before_pass("forward", in.microbatch, in.chunk);
        const float* x = nullptr;
        if (!ch.embedding) {
          auto it = act_in.find(key);
          if (it == act_in.end()) {
            return absl::FailedPreconditionError(absl::StrCat(where(in), ": its input was not received"));
          }
          x = it->second.data();
        }
        model.PartForward(b.inputs.data(), x, b.batch, b.seq, y.data());
        if (!model.status().ok()) return model.status();
        // With one stage the next chunk is this stage's own: pass in memory.
        if (pp == 1) {
          act_in[{in.microbatch, in.chunk + 1}] = std::move(y);
        } else {
          act_out[key] = std::move(y);
        }
        break;
      }
      case OpKind::kBackward: {
        const Batch& b = batch_of(in.microbatch);
        Tensor x, dy, dx;
        if (!ch.embedding) {
          absl::StatusOr<Tensor> got = take(act_in, key, in, "stashed input");
          if (!got.ok()) return got.status();
          x = std::move(*got);
        }
        if (!ch.head) {
          absl::StatusOr<Tensor> got = take(grad_in, key, in, "received output gradient");
          if (!got.ok()) return got.status();
          dy = std::move(*got);
        }
        if (!ch.embedding) dx = Acquire(model.PartActivationFloats(b.batch, b.seq));
        const bool last = ++backwards[in.chunk] == plan.microbatches;
        if (hooks.before_backward) hooks.before_backward(last);
        if (hooks.before_pass) hooks.before_pass("backward", in.microbatch, in.chunk);
        const float loss = model.PartForwardBackward(
            b.inputs.data(), ch.embedding ? nullptr : x.data(), b.targets.data(),
            ch.head ? nullptr : dy.data(), b.batch, b.seq, loss_scale,
            ch.embedding ? nullptr : dx.data());
        if (!model.status().ok()) return model.status();
        if (hooks.after_backward) {
          if (absl::Status s = hooks.after_backward(); !s.ok()) return s;
        }
        Release(std::move(x));
        Release(std::move(dy));
        if (ch.head) loss_sum += loss;
        if (!ch.embedding) {
          if (pp == 1) {
            grad_in[{in.microbatch, in.chunk - 1}] = std::move(dx);
          } else {
            grad_out[key] = std::move(dx);
          }
        }
        break;
      }
      case OpKind::kSendActivation: {
        absl::StatusOr<Tensor> y = take(act_out, key, in, "computed output");
        if (!y.ok()) return y.status();
        if (absl::Status s = Send(in.peer, PipelineTag(kActivation, ch.virtual_stage + 1, in.microbatch),
                                  std::move(*y));
            !s.ok()) {
          return s;
        }
        break;
      }
      case OpKind::kSendGradient: {
        absl::StatusOr<Tensor> dx = take(grad_out, key, in, "computed input gradient");
        if (!dx.ok()) return dx.status();
        if (absl::Status s = Send(in.peer, PipelineTag(kGradient, ch.virtual_stage, in.microbatch),
                                  std::move(*dx));
            !s.ok()) {
          return s;
        }
        break;
      }
      case OpKind::kRecvActivation:
      case OpKind::kRecvGradient: {
        const Batch& b = batch_of(in.microbatch);
        const bool act = in.op == OpKind::kRecvActivation;
        Tensor buffer = Acquire(model.PartActivationFloats(b.batch, b.seq));
        const uint32_t tag = act ? PipelineTag(kActivation, ch.virtual_stage, in.microbatch)
                                 : PipelineTag(kGradient, ch.virtual_stage + 1, in.microbatch);
        if (absl::Status s = Recv(in.peer, tag, &buffer); !s.ok()) return s;
        (act ? act_in : grad_in)[key] = std::move(buffer);
        break;
      }
      case OpKind::kReduceGradients: {
        if (absl::Status s = WaitSends(); !s.ok()) return s;
        if (absl::Status s = hooks.reduce_gradients(loss_sum); !s.ok()) return s;
        break;
      }
      case OpKind::kOptimizerStep: {
        if (absl::Status s = hooks.optimizer_step(); !s.ok()) return s;
        break;
      }
    }
  }
  if (absl::Status s = WaitSends(); !s.ok()) return s;
  if (!act_in.empty() || !grad_in.empty() || !act_out.empty() || !grad_out.empty()) {
    return absl::InternalError(absl::StrCat("pipeline stage ", plan.stage,
                                            ": the instruction list left tensors unconsumed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> PipelineExecutor::ForwardLoss(const Batch& b) {
  const PipelinePlan& plan = stage_->plan();
  const int64_t pp = plan.pp, total = pp * plan.virtual_stages;
  Tensor x;  // the current virtual stage's input on this stage
  double loss = 0.0;
  for (int64_t vs = 0; vs < total; ++vs) {
    const int64_t owner = vs % pp, c = vs / pp;
    if (owner != plan.stage) continue;
    LlamaModel& model = stage_->model(c);
    const PipelineChunk& ch = stage_->chunk(c);
    const int64_t floats = model.PartActivationFloats(b.batch, b.seq);
    const int64_t prev = (vs - 1 + pp) % pp;
    if (!ch.embedding && prev != plan.stage) {
      Release(std::move(x));
      x = Acquire(floats);
      if (absl::Status s = Recv(prev, PipelineTag(kEvaluation, vs, 0), &x); !s.ok()) return s;
    }
    if (ch.head) {
      loss = model.PartForwardLoss(b.inputs.data(), ch.embedding ? nullptr : x.data(),
                                   b.targets.data(), b.batch, b.seq);
      if (!model.status().ok()) return model.status();
      continue;
    }
    Tensor y = Acquire(floats);
    model.PartForward(b.inputs.data(), ch.embedding ? nullptr : x.data(), b.batch, b.seq, y.data());
    if (!model.status().ok()) return model.status();
    Release(std::move(x));
    const int64_t next = (vs + 1) % pp;
    if (next == plan.stage) {
      x = std::move(y);
    } else {
      if (absl::Status s = Send(next, PipelineTag(kEvaluation, vs + 1, 0), std::move(y)); !s.ok()) {
        return s;
      }
      if (absl::Status s = WaitSends(); !s.ok()) return s;
    }
  }
  Release(std::move(x));
  return loss;
}

}  // namespace loom::engine
