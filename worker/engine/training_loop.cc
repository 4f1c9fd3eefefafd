#include "worker/engine/training_loop.h"

#include <sys/resource.h>

#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/layout.h"
#include "worker/engine/context_parallel/cp_batch.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/expert_parallel/ep_exchange.h"
#include "worker/engine/expert_parallel/ep_gradients.h"
#include "worker/engine/tensor_parallel/tp_plan.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/parallel/host_floats.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/ops_selection.h"

namespace loom::engine {
namespace {

int64_t PeakRssBytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The layout this rank runs: the spec's with the axes of its context (without
// a group the axis runs as 1 whatever the spec says: the standalone trainer
// ignores the layout).
spec::Layout ContextLayout(const spec::JobSpec& spec, const ParallelContext& ctx) {
  spec::Layout l = spec::LayoutOf(spec);
  l.dp = ctx.dp_size;
  l.tp = ctx.tp_size();
  l.pp = ctx.pp_size();
  l.cp = ctx.cp_size();
  l.ep = ctx.ep_size();
  const int64_t per_step = spec.train.micro_batch_size * ctx.data_size();  // [ep]
  l.grad_accum = per_step > 0 ? spec.train.global_batch_size / per_step : 0;
  return l;
}

}  // namespace

double ModelFlopsPerToken(const spec::ModelSpec& m, int64_t num_parameters, int64_t seq_len) {
  int64_t matmul_params =
      num_parameters - (m.tie_embeddings ? 0 : m.vocab_size * m.hidden_size);
  if (m.moe.enabled()) {  // [moe] a token runs top_k of the routed experts: count the active ones
    const int64_t moe_layers = m.num_layers - m.moe.first_dense_layers;
    matmul_params -= moe_layers * (m.moe.num_experts - m.moe.top_k) * 3 * m.expert_ffn() *
                     m.hidden_size;
  }
  return 6.0 * static_cast<double>(matmul_params) +
         12.0 * static_cast<double>(m.num_layers * m.hidden_size * seq_len);
}

TrainingLoop::TrainingLoop(const spec::JobSpec& spec, const ParallelContext& ctx,
                           LoopOptions options)
    : spec_(spec), ctx_(ctx), options_(options) {}

TrainingLoop::~TrainingLoop() = default;

absl::StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Create(
    const spec::JobSpec& spec, int dp_rank, int dp_size, comm::Communicator* dp_comm,
    comm::Communicator* tp_comm, comm::Communicator* pp_comm, std::shared_ptr<kernels::Ops> ops) {
  absl::StatusOr<ParallelContext> ctx =
      ParallelContext::Make(dp_rank, dp_size, dp_comm, tp_comm, pp_comm);
  if (!ctx.ok()) return ctx.status();
  return Create(spec, *ctx, std::move(ops));
}

absl::StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Create(
    const spec::JobSpec& spec, const ParallelContext& ctx, std::shared_ptr<kernels::Ops> ops,
    LoopOptions options) {
  spec::JobSpec resolved = spec;
  if (resolved.model.num_kv_heads == 0) resolved.model.num_kv_heads = resolved.model.num_heads;
  if (absl::Status s = CheckContextMatchesSpec(ctx, resolved); !s.ok()) return s;
  // What the engine needs for this layout (common/spec/job_spec_rules.h, the
  // same rulebook as at submission and in the planner's search).
  if (absl::Status s = spec::ValidateEngineRuns(resolved, ContextLayout(resolved, ctx)); !s.ok()) {
    return s;
  }
  std::unique_ptr<TrainingLoop> loop(new TrainingLoop(resolved, ctx, options));
  const spec::JobSpec& job = loop->spec_;
  const spec::TrainSpec& t = job.train;

  absl::StatusOr<TokenDataset> train =
      TokenDataset::Load(job.data.train_path, job.data.format, job.model.vocab_size);
  if (!train.ok()) return train.status();
  if (absl::Status s = CheckTrainSize(*train, t.seq_len); !s.ok()) return s;
  loop->train_data_ = std::move(*train);
  if (!job.data.val_path.empty()) {
    absl::StatusOr<TokenDataset> val =
        TokenDataset::Load(job.data.val_path, job.data.format, job.model.vocab_size);
    if (!val.ok()) return val.status();
    if (t.eval_windows < 1) return absl::InvalidArgumentError("train.eval_windows must be positive");
    if (absl::Status s = CheckValidationSize(*val, t.seq_len, t.eval_windows); !s.ok()) return s;
    loop->val_data_ = std::move(*val);
  }
  loop->sampler_ = std::make_unique<TrainSampler>(&loop->train_data_, t.seed, t.seq_len);
  // The one place the backend is chosen (also refuses what no backend of this
  // build can run, e.g. resources.device=gpu without CUDA).
  if (ops == nullptr) {
    absl::StatusOr<std::shared_ptr<kernels::Ops>> made = MakeOpsForJob(job, /*local_device=*/0);
    if (!made.ok()) return made.status();
    ops = *std::move(made);
  }
  loop->ops_ = ops;
  if (absl::Status s = loop->CreateParts(); !s.ok()) return s;
  return loop;
}

// The model parts this rank trains, the same structure for every layout: a
// stage of chunks (one chunk, the whole model, without a pp group), one
// DataParallelEngine per chunk under DP, and the optimizer of what the
// engines do not shard.
absl::Status TrainingLoop::CreateParts() {
  const spec::JobSpec& job = spec_;
  const spec::TrainSpec& t = job.train;
  const int pp = ctx_.pp_size();
  const int zero = static_cast<int>(job.parallelism.zero_stage.value_or(0));
  // [ep] dp x ep ranks read different micro-batches.
  const int64_t microbatches = t.global_batch_size / t.micro_batch_size / ctx_.data_size();
  absl::StatusOr<PipelinePlan> plan = MakePipelinePlan(job, ctx_.stage(), pp, microbatches);
  if (!plan.ok()) return plan.status();
  ModelPart experts;  // [ep] every chunk holds this rank's experts only
  if (ctx_.ep != nullptr && job.model.moe.enabled()) {
    absl::StatusOr<std::unique_ptr<EpExpertExchange>> exchange =
        EpExpertExchange::Create(ctx_.ep, ops_.get(), job.model.moe.num_experts);
    if (!exchange.ok()) return exchange.status();
    experts.first_expert = (*exchange)->first_expert();
    experts.held_experts = (*exchange)->num_held();
    expert_exchange_ = std::move(*exchange);
  }
  stage_ = std::make_unique<PipelineStage>(
      job.model, job.parallelism.recompute, *plan,
      TensorParallelOptions{ctx_.tp, job.parallelism.sequence_parallel, ctx_.cp}, ops_,
      experts);  // [tp] [cp] [ep]
  for (int64_t c = 0; expert_exchange_ != nullptr && c < stage_->num_chunks(); ++c) {
    stage_->model(c).SetExpertExchange(expert_exchange_.get());  // the chunks share the exchange
  }
  if (options_.initialize_parameters) stage_->InitParameters(t.seed);
  pipeline_ = std::make_unique<PipelineExecutor>(stage_.get(), ctx_.pp);  // pp null: one stage
  const int64_t param_bytes = stage_->NumParameters() * static_cast<int64_t>(sizeof(float));
  // [dp] One engine per chunk: ZeRO shards each chunk's optimizer states
  // (from stage 2 its reduced gradient, at stage 3 its parameters) over DP,
  // as Megatron's distributed optimizer does within each TP x PP coordinate.
  // [cp] Over DP x CP under context parallelism (ctx_.grad_group()): the CP
  // ranks hold the same weights and each one's gradient of its own tokens.
  // At ZeRO 0 a single chunk's engine all-reduces buckets during backward;
  // a pipeline's chunks interleave, so their arrays are summed at the step's
  // end instead (RunScheduledStep).
  comm::Communicator* grad_group = ctx_.grad_group();
  if (grad_group != nullptr && (zero > 0 || ctx_.pp == nullptr)) {
    DataParallelOptions options;
    options.zero_stage = zero;
    options.bucket_bytes = job.parallelism.bucket_mb * 1024 * 1024;
    for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
      absl::StatusOr<std::unique_ptr<DataParallelEngine>> engine =
          DataParallelEngine::Create(&stage_->model(c), grad_group, options, t, &memory_);
      if (!engine.ok()) return engine.status();
      if (TiedAcrossStages(job.model, pp)) (*engine)->CountInNormOnce(kTiedEmbedding, 2);
      (*engine)->ShardParameters();  // ZeRO-3: the chunk keeps only its shard
      dp_engines_.push_back(std::move(*engine));
    }
  } else {
    memory_.Add(MemoryKind::kParameters, param_bytes);
    memory_.Add(MemoryKind::kGradients, param_bytes);
  }
  if (zero == 0 || grad_group == nullptr) {
    // Moments in the backend's memory, stepped by ops->AdamW.
    optimizer_ = std::make_unique<AdamW>(stage_->Parameters(), stage_->Gradients(), t, *ops_);
    memory_.Add(MemoryKind::kOptimizerStates, 2 * param_bytes);
  }
  flops_per_token_ =
      ModelFlopsPerToken(job.model, stage_->model(0).NumGlobalParameters(), t.seq_len);
  if (TiedAcrossStages(job.model, pp) && TiedGradient() == nullptr) {
    // [pp] A middle stage adds zeros to the first and last stages' sum.
    const TpPlan tp = MakeTpPlan(job.model, ctx_.tp_rank(), ctx_.tp_size(),
                                 job.parallelism.sequence_parallel);
    tied_count_ = tp.vocab * job.model.hidden_size;
    tied_zeros_ = ops_->AllocateFloats(tied_count_);
  }
  return absl::OkStatus();
}

void TrainingLoop::FillTrainMicroBatch(int64_t step, int64_t micro, Batch* out) const {
  const spec::TrainSpec& t = spec_.train;
  sampler_->Fill(step,
                 MicroBatchFirst(t.global_batch_size, ctx_.data_size(), ctx_.data_rank(), t.micro_batch_size,
                                 micro),
                 t.micro_batch_size, out);
  // [cp] This rank's chunks (seq_len was checked against 2 * cp in Create).
  KeepLocalChunks(ctx_, out).IgnoreError();
}

bool TrainingLoop::IsEvalStep(int64_t step) const {
  if (!val_data_) return false;
  return step == spec_.train.steps ||
         (spec_.train.eval_interval > 0 && step % spec_.train.eval_interval == 0);
}

absl::StatusOr<StepProgress> TrainingLoop::TrainStep() {
  if (done()) {
    return absl::FailedPreconditionError(absl::StrCat("training already finished at step ", step_));
  }
  return RunScheduledStep();  // training_loop_pipeline.cc: one path for every layout
}

std::vector<std::pair<GradientPiece, std::string>> TrainingLoop::ShardPiecesWithNames() {
  std::vector<std::pair<GradientPiece, std::string>> out;
  for (const auto& e : dp_engines_) {
    const std::vector<GradientPiece> pieces = e->GradientPieces();
    const std::vector<OwnedPiece>& owned = e->owned_pieces();
    for (size_t i = 0; i < pieces.size() && i < owned.size(); ++i) {
      out.push_back({pieces[i], e->partition().tensors()[static_cast<size_t>(owned[i].tensor)].name});
    }
  }
  return out;
}

absl::Status TrainingLoop::ReduceDenseOverEp() {
  if (ctx_.ep == nullptr) return absl::OkStatus();
  if (zero_stage() < 2) {
    std::vector<TensorView> grads;
    for (LlamaModel* part : Parts()) {
      for (TensorView& g : part->Gradients()) grads.push_back(std::move(g));
    }
    return ReduceDenseGradientsOverEp(*ops_, ctx_.ep, grads);
  }
  std::vector<GradientPiece> pieces;
  std::vector<std::string> names;
  for (auto& [piece, name] : ShardPiecesWithNames()) {
    pieces.push_back(piece);
    names.push_back(std::move(name));
  }
  return ReduceDensePiecesOverEp(*ops_, ctx_.ep, pieces, names);
}

std::vector<GradientPiece> TrainingLoop::GradientPiecesToClip() {
  if (ctx_.ep != nullptr && zero_stage() >= 2) {  // [ep] shard pieces, dense ones once over EP
    std::vector<GradientPiece> pieces;
    std::vector<std::string> names;
    for (auto& [piece, name] : ShardPiecesWithNames()) {
      pieces.push_back(piece);
      names.push_back(std::move(name));
    }
    return EpShardPieces(std::move(pieces), names, ctx_.ep_size());
  }
  // [ep] Whole gradients (ZeRO 0, 1) are clipped from the model's views.
  if (dp_engines_.empty() || ctx_.ep != nullptr) {
    std::vector<TensorView> grads;
    for (LlamaModel* part : Parts()) {
      for (TensorView& g : part->Gradients()) grads.push_back(std::move(g));
    }
    if (TiedAcrossStages(spec_.model, ctx_.pp_size())) {
      // The first and the last stage hold the same summed gradient: once.
      for (TensorView& g : grads) {
        if (g.name == kTiedEmbedding) g.replicas *= 2;
      }
    }
    return EpGradientPieces(grads, ctx_.ep_size());  // dense tensors once over EP
  }
  std::vector<GradientPiece> pieces;
  for (const auto& e : dp_engines_) {
    for (const GradientPiece& g : e->GradientPieces()) pieces.push_back(g);
  }
  return pieces;
}

absl::StatusOr<double> TrainingLoop::ClipStepGradients() {
  return ClipGradients(*ops_, GradientPiecesToClip(), ctx_.GradientNormGroups(zero_stage() >= 2),
                       spec_.train.grad_clip);
}

void TrainingLoop::OptimizerUpdate(double lr, absl::Status* status) {
  if (optimizer_) {
    optimizer_->Step(lr);
    return;
  }
  for (const auto& e : dp_engines_) {
    if (absl::Status s = e->OptimizerStep(lr); !s.ok() && status->ok()) *status = s;
  }
}

int64_t TrainingLoop::optimizer_step() const {
  return optimizer_ ? optimizer_->step() : dp_engines_[0]->sharded_optimizer()->step();
}

void TrainingLoop::set_optimizer_step(int64_t step) {
  if (optimizer_) optimizer_->set_step(step);
  for (const auto& e : dp_engines_) {
    if (e->sharded_optimizer() != nullptr) e->sharded_optimizer()->set_step(step);
  }
}

absl::StatusOr<StepProgress> TrainingLoop::FinishStep(StepProgress p, int64_t step, double loss,
                                                      std::chrono::steady_clock::time_point start) {
  const spec::TrainSpec& t = spec_.train;
  step_ = step;
  tokens_ += t.global_batch_size * t.seq_len;
  p.step = step;
  p.total_steps = t.steps;
  p.loss = loss;
  p.tokens = tokens_;
  p.step_seconds = SecondsSince(start);
  p.tokens_per_second = p.step_seconds > 0
      ? static_cast<double>(t.global_batch_size * t.seq_len) / p.step_seconds : 0.0;
  p.flops_per_token = flops_per_token_;
  p.skipped_steps = skipped_steps();
  if (IsEvalStep(step)) {
    Phase("eval");
    const auto eval_start = std::chrono::steady_clock::now();
    absl::StatusOr<double> val = Evaluate();
    if (!val.ok()) return val.status();
    p.val_loss = *val;
    p.eval_seconds = SecondsSince(eval_start);
  }
  p.peak_rss_bytes = PeakRssBytes();
  if (std::optional<kernels::Ops::DeviceMemoryStats> device = ops_->device_memory()) {
    p.peak_device_bytes = device->peak_allocated_bytes;
  }
  Phase("running");
  return p;
}

absl::StatusOr<double> TrainingLoop::Evaluate() {
  if (!val_data_) {
    return absl::FailedPreconditionError("no validation data (data.val_path is empty)");
  }
  const spec::TrainSpec& t = spec_.train;
  // Windows are split contiguously over DP ranks; each window's mean loss
  // counts once.
  const int64_t windows = t.eval_windows;
  const int64_t begin = windows * ctx_.dp_rank / ctx_.dp_size;
  const int64_t end = windows * (ctx_.dp_rank + 1) / ctx_.dp_size;
  double sum = 0.0;
  for (int64_t first = begin; first < end; first += t.micro_batch_size) {
    const int64_t count = std::min(t.micro_batch_size, end - first);
    FillValidationWindows(*val_data_, t.seq_len, first, count, &batch_);
    if (absl::Status s = KeepLocalChunks(ctx_, &batch_); !s.ok()) return s;  // [cp]
    absl::StatusOr<double> loss = EvaluateBatch();
    if (!loss.ok()) return loss.status();
    sum += *loss * static_cast<double>(count);
  }
  // The sum crosses the DP group, and under PP the stages (only the last
  // one's is not zero), as a float; alone, the double stays as it is.
  if (ctx_.dp != nullptr || ctx_.pp != nullptr) {
    float total = static_cast<float>(sum);
    if (absl::Status s = AllReduceHostFloats(*ops_, ctx_.dp, &total, 1); !s.ok()) return s;
    if (absl::Status s = AllReduceHostFloats(*ops_, ctx_.pp, &total, 1); !s.ok()) return s;
    sum = total;
  }
  return sum / static_cast<double>(windows);
}

absl::StatusOr<bool> TrainingLoop::AnyRank(bool mine) {
  float flag = mine ? 1.0f : 0.0f;
  for (comm::Communicator* group : {ctx_.dp, ctx_.ep, ctx_.tp, ctx_.cp, ctx_.pp}) {
    if (absl::Status s = AllReduceHostFloats(*ops_, group, &flag, 1); !s.ok()) return s;
  }
  return flag > 0.0f;
}

absl::StatusOr<double> TrainingLoop::EvaluateBatch() {
  if (ctx_.pp != nullptr) return pipeline_->ForwardLoss(batch_);  // [pp] stage by stage
  LlamaModel& model = stage_->model(0);
  const double loss = model.ForwardLoss(batch_.inputs.data(), batch_.targets.data(),
                                        batch_.batch, batch_.seq);
  if (!model.status().ok()) return model.status();  // [tp]
  return loss;
}

// ---- The model parts --------------------------------------------------------

std::vector<LlamaModel*> TrainingLoop::Parts() {
  std::vector<LlamaModel*> parts;
  for (int64_t c = 0; c < stage_->num_chunks(); ++c) parts.push_back(&stage_->model(c));
  return parts;
}

std::vector<TensorView> TrainingLoop::PartParameters() {
  std::vector<TensorView> all;
  for (LlamaModel* part : Parts()) {
    for (TensorView& v : part->Parameters()) all.push_back(std::move(v));
  }
  return all;
}

absl::Status TrainingLoop::GatherParameters(std::vector<float>* out) {
  // Part by part; a part with a DP engine through it (ZeRO-3 holds only
  // shards: gathered over DP).
  out->clear();
  const std::vector<LlamaModel*> parts = Parts();
  for (size_t i = 0; i < parts.size(); ++i) {
    std::vector<float> part;
    if (i < dp_engines_.size()) {
      if (absl::Status s = dp_engines_[i]->GatherParameters(&part); !s.ok()) return s;
    } else {
      DownloadTensors(*ops_, parts[i]->Parameters(), &part);
    }
    out->insert(out->end(), part.begin(), part.end());
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
