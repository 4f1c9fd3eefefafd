// The training loop of one data-parallel rank: builds the model, optimizer and
// data from a JobSpec, and runs optimizer steps (gradient accumulation over
// this rank's micro-batches, DP gradient all-reduce, global-norm clipping,
// AdamW), evaluation and checkpoints. Deterministic: the same spec gives the
// same losses bit for bit, and a loop restored from a checkpoint continues
// exactly as the uninterrupted one would have.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/comm/communicator.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"
#include "worker/engine/data/batch_sampler.h"
#include "worker/engine/data/token_dataset.h"
#include "worker/engine/grad_reducer.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/progress.h"

namespace loom::engine {

class TrainingLoop {
 public:
  // spec.data paths are used as given (resolve relative paths first). dp_comm
  // may be nullptr when dp_size == 1; otherwise its size must be dp_size.
  // Fails with INVALID_ARGUMENT naming the field for a spec this engine cannot
  // run (batch not divisible, seq_len > max_seq_len, non-fp32 precision), and
  // with the data loader's error for a missing or malformed data file.
  static absl::StatusOr<std::unique_ptr<TrainingLoop>> Create(const spec::JobSpec& spec,
                                                              int dp_rank = 0, int dp_size = 1,
                                                              comm::Communicator* dp_comm = nullptr);
  ~TrainingLoop();

  // Trains step() + 1 and evaluates when it is an evaluation step
  // (step % eval_interval == 0, or the last step).
  absl::StatusOr<StepProgress> TrainStep();
  // Mean cross-entropy over the validation windows (see docs/engine.md);
  // collective over the DP group. FAILED_PRECONDITION without validation data.
  absl::StatusOr<double> Evaluate();

  // Commits <root>/step_NNNNNNNN with parameters, AdamW moments and loop state
  // and prunes to checkpoint.keep. DP rank 0 writes; every rank waits for it.
  // Returns the step directory.
  absl::StatusOr<std::string> SaveCheckpoint(const std::string& root);
  // Loads the newest loadable checkpoint under root (falling back past refused
  // ones, listed in the result). NOT_FOUND when root holds none.
  absl::StatusOr<LoadedCheckpoint> RestoreNewest(const std::string& root);

  int64_t step() const { return step_; }
  int64_t total_steps() const { return spec_.train.steps; }
  bool done() const { return step_ >= spec_.train.steps; }
  bool has_validation() const { return val_data_.has_value(); }
  double flops_per_token() const { return flops_per_token_; }
  const spec::JobSpec& spec() const { return spec_; }
  LlamaModel& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  // The micro-batch this rank trains as micro-batch `micro` of step `step`.
  void FillTrainMicroBatch(int64_t step, int64_t micro, Batch* out) const;

 private:
  TrainingLoop(const spec::JobSpec& spec, int dp_rank, int dp_size, comm::Communicator* dp_comm);
  bool IsEvalStep(int64_t step) const;

  spec::JobSpec spec_;
  int dp_rank_;
  int dp_size_;
  comm::Communicator* dp_comm_;  // nullptr: single rank
  TokenDataset train_data_;
  std::optional<TokenDataset> val_data_;
  std::unique_ptr<TrainSampler> sampler_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradientReducer> reducer_;
  int64_t step_ = 0;
  int64_t tokens_ = 0;
  double flops_per_token_ = 0;
  Batch batch_;
};

// 6*N + 12*L*h*s, N counting the parameters that take part in matmuls: all of
// them except an untied input embedding table (a lookup).
double ModelFlopsPerToken(const spec::ModelSpec& model, int64_t num_parameters, int64_t seq_len);

}  // namespace loom::engine
