// The training loop of one rank: builds the model (or its pipeline stage),
// optimizer and data from a JobSpec and the rank's ParallelContext, and runs
// optimizer steps (gradient accumulation over this rank's micro-batches, DP
// gradient reduction and the ZeRO stage of parallelism.zero_stage through the
// DataParallelEngine, one global-norm clipping over the context's groups,
// AdamW), evaluation and checkpoints. The axes compose: ZeRO 1-3 under TP
// and under PP (one DataParallelEngine per pipeline chunk), and under CP
// over DP x CP (ParallelContext::grad_group()). Deterministic: the same spec gives the
// same losses bit for bit, and a loop restored from a checkpoint continues
// exactly as the uninterrupted one would have.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/comm/communicator.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"
#include "worker/engine/data/batch_sampler.h"
#include "worker/engine/data/token_dataset.h"
#include "worker/engine/memory/memory_tracker.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/clip_gradients.h"
#include "worker/engine/parallel/parallel_context.h"
#include "worker/engine/pipeline_parallel/pipeline_executor.h"  // [pp]
#include "worker/engine/pipeline_parallel/pipeline_stage.h"     // [pp]
#include "worker/engine/progress.h"
#include "worker/engine/data_parallel/dp_engine.h"
#include "worker/engine/checkpoint/distributed_save.h"
#include "worker/engine/snapshot/snapshot.h"

namespace loom::engine {

struct StatePiece;

struct LoopOptions {
  // false: the parameters are left as allocated, for a loop whose state a
  // snapshot restore overwrites before its first step (RestoreSnapshot
  // writes every piece), which saves drawing the whole model's random init.
  bool initialize_parameters = true;
};

inline constexpr char kTiedEmbedding[] = "model.embed_tokens.weight";

// Fault drills of bad steps (LOOM_TEST_FAULT's nan_grad and loss_spike,
// worker/trainer/fault_injection.h): 0 leaves a step alone.
struct StepFaults {
  // This rank writes a NaN into the gradient it holds, after the reduction
  // and before the norm, at this step (every rank's norm is then NaN).
  int64_t nan_gradient_step = 0;
  // The step's loss is multiplied by loss_spike_scale after its reduction
  // (set it on every rank: the loss is the job's); the update is applied as
  // usual, so only a rollback undoes it.
  int64_t loss_spike_step = 0;
  double loss_spike_scale = 1000;
};

class TrainingLoop {
 public:
  // spec.data paths are used as given (resolve relative paths first). ctx:
  // this rank's groups (parallel/parallel_context.h); the default is one
  // rank. parallelism.zero_stage (0..3) applies when there is a DP group.
  // Fails with
  // INVALID_ARGUMENT naming the field for a spec this engine cannot run
  // (spec::ValidateEngineRuns on the context's layout: batch not divisible,
  // seq_len > max_seq_len, an axis the model cannot be cut along), and with
  // the data loader's error for a missing or malformed data file.
  //
  // [tp] ctx.tp: this rank's tensor-parallel group (the assignment's "tp"
  // group); its size must be parallelism.tp. The ranks of one TP group share the DP coordinate
  // (dp_rank, dp_size), so they train the same micro-batches, as they must.
  // parallelism.sequence_parallel applies under TP.
  //
  // [pp] ctx.pp: this rank's pipeline group (the assignment's "pp" group,
  // rank = stage); its size must be parallelism.pp. The stage's layers and instruction list come from
  // MakePipelinePlan (pipeline_parallel/pipeline_plan.h); see docs/pipeline.md.
  //
  // ops: the backend to train on; null picks it from the spec
  // (MakeOpsForJob in ops_selection.h: resources.device and train.precision,
  // CUDA device 0). Every access to parameters, gradients, optimizer states
  // and activations goes through the backend, and the dp, tp and pp
  // communicators receive only backend memory, as NCCL requires
  // (docs/engine.md, "Device memory").
  static absl::StatusOr<std::unique_ptr<TrainingLoop>> Create(
      const spec::JobSpec& spec, const ParallelContext& ctx,
      std::shared_ptr<kernels::Ops> ops = nullptr, LoopOptions options = {});
  // The same with the context made from its parts (ParallelContext::Make),
  // for tests and tools that hold loose groups.
  static absl::StatusOr<std::unique_ptr<TrainingLoop>> Create(
      const spec::JobSpec& spec, int dp_rank = 0, int dp_size = 1,
      comm::Communicator* dp_comm = nullptr, comm::Communicator* tp_comm = nullptr,
      comm::Communicator* pp_comm = nullptr, std::shared_ptr<kernels::Ops> ops = nullptr);
  ~TrainingLoop();

  // Trains step() + 1 and evaluates when it is an evaluation step
  // (step % eval_interval == 0, or the last step). A step whose gradient norm
  // or loss is not finite is not applied (no optimizer update, the data moves
  // on): its progress names it in bad_step. A step marked by SkipBatch is not
  // trained at all.
  absl::StatusOr<StepProgress> TrainStep();
  // Marks batch `step` (a step not yet trained) to be skipped: when the loop
  // reaches it, the step counts (data position, step counter, learning rate
  // schedule) but trains nothing and applies nothing; its progress carries
  // `reason` in bad_step and `loss` as its loss. How a loss spike's batch is
  // left out after the rollback (training_run.cc).
  void SkipBatch(int64_t step, std::string reason, double loss);
  void set_step_faults(StepFaults faults) { faults_ = faults; }
  // Steps counted but not applied so far (non-finite or skipped): the step
  // counter less the optimizer's, so snapshots and checkpoints carry it.
  int64_t skipped_steps() const { return step_ - optimizer_step(); }
  // Whether any rank of the job passes true: every rank gets the same answer.
  // A flag's sum crosses each group of the mesh in turn (DP, EP, TP, CP, PP),
  // which together reach every rank. Collective: every rank calls it at the
  // same point (the graceful stop's vote at a step boundary, training_run.cc).
  absl::StatusOr<bool> AnyRank(bool mine);
  // Mean cross-entropy over the validation windows (see docs/engine.md);
  // collective over the DP group. FAILED_PRECONDITION without validation data.
  absl::StatusOr<double> Evaluate();

  // Commits <root>/step_NNNNNNNN with parameters, AdamW moments and loop state
  // and prunes to checkpoint.keep, the same way under every layout: each rank
  // that holds a unique piece (ParallelContext::writes_shards) writes its
  // shards with their place in the global tensors, and the first rank of the
  // mesh commits one index (checkpoint/distributed_save.h). Collective over
  // every group; every rank waits for the commit. Returns the step directory
  // on the first rank, "" on the others.
  absl::StatusOr<std::string> SaveCheckpoint(const std::string& root);
  // Loads the newest loadable checkpoint under root (falling back past refused
  // ones, listed in the result), saved under any layout: each rank copies
  // its pieces out of whatever shards the step holds. NOT_FOUND when root
  // holds none.
  absl::StatusOr<LoadedCheckpoint> RestoreNewest(const std::string& root);
  // Called by the rank that commits a checkpoint just before it does
  // (checkpoint/distributed_save.h: the fencing of superseded attempts).
  void set_commit_gate(CommitGate gate) { commit_gate_ = std::move(gate); }

  // In-place recovery's snapshots (training_loop_snapshot.cc). The manifest
  // of this rank's snapshot now: its owner (`rank`, its global rank, -1 if
  // not known; the layout; its place in the mesh), the step counters and
  // every piece of state it holds, replicated ones too.
  SnapshotManifest SnapshotLayout(int rank = -1);
  // Copies the whole state into `into` (host memory; a device backend's
  // pieces are copied down), at a step boundary. Local: no collective.
  absl::Status CaptureSnapshot(Snapshot* into, int rank = -1);
  // Restores a snapshot of this rank's layout and place (else
  // FAILED_PRECONDITION naming the difference, nothing changed): every
  // piece, step, tokens, optimizer step and MoE biases. Local. Valid at a
  // step boundary of a loop whose groups are intact, or in a fresh loop (the
  // coordinated trainer builds a new loop on new groups after a failure: a
  // step cut short leaves engine state such as ZeRO-3's gathered units that
  // is rebuilt by a new loop, not restored).
  absl::Status RestoreSnapshot(const Snapshot& from, int rank = -1);

  // Told where the loop is (phase name, micro-batch or -1, pipeline chunk)
  // at each phase change, for the rank's health reports and `loomctl trace`
  // (a phase lasts until the next one). Cheap; called on the loop's thread.
  // Phases: load_data, forward_backward (a micro-batch begins), forward and
  // backward (of a chunk), reduce_gradients, optimizer, snapshot,
  // checkpoint, eval, running (between steps).
  using PhaseListener =
      std::function<void(const char* phase, int64_t micro_batch, int64_t chunk)>;
  void set_phase_listener(PhaseListener listener) { phase_listener_ = std::move(listener); }

  int64_t step() const { return step_; }
  int64_t total_steps() const { return spec_.train.steps; }
  bool done() const { return step_ >= spec_.train.steps; }
  bool has_validation() const { return val_data_.has_value(); }
  double flops_per_token() const { return flops_per_token_; }
  const spec::JobSpec& spec() const { return spec_; }
  // Under ZeRO-3 the model's own parameter array holds only the units in use
  // (zeros elsewhere): read parameters through GatherParameters.
  // The first model part: the whole model without PP (a stage of one chunk).
  LlamaModel& model() { return stage_->model(0); }
  // [pp] This rank's pipeline stage (its chunks); null without PP.
  PipelineStage* pipeline_stage() { return ctx_.pp != nullptr ? stage_.get() : nullptr; }
  // The unsharded optimizer (ZeRO stage 0); see dp_engine() otherwise.
  AdamW& optimizer() { return *optimizer_; }
  // Null without a DP group. [pp] Under PP: the first chunk's (there is one
  // per chunk).
  DataParallelEngine* dp_engine() { return dp_engines_.empty() ? nullptr : dp_engines_[0].get(); }
  int zero_stage() const { return dp_engines_.empty() ? 0 : dp_engines_[0]->zero_stage(); }
  const ParallelContext& parallel_context() const { return ctx_; }
  // All parameters in the model's flat order (collective under ZeRO-3), in
  // host memory whatever the backend.
  // [pp] Under PP: this stage's parameters, chunk after chunk.
  absl::Status GatherParameters(std::vector<float>* out);
  // The backend the model trains on (not under PP).
  kernels::Ops& ops() { return *ops_; }
  // The engine's memory accounting; peaks restart at every TrainStep, so after
  // a step they are that step's peaks.
  MemoryUsage memory() const { return memory_.Snapshot(); }
  // The micro-batch this rank trains as micro-batch `micro` of step `step`.
  void FillTrainMicroBatch(int64_t step, int64_t micro, Batch* out) const;

 private:
  TrainingLoop(const spec::JobSpec& spec, const ParallelContext& ctx, LoopOptions options);
  bool IsEvalStep(int64_t step) const;
  // The model parts this rank trains: the stage's chunks (one
  // DataParallelEngine each under DP); their parameters, part after part.
  std::vector<LlamaModel*> Parts();
  std::vector<TensorView> PartParameters();
  // The state this rank holds, piece by piece, for checkpoints
  // (training_loop_checkpoint.cc) and snapshots (training_loop_snapshot.cc).
  std::vector<StatePiece> CheckpointPieces();
  // The snapshot's manifest and where each piece's floats live (backend
  // memory, or host memory for the MoE biases).
  struct SnapshotSource {
    float* data;
    bool host;
  };
  SnapshotManifest SnapshotLayoutAndSources(int rank, std::vector<SnapshotSource>* sources);
  // The gradient this rank's optimizer reads, for ClipGradients.
  std::vector<GradientPiece> GradientPiecesToClip();
  // [ep] After the DP reduction: the dense gradients summed over EP, whole
  // (ZeRO 0, 1) or this rank's shard pieces (ZeRO >= 2).
  absl::Status ReduceDenseOverEp();
  // [ep] Each DP engine's owned gradient pieces with their tensors' names.
  std::vector<std::pair<GradientPiece, std::string>> ShardPiecesWithNames();
  // Clips the reduced gradient over the context's groups; the norm.
  absl::StatusOr<double> ClipStepGradients();
  void OptimizerUpdate(double lr, absl::Status* status);
  int64_t optimizer_step() const;
  void set_optimizer_step(int64_t step);

  // The model parts, engines and optimizer, one structure for every layout.
  absl::Status CreateParts();
  // The step of every layout: the executor runs this stage's instruction list
  // (training_loop_pipeline.cc).
  absl::StatusOr<StepProgress> RunScheduledStep();
  // The end of every step, pipeline or not: counters, the record, the
  // evaluation when due, this step's memory peaks.
  absl::StatusOr<StepProgress> FinishStep(StepProgress p, int64_t step, double loss,
                                          std::chrono::steady_clock::time_point start);
  // The mean loss of the validation windows in batch_ (this stage's share
  // under PP: 0 before the last stage).
  absl::StatusOr<double> EvaluateBatch();
  // The model parts: a stage of chunks, the whole model as one chunk of one
  // stage without a pp group (the executor then runs a one-stage schedule).
  std::unique_ptr<PipelineStage> stage_;
  std::unique_ptr<PipelineExecutor> pipeline_;
  // [pp] Tied embeddings across stages (TiedAcrossStages): this stage's
  // gradient of model.embed_tokens.weight (the embedding or the head's copy;
  // null on a middle stage), summed over the pp group after backward, middle
  // stages adding tied_zeros_.
  float* TiedGradient();
  absl::Status SumTiedEmbeddingGradients();
  kernels::Buffer tied_zeros_;
  int64_t tied_count_ = 0;

  spec::JobSpec spec_;
  ParallelContext ctx_;
  LoopOptions options_;
  CommitGate commit_gate_;
  TokenDataset train_data_;
  std::optional<TokenDataset> val_data_;
  std::unique_ptr<TrainSampler> sampler_;
  std::shared_ptr<kernels::Ops> ops_;  // the model's backend; outlives the optimizer's buffers
  std::unique_ptr<ExpertExchange> expert_exchange_;  // [ep] the parts' MoE layers use it
  std::unique_ptr<AdamW> optimizer_;  // ZeRO stage 0
  MemoryTracker memory_;
  // With a DP group: one per model part (the model, or each pipeline chunk).
  std::vector<std::unique_ptr<DataParallelEngine>> dp_engines_;
  void Phase(const char* phase, int64_t micro_batch = -1, int64_t chunk = 0) const {
    if (phase_listener_) phase_listener_(phase, micro_batch, chunk);
  }
  PhaseListener phase_listener_;
  int64_t step_ = 0;
  int64_t tokens_ = 0;
  double flops_per_token_ = 0;
  StepFaults faults_;
  struct SkippedBatch {
    std::string reason;
    double loss = 0;
  };
  std::map<int64_t, SkippedBatch> skip_batches_;  // by step
  // The step of a batch in skip_batches_ (TrainStep).
  absl::StatusOr<StepProgress> SkipStep(int64_t step, SkippedBatch why);
  Batch batch_;
};

// 6*N + 12*L*h*s, N counting the parameters that take part in matmuls: all of
// them except an untied input embedding table (a lookup) and, with model.moe,
// the routed experts a token does not run (E - top_k per MoE layer).
double ModelFlopsPerToken(const spec::ModelSpec& model, int64_t num_parameters, int64_t seq_len);

}  // namespace loom::engine
