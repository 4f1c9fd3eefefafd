#include "worker/engine/training_loop.h"

#include <sys/resource.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/optim/grad_clip.h"
#include "worker/engine/optim/lr_schedule.h"

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

absl::Status CheckSpec(const spec::JobSpec& spec, int dp_rank, int dp_size,
                       comm::Communicator* dp_comm) {
  const spec::TrainSpec& t = spec.train;
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    return absl::InvalidArgumentError(absl::StrCat("dp rank ", dp_rank, " of ", dp_size, " is not a valid data-parallel coordinate"));
  }
  if (dp_size > 1 && (dp_comm == nullptr || dp_comm->size() != dp_size)) {
    return absl::InvalidArgumentError(absl::StrCat("dp size ", dp_size, " needs a DP communicator of that size"));
  }
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
  if (t.precision != spec::Precision::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat("train.precision=", spec::PrecisionName(t.precision),
                                                   " is not supported by the CPU engine (use fp32)"));
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
  return absl::OkStatus();
}

}  // namespace

double ModelFlopsPerToken(const spec::ModelSpec& m, int64_t num_parameters, int64_t seq_len) {
  const int64_t matmul_params =
      num_parameters - (m.tie_embeddings ? 0 : m.vocab_size * m.hidden_size);
  return 6.0 * static_cast<double>(matmul_params) +
         12.0 * static_cast<double>(m.num_layers * m.hidden_size * seq_len);
}

TrainingLoop::TrainingLoop(const spec::JobSpec& spec, int dp_rank, int dp_size,
                           comm::Communicator* dp_comm)
    : spec_(spec), dp_rank_(dp_rank), dp_size_(dp_size), dp_comm_(dp_size > 1 ? dp_comm : nullptr) {}

TrainingLoop::~TrainingLoop() = default;

absl::StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Create(const spec::JobSpec& spec,
                                                                   int dp_rank, int dp_size,
                                                                   comm::Communicator* dp_comm) {
  spec::JobSpec resolved = spec;
  if (resolved.model.num_kv_heads == 0) resolved.model.num_kv_heads = resolved.model.num_heads;
  if (absl::Status s = CheckSpec(resolved, dp_rank, dp_size, dp_comm); !s.ok()) return s;
  std::unique_ptr<TrainingLoop> loop(new TrainingLoop(resolved, dp_rank, dp_size, dp_comm));
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

  loop->model_ = std::make_unique<LlamaModel>(job.model, job.parallelism.recompute);
  loop->model_->InitParameters(t.seed);
  loop->optimizer_ =
      std::make_unique<AdamW>(loop->model_->Parameters(), loop->model_->Gradients(), t);
  if (loop->dp_comm_ != nullptr) {
    loop->reducer_ = std::make_unique<GradientReducer>(
        loop->model_->Gradients(), job.parallelism.bucket_mb * 1024 * 1024);
  }
  loop->flops_per_token_ =
      ModelFlopsPerToken(job.model, loop->model_->NumParameters(), t.seq_len);
  return loop;
}

void TrainingLoop::FillTrainMicroBatch(int64_t step, int64_t micro, Batch* out) const {
  const spec::TrainSpec& t = spec_.train;
  sampler_->Fill(step,
                 MicroBatchFirst(t.global_batch_size, dp_size_, dp_rank_, t.micro_batch_size, micro),
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
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = step_ + 1;
  const int64_t total_micro = t.global_batch_size / t.micro_batch_size;
  const int64_t local_micro = total_micro / dp_size_;
  // Each micro-batch's gradient is scaled so the DP sum is the mean over the
  // whole global batch.
  const float loss_scale = 1.0f / static_cast<float>(total_micro);

  model_->ZeroGradients();
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < local_micro; ++micro) {
    FillTrainMicroBatch(step, micro, &batch_);
    loss_sum += model_->ForwardBackward(batch_.inputs.data(), batch_.targets.data(), batch_.batch,
                                        batch_.seq, loss_scale);
  }
  float loss = static_cast<float>(loss_sum / static_cast<double>(total_micro));
  if (dp_comm_ != nullptr) {
    if (absl::Status s = reducer_->AllReduceSum(*dp_comm_); !s.ok()) return s;
    if (absl::Status s = dp_comm_->AllReduce(std::span<float>(&loss, 1)); !s.ok()) return s;
  }
  const std::vector<TensorView> grads = model_->Gradients();
  StepProgress p;
  p.grad_norm = ClipByGlobalNorm(grads, t.grad_clip);
  p.lr = LearningRate(t, step);
  optimizer_->Step(p.lr);
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
    const auto eval_start = std::chrono::steady_clock::now();
    absl::StatusOr<double> val = Evaluate();
    if (!val.ok()) return val.status();
    p.val_loss = *val;
    p.eval_seconds = SecondsSince(eval_start);
  }
  p.peak_rss_bytes = PeakRssBytes();
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
  const int64_t begin = windows * dp_rank_ / dp_size_;
  const int64_t end = windows * (dp_rank_ + 1) / dp_size_;
  double sum = 0.0;
  for (int64_t first = begin; first < end; first += t.micro_batch_size) {
    const int64_t count = std::min(t.micro_batch_size, end - first);
    FillValidationWindows(*val_data_, t.seq_len, first, count, &batch_);
    sum += static_cast<double>(model_->ForwardLoss(batch_.inputs.data(), batch_.targets.data(),
                                                   batch_.batch, batch_.seq)) *
           static_cast<double>(count);
  }
  float total = static_cast<float>(sum);
  if (dp_comm_ != nullptr) {
    if (absl::Status s = dp_comm_->AllReduce(std::span<float>(&total, 1)); !s.ok()) return s;
    sum = total;
  }
  return sum / static_cast<double>(windows);
}

absl::StatusOr<std::string> TrainingLoop::SaveCheckpoint(const std::string& root) {
  absl::StatusOr<std::string> dir = std::string();
  if (dp_rank_ == 0) {
    CheckpointContent content;
    content.step = step_;
    content.model = spec_.model;
    content.files.push_back({"model-tp00-pp00.safetensors", "model", model_->Parameters()});
    content.files.push_back(
        {"optimizer-tp00-pp00-dp00.safetensors", "optimizer", optimizer_->States()});
    content.state = {
        {"tokens", tokens_},
        {"optimizer_step", optimizer_->step()},
        {"data", {{"sampler", kSamplerName}, {"seed", spec_.train.seed}, {"next_step", step_ + 1},
                  {"seq_len", spec_.train.seq_len},
                  {"global_batch_size", spec_.train.global_batch_size}}},
        {"rng", {{"seed", spec_.train.seed}, {"counter", step_}}},
        {"layout", {{"dp", dp_size_}, {"tp", 1}, {"pp", 1}, {"zero_stage", 0}}}};
    dir = CommitCheckpoint(root, content, spec_.checkpoint.keep);
  }
  if (dp_comm_ != nullptr) {
    // Rank 0 tells everyone whether the commit happened; this is also the barrier.
    float ok = dir.ok() ? 1.0f : 0.0f;
    if (absl::Status s = dp_comm_->Broadcast(std::span<float>(&ok, 1), 0); !s.ok()) return s;
    if (dp_rank_ != 0 && ok != 1.0f) {
      return absl::InternalError(absl::StrCat("DP rank 0 failed to write the checkpoint of step ",
                                              step_, " under ", root));
    }
  }
  return dir;
}

absl::StatusOr<LoadedCheckpoint> TrainingLoop::RestoreNewest(const std::string& root) {
  std::vector<TensorView> into = model_->Parameters();
  for (TensorView& s : optimizer_->States()) into.push_back(std::move(s));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(root, spec_.model, into);
  if (!loaded.ok()) return loaded.status();
  const nlohmann::json& state = loaded->state;
  auto get_int = [&state](const char* key, int64_t fallback) {
    return state.contains(key) && state[key].is_number_integer() ? state[key].get<int64_t>()
                                                                  : fallback;
  };
  step_ = loaded->step;
  tokens_ = get_int("tokens", step_ * spec_.train.global_batch_size * spec_.train.seq_len);
  optimizer_->set_step(get_int("optimizer_step", step_));
  return loaded;
}

}  // namespace loom::engine
