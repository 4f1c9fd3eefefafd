#include "worker/engine/training_loop.h"

#include <sys/resource.h>

#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/layout.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/model/moe_stats.h"
#include "worker/engine/tensor_parallel/tp_plan.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/model/host_floats.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/ops_selection.h"
#include "worker/engine/data_parallel/sharded_checkpoint.h"

namespace loom::engine {
namespace {

constexpr char kSamplerName[] = "splitmix64-window-v1";

int64_t PeakRssBytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status CheckSpec(const spec::JobSpec& spec, int dp_size) {
  const spec::TrainSpec& t = spec.train;
  if (t.steps < 1 || t.micro_batch_size < 1 || t.global_batch_size < 1 || t.seq_len < 1) {
    return absl::InvalidArgumentError("train.steps, global_batch_size, micro_batch_size and seq_len must be positive");
  }
  if (t.global_batch_size % (t.micro_batch_size * dp_size) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.global_batch_size=", t.global_batch_size, " must be a multiple of train.micro_batch_size=",
        t.micro_batch_size, " x dp=", dp_size));
  }
  if (t.seq_len > spec.model.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("train.seq_len=", t.seq_len,
                                                   " exceeds model.max_seq_len=", spec.model.max_seq_len));
  }
  const spec::ModelSpec& m = spec.model;
  if (m.num_heads < 1 || m.num_kv_heads < 1 || m.hidden_size % m.num_heads != 0 ||
      m.num_heads % m.num_kv_heads != 0 || m.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.hidden_size=", m.hidden_size, ", num_heads=", m.num_heads, ", num_kv_heads=",
        m.num_kv_heads, ": heads must divide hidden_size with an even head dimension, and kv "
        "heads must divide heads"));
  }
  if (spec.data.train_path.empty()) return absl::InvalidArgumentError("data.train_path is required");
  const int64_t zero = spec.parallelism.zero_stage.value_or(0);
  if (zero < 0 || zero > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.zero_stage=", zero, " must be 0, 1, 2 or 3"));
  }
  if (spec.parallelism.bucket_mb < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.bucket_mb=",
                                                   spec.parallelism.bucket_mb, " must be positive"));
  }
  return absl::OkStatus();
}

// The layout this rank runs: the spec's with the axes of its context (without
// a group the axis runs as 1 whatever the spec says: the standalone trainer
// ignores the layout). CP and EP have no group in the context.
spec::Layout ContextLayout(const spec::JobSpec& spec, const ParallelContext& ctx) {
  spec::Layout l = spec::LayoutOf(spec);
  l.dp = ctx.dp_size;
  l.tp = ctx.tp_size();
  l.pp = ctx.pp_size();
  l.cp = 1;
  l.ep = 1;
  const int64_t per_step = spec.train.micro_batch_size * ctx.dp_size;
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

TrainingLoop::TrainingLoop(const spec::JobSpec& spec, const ParallelContext& ctx)
    : spec_(spec), ctx_(ctx) {}

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
    const spec::JobSpec& spec, const ParallelContext& ctx, std::shared_ptr<kernels::Ops> ops) {
  spec::JobSpec resolved = spec;
  if (resolved.model.num_kv_heads == 0) resolved.model.num_kv_heads = resolved.model.num_heads;
  if (absl::Status s = CheckSpec(resolved, ctx.dp_size); !s.ok()) return s;
  if (absl::Status s = CheckContextMatchesSpec(ctx, resolved); !s.ok()) return s;
  // The engine's limits for this layout (common/spec/job_spec_rules.h, the
  // same check as at submission).
  if (absl::Status s = spec::ValidateEngineRuns(resolved, ContextLayout(resolved, ctx)); !s.ok()) {
    return s;
  }
  std::unique_ptr<TrainingLoop> loop(new TrainingLoop(resolved, ctx));
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
  if (loop->ctx_.pp != nullptr) {  // [pp] training_loop_pipeline.cc
    if (absl::Status s = loop->CreatePipeline(); !s.ok()) return s;
    return loop;
  }

  loop->model_ = std::make_unique<LlamaModel>(
      job.model, job.parallelism.recompute, ops,
      TensorParallelOptions{loop->ctx_.tp, job.parallelism.sequence_parallel});  // [tp]
  loop->model_->InitParameters(t.seed);
  const int64_t param_bytes = loop->model_->NumParameters() * static_cast<int64_t>(sizeof(float));
  int zero_stage = 0;
  if (loop->ctx_.dp != nullptr) {
    DataParallelOptions options;
    options.zero_stage = static_cast<int>(job.parallelism.zero_stage.value_or(0));
    options.bucket_bytes = job.parallelism.bucket_mb * 1024 * 1024;
    absl::StatusOr<std::unique_ptr<DataParallelEngine>> engine = DataParallelEngine::Create(
        loop->model_.get(), loop->ctx_.dp, options, t, &loop->memory_);
    if (!engine.ok()) return engine.status();
    (*engine)->ShardParameters();
    loop->dp_engines_.push_back(std::move(*engine));
    zero_stage = options.zero_stage;
  } else {
    loop->memory_.Add(MemoryKind::kParameters, param_bytes);
    loop->memory_.Add(MemoryKind::kGradients, param_bytes);
  }
  if (zero_stage == 0) {
    // Moments in the backend's memory, updated by ops->AdamW.
    loop->optimizer_ = std::make_unique<AdamW>(loop->model_->Parameters(),
                                               loop->model_->Gradients(), t, ops.get());
    loop->memory_.Add(MemoryKind::kOptimizerStates, 2 * param_bytes);
  }
  loop->flops_per_token_ =
      ModelFlopsPerToken(job.model, loop->model_->NumGlobalParameters(), t.seq_len);
  return loop;
}

void TrainingLoop::FillTrainMicroBatch(int64_t step, int64_t micro, Batch* out) const {
  const spec::TrainSpec& t = spec_.train;
  sampler_->Fill(step,
                 MicroBatchFirst(t.global_batch_size, ctx_.dp_size, ctx_.dp_rank, t.micro_batch_size, micro),
                 t.micro_batch_size, out);
}

bool TrainingLoop::IsEvalStep(int64_t step) const {
  if (!val_data_) return false;
  return step == spec_.train.steps ||
         (spec_.train.eval_interval > 0 && step % spec_.train.eval_interval == 0);
}

absl::StatusOr<StepProgress> TrainingLoop::TrainStep() {
  const spec::TrainSpec& t = spec_.train;
  if (done()) {
    return absl::FailedPreconditionError(absl::StrCat("training already finished at step ", step_));
  }
  if (pipeline_) return PipelineTrainStep();  // [pp]
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = step_ + 1;
  const int64_t total_micro = t.global_batch_size / t.micro_batch_size;
  const int64_t local_micro = total_micro / ctx_.dp_size;
  // Each micro-batch's gradient is scaled so the DP sum is the mean over the
  // whole global batch.
  const float loss_scale = 1.0f / static_cast<float>(total_micro);

  memory_.ResetPeaks();
  ops_->ResetPeakDeviceMemory();
  DataParallelEngine* dp = dp_engine();
  if (dp != nullptr) {
    dp->BeginStep();
  } else {
    model_->ZeroGradients();
  }
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < local_micro; ++micro) {
    FillTrainMicroBatch(step, micro, &batch_);
    Phase("forward_backward", micro);
    if (dp != nullptr) dp->BeginMicroBatch(micro + 1 == local_micro);
    loss_sum += model_->ForwardBackward(batch_.inputs.data(), batch_.targets.data(), batch_.batch,
                                        batch_.seq, loss_scale);
    if (!model_->status().ok()) return model_->status();  // [tp] a failed TP collective
    if (dp != nullptr) {
      if (absl::Status s = dp->EndMicroBatch(); !s.ok()) return s;
    }
  }
  memory_.Set(MemoryKind::kActivations, model_->ActivationBytes());
  float loss = static_cast<float>(loss_sum / static_cast<double>(total_micro));
  StepProgress p;
  if (spec_.model.moe.enabled()) {  // [moe] loads over DP, the bias update, the step's stats
    absl::StatusOr<MoeSummary> moe = FinishMoeStep(*model_, ctx_.dp, total_micro);
    if (!moe.ok()) return moe.status();
    p.moe = std::move(*moe);
  }
  Phase("reduce_gradients");
  if (dp != nullptr) {
    if (absl::Status s = dp->FinishReduction(); !s.ok()) return s;
  }
  if (absl::Status s = AllReduceHostFloats(*ops_, ctx_.dp, &loss, 1); !s.ok()) return s;
  absl::StatusOr<double> norm = ClipStepGradients();
  if (!norm.ok()) return norm.status();
  p.grad_norm = *norm;
  p.lr = LearningRate(t, step);
  Phase("optimizer");
  absl::Status updated;
  OptimizerUpdate(p.lr, &updated);
  if (!updated.ok()) return updated;
  return FinishStep(std::move(p), step, loss, start);
}

std::vector<GradientPiece> TrainingLoop::GradientPiecesToClip() {
  if (dp_engines_.empty()) {
    std::vector<TensorView> grads;
    for (LlamaModel* part : Parts()) {
      for (TensorView& g : part->Gradients()) grads.push_back(std::move(g));
    }
    if (pipeline_ && TiedAcrossStages(spec_.model, ctx_.pp_size())) {
      // The first and the last stage hold the same summed gradient: once.
      for (TensorView& g : grads) {
        if (g.name == kTiedEmbedding) g.replicas *= 2;
      }
    }
    return GradientPieces(grads);
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
    absl::StatusOr<double> loss = EvaluateBatch();
    if (!loss.ok()) return loss.status();
    sum += *loss * static_cast<double>(count);
  }
  // The sum crosses the DP group, and under PP the stages (only the last
  // one's is not zero), as a float; alone, the double stays as it is.
  comm::Communicator* pp = pipeline_ ? ctx_.pp : nullptr;
  if (ctx_.dp != nullptr || pp != nullptr) {
    float total = static_cast<float>(sum);
    if (absl::Status s = AllReduceHostFloats(*ops_, ctx_.dp, &total, 1); !s.ok()) return s;
    if (absl::Status s = AllReduceHostFloats(*ops_, pp, &total, 1); !s.ok()) return s;
    sum = total;
  }
  return sum / static_cast<double>(windows);
}

absl::StatusOr<double> TrainingLoop::EvaluateBatch() {
  if (pipeline_) return pipeline_->ForwardLoss(batch_);  // [pp]
  const double loss = model_->ForwardLoss(batch_.inputs.data(), batch_.targets.data(),
                                          batch_.batch, batch_.seq);
  if (!model_->status().ok()) return model_->status();  // [tp]
  return loss;
}

// ---- [tp] Checkpoints under tensor parallelism --------------------------------

std::vector<LlamaModel*> TrainingLoop::Parts() {
  if (!pipeline_) return {model_.get()};
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

absl::Status TrainingLoop::UnshardForCheckpoint() {
  full_states_.clear();
  for (const auto& e : dp_engines_) {
    const int64_t n = e->partition().total();
    kernels::Buffer m = ops_->AllocateFloats(n), v = ops_->AllocateFloats(n);
    ops_->Fill(m.f32(), n, 0.0f);
    ops_->Fill(v.f32(), n, 0.0f);
    if (absl::Status s = e->GatherOptimizerStates(m.f32(), v.f32()); !s.ok()) return s;
    if (absl::Status s = e->MaterializeParameters(); !s.ok()) return s;
    full_states_.emplace_back(std::move(m), std::move(v));
  }
  return absl::OkStatus();
}

void TrainingLoop::ReshardAfterCheckpoint(bool loaded) {
  for (size_t i = 0; i < dp_engines_.size() && i < full_states_.size(); ++i) {
    if (loaded) {
      dp_engines_[i]->ScatterOptimizerStates(full_states_[i].first.f32(),
                                             full_states_[i].second.f32());
    }
    dp_engines_[i]->ShardParameters();  // ZeRO-3: the (loaded) parameters become the shard
  }
  full_states_.clear();
}

std::vector<TensorView> TrainingLoop::OptimizerStates() {
  if (optimizer_) return optimizer_->States();
  std::vector<TensorView> m, v;
  const std::vector<LlamaModel*> parts = Parts();  // engine i reduces part i
  for (size_t i = 0; i < dp_engines_.size() && i < full_states_.size(); ++i) {
    const std::vector<TensorView> params = parts[i]->Parameters();
    const std::vector<FlatTensor>& flat = dp_engines_[i]->partition().tensors();
    for (size_t j = 0; j < params.size(); ++j) {
      m.push_back({"optimizer.exp_avg." + params[j].name, params[j].shape,
                   full_states_[i].first.f32() + flat[j].offset});
      v.push_back({"optimizer.exp_avg_sq." + params[j].name, params[j].shape,
                   full_states_[i].second.f32() + flat[j].offset});
    }
  }
  for (TensorView& t : v) m.push_back(std::move(t));
  return m;
}

// The parameters (the whole model's, or a pipeline stage's) and their AdamW
// moments, each moment with its parameter's sharding.
std::vector<TrainingLoop::TpStaged> TrainingLoop::CheckpointState(
    const std::vector<TensorView>& parameters) {
  std::vector<TpStaged> staged;
  std::map<std::string, TensorView> by_name;
  for (const TensorView& p : parameters) {
    by_name[p.name] = p;
    staged.push_back({p, {}});
  }
  for (TensorView s : OptimizerStates()) {
    // "optimizer.exp_avg.<param>" / "optimizer.exp_avg_sq.<param>"
    const std::string param = s.name.substr(s.name.find('.', sizeof("optimizer")) + 1);
    const TensorView& p = by_name.at(param);
    s.global_shape = p.global_shape;
    s.shard_axis = p.shard_axis;
    s.shard_offset = p.shard_offset;
    s.replicas = p.replicas;
    staged.push_back({s, {}});
  }
  return staged;
}

absl::StatusOr<std::string> TrainingLoop::SaveTensorParallelCheckpoint(const std::string& root,
                                                                       CheckpointContent content) {
  std::vector<TpStaged> staged = CheckpointState(PartParameters());
  CheckpointFile model{"model-tp00-pp00.safetensors", "model", {}, {}};
  CheckpointFile optimizer{"optimizer-tp00-pp00-dp00.safetensors", "optimizer", {}, {}};
  // DP rank 0's TP group writes (the DP ranks hold the same values).
  for (TpStaged& t : staged) {
    if (ctx_.dp_rank != 0) break;
    if (absl::Status s = GatherGlobal(*ops_, t.local, ctx_.tp, &t.global); !s.ok()) return s;
    CheckpointFile& file = t.local.name.rfind("optimizer.", 0) == 0 ? optimizer : model;
    file.tensors.push_back({t.local.name, t.local.GlobalShape(), t.global.data()});
  }
  content.state["layout"]["tp"] = ctx_.tp->size();
  content.files = {std::move(model), std::move(optimizer)};
  absl::StatusOr<std::string> dir = std::string();
  if (ctx_.dp_rank == 0 && ctx_.tp->rank() == 0) dir = CommitCheckpoint(root, content, spec_.checkpoint.keep);
  // The writer tells its TP group, then each of those tells its DP group;
  // this is also the barrier.
  int32_t ok = dir.ok() ? 1 : 0;
  if (ctx_.dp_rank == 0) {
    if (absl::Status s = BroadcastHostInts(*ops_, ctx_.tp, &ok, 1, 0);
        !s.ok()) {
      return s;
    }
  }
  if (ctx_.dp != nullptr) {
    if (absl::Status s = BroadcastHostInts(*ops_, ctx_.dp, &ok, 1, 0);
        !s.ok()) {
      return s;
    }
  }
  if (!dir.ok()) return dir;
  if (ok != 1) {
    return absl::InternalError(absl::StrCat("the writing rank failed to commit the checkpoint of step ",
                                            step_, " under ", root));
  }
  return dir;
}

absl::Status TrainingLoop::GatherParameters(std::vector<float>* out) {
  // ZeRO-3 (not under PP) holds only shards: gathered over DP.
  if (!pipeline_ && dp_engine() != nullptr) return dp_engine()->GatherParameters(out);
  out->clear();
  DownloadTensors(*ops_, PartParameters(), out);
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainingLoop::SaveCheckpoint(const std::string& root) {
  Phase("checkpoint");
  CheckpointContent content;
  content.step = step_;
  content.model = spec_.model;
  content.state = {
      {"tokens", tokens_},
      {"optimizer_step", optimizer_step()},
      {"data", {{"sampler", kSamplerName}, {"seed", spec_.train.seed}, {"next_step", step_ + 1},
                {"seq_len", spec_.train.seq_len},
                {"global_batch_size", spec_.train.global_batch_size}}},
      {"rng", {{"seed", spec_.train.seed}, {"counter", step_}}},
      {"layout", {{"dp", ctx_.dp_size}, {"tp", 1}, {"pp", 1}, {"zero_stage", zero_stage()}}}};
  // [moe] The selection biases are state, not parameters (docs/moe.md).
  if (model_ != nullptr && spec_.model.moe.enabled()) {
    content.state["moe_bias"] = ExpertBiasesToJson(*model_);
  }
  if (pipeline_ || ctx_.tp != nullptr) {  // [tp] [pp] global tensors
    const bool unshard = zero_stage() > 0;
    if (unshard) {
      if (absl::Status s = UnshardForCheckpoint(); !s.ok()) return s;
    }
    absl::StatusOr<std::string> dir = pipeline_ ? SavePipelineCheckpoint(root, std::move(content))
                                                : SaveTensorParallelCheckpoint(root, std::move(content));
    if (unshard) ReshardAfterCheckpoint(/*loaded=*/false);
    return dir;
  }
  if (zero_stage() > 0) {
    return SaveShardedCheckpoint(root, content, *model_, *dp_engine(), *ctx_.dp,
                                 spec_.checkpoint.keep);
  }
  absl::StatusOr<std::string> dir = std::string();
  if (ctx_.dp_rank == 0) {
    // The writer reads host memory: a device backend's tensors are copied
    // down first, one tensor at a time (nothing to copy on the CPU).
    const HostStaging params(*ops_, model_->Parameters(), /*download=*/true);
    const HostStaging states(*ops_, optimizer_->States(), /*download=*/true);
    content.files.push_back({"model-tp00-pp00.safetensors", "model", params.host(), {}});
    content.files.push_back(
        {"optimizer-tp00-pp00-dp00.safetensors", "optimizer", states.host(), {}});
    dir = CommitCheckpoint(root, content, spec_.checkpoint.keep);
  }
  if (ctx_.dp != nullptr) {
    // Rank 0 tells everyone whether the commit happened; this is also the barrier.
    int32_t ok = dir.ok() ? 1 : 0;
    if (absl::Status s = BroadcastHostInts(*ops_, ctx_.dp, &ok, 1, 0);
        !s.ok()) {
      return s;
    }
    if (ctx_.dp_rank != 0 && ok != 1) {
      return absl::InternalError(absl::StrCat("DP rank 0 failed to write the checkpoint of step ",
                                              step_, " under ", root));
    }
  }
  return dir;
}

absl::StatusOr<LoadedCheckpoint> TrainingLoop::RestoreNewest(const std::string& root) {
  // [tp] [pp] with ZeRO: loaded as whole tensors, sharded over DP after.
  const bool unshard = (pipeline_ || ctx_.tp != nullptr) && zero_stage() > 0;
  if (unshard) {
    if (absl::Status s = UnshardForCheckpoint(); !s.ok()) return s;
  }
  std::vector<FlatSlice> into;
  std::vector<TpStaged> tp_staged;  // [tp] global tensors, loaded then sliced
  std::unique_ptr<HostStaging> staged;  // one rank: host copies for a device backend
  std::unique_ptr<RestoreStaging> sharded;  // ZeRO: host copies of the shards
  if (pipeline_ && ctx_.tp == nullptr && HostAddressable(*ops_)) {  // [pp] whole tensors, in place
    for (const TpStaged& t : CheckpointState(PartParameters())) {
      into.push_back({t.local.name, t.local.shape, 0, t.local.numel(), t.local.data});
    }
  } else if (ctx_.tp != nullptr || pipeline_) {  // [tp] [pp] host globals, sliced up after
    tp_staged = CheckpointState(PartParameters());  // [pp]
    for (TpStaged& t : tp_staged) {
      const std::vector<int64_t>& shape = t.local.GlobalShape();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      t.global.assign(static_cast<size_t>(n), 0.0f);
      into.push_back({t.local.name, shape, 0, n, t.global.data()});
    }
  } else if (zero_stage() > 0) {
    // As below: the shards go up only once the step has loaded completely.
    sharded = std::make_unique<RestoreStaging>(*ops_, ShardedRestoreTargets(*model_, *dp_engine()));
    into = sharded->host();
  } else {
    std::vector<TensorView> whole = model_->Parameters();
    for (TensorView& s : optimizer_->States()) whole.push_back(std::move(s));
    // The loader writes host memory; the tensors go up only once a step has
    // loaded completely (a refused step leaves the backend untouched).
    staged = std::make_unique<HostStaging>(*ops_, whole, /*download=*/false);
    for (const TensorView& t : staged->host()) into.push_back({t.name, t.shape, 0, t.numel(), t.data});
  }
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(root, spec_.model, into);
  if (!loaded.ok()) {
    if (unshard) ReshardAfterCheckpoint(/*loaded=*/false);  // as it was
    return loaded.status();
  }
  if (staged != nullptr) staged->Upload();
  if (sharded != nullptr) sharded->Upload();
  for (const TpStaged& t : tp_staged) ScatterGlobal(*ops_, t.global, t.local);  // [tp] [pp]
  if (unshard) ReshardAfterCheckpoint(/*loaded=*/true);
  const nlohmann::json& state = loaded->state;
  auto get_int = [&state](const char* key, int64_t fallback) {
    return state.contains(key) && state[key].is_number_integer() ? state[key].get<int64_t>()
                                                                  : fallback;
  };
  step_ = loaded->step;
  tokens_ = get_int("tokens", step_ * spec_.train.global_batch_size * spec_.train.seq_len);
  set_optimizer_step(get_int("optimizer_step", step_));
  if (model_ != nullptr && spec_.model.moe.enabled() && state.contains("moe_bias")) {  // [moe]
    if (absl::Status s = RestoreExpertBiases(state["moe_bias"], *model_); !s.ok()) return s;
  }
  return loaded;
}

}  // namespace loom::engine
