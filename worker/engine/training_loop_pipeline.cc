// [pp] The training loop under pipeline parallelism (docs/pipeline.md): this
// rank runs one stage's chunks by its instruction list; the loss lives on the
// last stage and the gradient norm spans every stage (and TP shard). Kept
// apart from training_loop.cc, which calls in here when a pp group is given.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <span>

#include "absl/strings/str_cat.h"
#include "worker/engine/model/tp_plan.h"
#include "worker/engine/model/tp_tensors.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Sums one float over a group (nothing without one).
absl::Status SumOver(comm::Communicator* group, float* value) {
  if (group == nullptr || group->size() <= 1) return absl::OkStatus();
  return group->AllReduce(std::span<float>(value, 1));
}

}  // namespace

absl::Status TrainingLoop::CreatePipeline() {
  const spec::JobSpec& job = spec_;
  const spec::TrainSpec& t = job.train;
  const int pp = pp_comm_->size();
  const int64_t want = job.parallelism.pp.value_or(1);
  if (want != pp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.pp=", want, " but the pipeline-parallel group has ", pp, " ranks"));
  }
  if (absl::Status s = CheckPipelineModel(job.model, pp); !s.ok()) return s;
  if (dp_size_ > 1 && job.parallelism.zero_stage.value_or(0) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.zero_stage=", *job.parallelism.zero_stage, " with pp=", pp,
        " is not supported yet (ZeRO stage 0 is): the pipeline reduces whole gradients over DP"));
  }
  const int64_t microbatches = t.global_batch_size / t.micro_batch_size / dp_size_;
  absl::StatusOr<PipelinePlan> plan = MakePipelinePlan(job, pp_comm_->rank(), pp, microbatches);
  if (!plan.ok()) return plan.status();
  stage_ = std::make_unique<PipelineStage>(
      job.model, job.parallelism.recompute, *plan,
      TensorParallelOptions{tp_comm_, job.parallelism.sequence_parallel});
  stage_->InitParameters(t.seed);
  pipeline_ = std::make_unique<PipelineExecutor>(stage_.get(), pp_comm_);
  optimizer_ = std::make_unique<AdamW>(stage_->Parameters(), stage_->Gradients(), t);
  const int64_t param_bytes = stage_->NumParameters() * static_cast<int64_t>(sizeof(float));
  memory_.Add(MemoryKind::kParameters, param_bytes);
  memory_.Add(MemoryKind::kGradients, param_bytes);
  memory_.Add(MemoryKind::kOptimizerStates, 2 * param_bytes);
  flops_per_token_ =
      ModelFlopsPerToken(job.model, stage_->model(0).NumGlobalParameters(), t.seq_len);
  return absl::OkStatus();
}

absl::StatusOr<StepProgress> TrainingLoop::PipelineTrainStep() {
  const spec::TrainSpec& t = spec_.train;
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = step_ + 1;
  const int64_t total_micro = t.global_batch_size / t.micro_batch_size;
  memory_.ResetPeaks();
  stage_->ZeroGradients();
  StepProgress p;
  p.lr = LearningRate(t, step);
  float loss = 0.0f;
  PipelineStepHooks hooks;
  hooks.fill = [&](int64_t mb, Batch* out) {
    Phase("forward_backward", mb);
    FillTrainMicroBatch(step, mb, out);
  };
  hooks.reduce_gradients = [&](double loss_sum) -> absl::Status {
    Phase("reduce_gradients");
    // DP: sum each chunk's whole gradient array (stage 0 semantics).
    if (dp_comm_ != nullptr) {
      for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
        std::vector<TensorView> g = stage_->model(c).Gradients();
        if (g.empty()) continue;
        // The views tile one contiguous array in order.
        const TensorView& last = g.back();
        const int64_t n = (last.data + last.numel()) - g.front().data;
        if (absl::Status s = dp_comm_->AllReduce(std::span<float>(g.front().data, n)); !s.ok()) {
          return s;
        }
      }
    }
    loss = static_cast<float>(loss_sum / static_cast<double>(total_micro));
    if (absl::Status s = SumOver(dp_comm_, &loss); !s.ok()) return s;
    if (absl::Status s = SumOver(pp_comm_, &loss); !s.ok()) return s;  // only the last stage's is non-zero
    // The whole model's norm: TP shards (replicas counted once), then stages.
    absl::StatusOr<double> local = TpGlobalNorm(stage_->Gradients(), tp_comm_);
    if (!local.ok()) return local.status();
    float squares = static_cast<float>(*local * *local);
    if (absl::Status s = SumOver(pp_comm_, &squares); !s.ok()) return s;
    const double norm = std::sqrt(static_cast<double>(squares));
    p.grad_norm = norm;
    if (t.grad_clip > 0.0 && norm > t.grad_clip) {
      const float scale = static_cast<float>(t.grad_clip / (norm + 1e-6));
      for (const TensorView& g : stage_->Gradients()) {
        for (int64_t i = 0; i < g.numel(); ++i) g.data[i] *= scale;
      }
    }
    return absl::OkStatus();
  };
  hooks.optimizer_step = [&]() -> absl::Status {
    Phase("optimizer");
    optimizer_->Step(p.lr);
    return absl::OkStatus();
  };
  if (absl::Status s = pipeline_->RunStep(1.0f / static_cast<float>(total_micro), hooks); !s.ok()) {
    return s;
  }
  if (optimizer_->step() != step) {
    return absl::InternalError(absl::StrCat("pipeline stage ", pp_comm_->rank(),
                                            ": the instruction list has no OptimizerStep"));
  }
  memory_.Set(MemoryKind::kActivations, stage_->ActivationBytes());
  step_ = step;
  tokens_ += t.global_batch_size * t.seq_len;
  p.step = step;
  p.total_steps = t.steps;
  p.loss = loss;
  p.tokens = tokens_;
  p.step_seconds = Seconds(start);
  p.tokens_per_second = p.step_seconds > 0
      ? static_cast<double>(t.global_batch_size * t.seq_len) / p.step_seconds : 0.0;
  p.flops_per_token = flops_per_token_;
  if (IsEvalStep(step)) {
    Phase("eval");
    const auto eval_start = std::chrono::steady_clock::now();
    absl::StatusOr<double> val = Evaluate();
    if (!val.ok()) return val.status();
    p.val_loss = *val;
    p.eval_seconds = Seconds(eval_start);
  }
  struct rusage usage {};
  p.peak_rss_bytes = getrusage(RUSAGE_SELF, &usage) == 0
      ? static_cast<int64_t>(usage.ru_maxrss) * 1024 : 0;
  Phase("running");
  return p;
}

absl::StatusOr<double> TrainingLoop::PipelineEvaluate() {
  const spec::TrainSpec& t = spec_.train;
  const int64_t windows = t.eval_windows;
  const int64_t begin = windows * dp_rank_ / dp_size_;
  const int64_t end = windows * (dp_rank_ + 1) / dp_size_;
  double sum = 0.0;
  for (int64_t first = begin; first < end; first += t.micro_batch_size) {
    const int64_t count = std::min(t.micro_batch_size, end - first);
    FillValidationWindows(*val_data_, t.seq_len, first, count, &batch_);
    absl::StatusOr<double> loss = pipeline_->ForwardLoss(batch_);
    if (!loss.ok()) return loss.status();
    sum += *loss * static_cast<double>(count);
  }
  float total = static_cast<float>(sum);
  if (absl::Status s = SumOver(dp_comm_, &total); !s.ok()) return s;
  if (absl::Status s = SumOver(pp_comm_, &total); !s.ok()) return s;
  return static_cast<double>(total) / static_cast<double>(windows);
}

absl::Status TrainingLoop::PipelineCheckpointsUnsupported(const std::string& root,
                                                          bool restoring) const {
  // Restoring from an empty or missing root is a fresh start, as for any layout.
  std::error_code ec;
  bool any_step = false;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    if (entry.path().filename().string().rfind("step_", 0) == 0) any_step = true;
  }
  const std::string what = absl::StrCat(
      "checkpoints with parallelism.pp=", pp_comm_->size(),
      " are not implemented yet: leave checkpoint.dir empty (root ", root, ")");
  if (restoring && !any_step) return absl::NotFoundError(what);
  return absl::UnimplementedError(what);
}

}  // namespace loom::engine
