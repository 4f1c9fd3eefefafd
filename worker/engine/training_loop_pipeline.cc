// The training step of every layout (docs/pipeline.md): this rank runs its
// stage's chunks by its instruction list (without a pp group one stage of one
// chunk: forward-backward per micro-batch, then RG, OS); the loss lives on
// the last stage and the gradient norm spans every stage (and TP shard).
// Checkpoints take the one path of every layout (training_loop_checkpoint.cc).
// Kept apart from training_loop.cc, which calls in here when a pp group is
// given.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <span>

#include "absl/strings/str_cat.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/model/moe_stats.h"
#include "worker/engine/tensor_parallel/tp_plan.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {

float* TrainingLoop::TiedGradient() {
  for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
    for (const TensorView& g : stage_->model(c).Gradients()) {
      if (g.name == kTiedEmbedding) {
        tied_count_ = g.numel();
        return g.data;
      }
    }
  }
  return nullptr;
}

absl::Status TrainingLoop::SumTiedEmbeddingGradients() {
  if (!TiedAcrossStages(spec_.model, ctx_.pp_size())) return absl::OkStatus();
  float* g = TiedGradient();
  if (g == nullptr) {  // the sum lands here too: zero it again every step
    g = tied_zeros_.f32();
    ops_->Fill(g, tied_count_, 0.0f);
  }
  return ctx_.pp->AllReduce(std::span<float>(g, static_cast<size_t>(tied_count_)));
}

absl::StatusOr<StepProgress> TrainingLoop::SkipStep(int64_t step, SkippedBatch why) {
  const auto start = std::chrono::steady_clock::now();
  memory_.ResetPeaks();
  StepProgress p;
  p.lr = LearningRate(spec_.train, step);
  p.bad_step = std::move(why.reason);
  return FinishStep(std::move(p), step, why.loss, start);
}

void TrainingLoop::SkipBatch(int64_t step, std::string reason, double loss) {
  skip_batches_[step] = SkippedBatch{std::move(reason), loss};
}

absl::StatusOr<StepProgress> TrainingLoop::RunScheduledStep() {
  const spec::TrainSpec& t = spec_.train;
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = step_ + 1;
  if (auto skip = skip_batches_.find(step); skip != skip_batches_.end()) {
    return SkipStep(step, skip->second);
  }
  const int64_t applied_before = optimizer_step();
  // A step whose gradient or loss is not finite is not applied; every rank
  // sees the same norm and loss, so all of them skip it together.
  bool bad = false;
  bool reached_optimizer = false;
  std::vector<std::vector<float>> moe_biases;  // [moe] restored when the step is not applied
  const int64_t total_micro = t.global_batch_size / t.micro_batch_size;
  memory_.ResetPeaks();
  ops_->ResetPeakDeviceMemory();
  if (dp_engines_.empty()) stage_->ZeroGradients();
  for (const auto& e : dp_engines_) e->BeginStep();  // zeroes or releases what it reduces
  // [dp] Without a pp group the one chunk's engine reduces buckets while
  // backward runs (each micro-batch a fused forward-backward pass); a
  // pipeline's chunks interleave, so each reduces once, at RG.
  const bool reduce_in_backward = ctx_.pp == nullptr && !dp_engines_.empty();
  StepProgress p;
  p.lr = LearningRate(t, step);
  float loss = 0.0f;
  PipelineStepHooks hooks;
  hooks.fill = [&](int64_t mb, Batch* out) {
    Phase("load_data", mb);
    FillTrainMicroBatch(step, mb, out);
    Phase("forward_backward", mb);
  };
  hooks.before_pass = [this](const char* pass, int64_t mb, int64_t chunk) { Phase(pass, mb, chunk); };
  // The nan_grad drill: one NaN in this rank's own gradient before the
  // reduction spreads to every replica (a gradient ZeRO 0-1 replicates over
  // DP is not summed into the norm there); ZeRO-2/3 shards have no replica
  // and their norm crosses DP, so after the reduction suffices.
  const bool poison = faults_.nan_gradient_step == step;
  const auto poison_one = [this](float* data, int64_t count) {
    if (count > 0) ops_->Fill(data, 1, std::numeric_limits<float>::quiet_NaN());
    return count > 0;
  };
  const auto poison_model_gradient = [&]() {
    for (LlamaModel* part : Parts()) {
      for (const TensorView& g : part->Gradients()) {
        if (poison_one(g.data, g.numel())) return;
      }
    }
  };
  hooks.reduce_gradients = [&](double loss_sum) -> absl::Status {
    Phase("reduce_gradients");
    kernels::Ops& ops = stage_->ops();
    if (poison && !reduce_in_backward && zero_stage() < 2) poison_model_gradient();
    // [tied] The embedding's gradient, first stage + last stage's copy.
    if (absl::Status s = SumTiedEmbeddingGradients(); !s.ok()) return s;
    if (reduce_in_backward) {
      if (absl::Status s = dp_engines_[0]->FinishReduction(); !s.ok()) return s;
    } else if (!dp_engines_.empty()) {
      // [dp] ZeRO: each chunk's engine reduces (and shards) its gradient.
      for (const auto& e : dp_engines_) {
        if (absl::Status s = e->ReduceWholeGradients(); !s.ok()) return s;
      }
    } else if (ctx_.grad_group() != nullptr) {  // [cp] DP x CP
      // DP without ZeRO: sum each chunk's whole gradient array, in backend
      // memory.
      for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
        std::vector<TensorView> g = stage_->model(c).Gradients();
        if (g.empty()) continue;
        // The views tile one contiguous array in order.
        const TensorView& last = g.back();
        const int64_t n = (last.data + last.numel()) - g.front().data;
        if (absl::Status s = ctx_.grad_group()->AllReduce(std::span<float>(g.front().data, n));
            !s.ok()) {
          return s;
        }
      }
    }
    // [ep] The dense gradients' second sum, over EP (ep_gradients.h), after
    // the DP reduction whichever way it ran.
    if (absl::Status s = ReduceDenseOverEp(); !s.ok()) return s;
    if (spec_.model.moe.enabled()) {  // [moe] statistics, bias update, the whole model's summary
      for (LlamaModel* part : Parts()) {
        for (const TensorView& b : part->ExpertBiases()) {
          moe_biases.emplace_back(b.data, b.data + b.numel());
        }
      }
      absl::StatusOr<MoeSummary> moe = FinishMoeStep(Parts(), ctx_.DataGroups(), ctx_.pp, total_micro);
      if (!moe.ok()) return moe.status();
      p.moe = std::move(*moe);
    }
    loss = static_cast<float>(loss_sum / static_cast<double>(total_micro));
    for (comm::Communicator* group : ctx_.DataGroups()) {  // [ep] dp, then ep
      if (absl::Status s = AllReduceHostFloats(ops, group, &loss, 1); !s.ok()) return s;
    }
    // Only the last stage's is non-zero.
    if (absl::Status s = AllReduceHostFloats(ops, ctx_.pp, &loss, 1); !s.ok()) return s;
    if (faults_.loss_spike_step == step) loss *= static_cast<float>(faults_.loss_spike_scale);
    if (poison && zero_stage() >= 2) {
      for (const GradientPiece& g : GradientPiecesToClip()) {
        if (poison_one(g.data, g.count)) break;
      }
    }
    // The whole model's norm: TP shards (replicas counted once), stages, the
    // DP shards under ZeRO, the EP ranks' experts (dense pieces once).
    absl::StatusOr<double> norm = ClipStepGradients();
    if (!norm.ok()) return norm.status();
    p.grad_norm = *norm;
    if (!std::isfinite(*norm)) {
      bad = true;
      p.bad_step = absl::StrCat("non-finite gradients (norm ", *norm, "), not applied");
    } else if (!std::isfinite(loss)) {
      bad = true;
      p.bad_step = absl::StrCat("non-finite loss (", loss, "), not applied");
    }
    if (bad && !moe_biases.empty()) {  // [moe] as if the batch had not been seen
      size_t i = 0;
      for (LlamaModel* part : Parts()) {
        for (const TensorView& b : part->ExpertBiases()) {
          std::copy(moe_biases[i].begin(), moe_biases[i].end(), b.data);
          ++i;
        }
      }
    }
    return absl::OkStatus();
  };
  if (reduce_in_backward) {
    DataParallelEngine* dp = dp_engines_[0].get();
    hooks.before_backward = [&, dp](bool last) {
      // The last micro-batch adds to the gradient and reduces it as it goes.
      if (poison && last && zero_stage() < 2) poison_model_gradient();
      dp->BeginMicroBatch(last);
    };
    hooks.after_backward = [dp]() { return dp->EndMicroBatch(); };
  }
  hooks.optimizer_step = [&]() -> absl::Status {
    Phase("optimizer");
    reached_optimizer = true;
    if (bad) return absl::OkStatus();
    absl::Status updated;
    OptimizerUpdate(p.lr, &updated);
    return updated;
  };
  if (absl::Status s = pipeline_->RunStep(1.0f / static_cast<float>(total_micro), hooks); !s.ok()) {
    return s;
  }
  if (!reached_optimizer || optimizer_step() != applied_before + (bad ? 0 : 1)) {
    return absl::InternalError(absl::StrCat("pipeline stage ", ctx_.stage(),
                                            ": the instruction list has no OptimizerStep"));
  }
  memory_.Set(MemoryKind::kActivations, stage_->ActivationBytes());
  return FinishStep(std::move(p), step, loss, start);
}

}  // namespace loom::engine
