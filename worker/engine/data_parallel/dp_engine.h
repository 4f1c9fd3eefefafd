// The data-parallel engine of one rank: gradient reduction over the DP group
// and the ZeRO stages, driven by the model's hooks (llama_model.h).
//
//   stage 0  all-reduce (sum) of the gradients in buckets, each launched as soon
//            as backward has completed it, on the last micro-batch only
//            (gradient accumulation stays local until then).
//   stage 1  as 0, then AdamW on this rank's shard only (m, v sharded), then an
//            all-gather of the updated parameters, bucket by bucket.
//   stage 2  gradients reduce-scattered bucket by bucket during every
//            micro-batch's backward into an fp32 shard; the model's gradient of
//            a bucket is freed as soon as it has been sent. AdamW on the shard,
//            all-gather of the parameters.
//   stage 3  as 2, and the parameters themselves live only as shards: each
//            unit (embedding, decoder layer, head) is all-gathered just before
//            the model uses it and freed right after, the next unit's gather
//            prefetched while the current one computes.
//
// Reductions and gathers of stages 2 and 3 (and stage 1's parameter gather)
// run on a CommWorker thread in the same order on every rank; stage 0/1 use
// the communicator's own asynchronous all-reduce. All collectives of a step go
// to one communicator, the DP group. Memory that the engine materializes and
// frees is reported to a MemoryTracker.
//
// Device memory: every tensor buffer here (the model's flat arrays, the
// gradient and parameter shards, the optimizer's moments, padded staging for
// uneven buckets) is the model backend's memory, and the engine touches it
// only through that backend's ops (Fill, Axpy, Scale, SumSquares, AdamW,
// CopyDeviceToDevice), all issued on the calling (compute) thread. The
// CommWorker thread only hands spans to the communicator, as NCCL needs; what
// must follow a collective (accumulating a reduced chunk into the shard,
// copying a padded gather out, freeing a bucket's gradient and the staging)
// runs on the calling thread when it waits for that collective. Host numbers
// (the loss, the norm's sum of squares) cross the group through a small
// backend buffer (parallel/host_floats.h).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/comm/communicator.h"
#include "worker/engine/memory/memory_tracker.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/optim/clip_gradients.h"
#include "worker/engine/optim/sharded_adamw.h"
#include "worker/engine/data_parallel/comm_worker.h"
#include "worker/engine/data_parallel/flat_partition.h"

namespace loom::engine {

struct DataParallelOptions {
  int zero_stage = 0;                 // 0..3
  int64_t bucket_bytes = 25 << 20;    // parallelism.bucket_mb MiB
};

class DataParallelEngine : public ModelHooks {
 public:
  // comm: the DP group (size >= 2). The model's parameters and gradients must
  // each be one contiguous array in Parameters() order; the model, comm and
  // memory must outlive the engine, which installs itself as the model's hooks.
  static absl::StatusOr<std::unique_ptr<DataParallelEngine>> Create(
      LlamaModel* model, comm::Communicator* comm, const DataParallelOptions& options,
      const spec::TrainSpec& train, MemoryTracker* memory);
  ~DataParallelEngine() override;

  int zero_stage() const { return stage_; }
  const FlatPartition& partition() const { return partition_; }
  const std::vector<OwnedPiece>& owned_pieces() const { return owned_; }

  // Takes the model's (replicated, initialized) parameters as the starting
  // point: ZeRO-3 copies this rank's shard out and frees the rest.
  void ShardParameters();

  // One optimizer step: BeginStep, then per micro-batch BeginMicroBatch,
  // model.ForwardBackward, EndMicroBatch; then FinishReduction; then the
  // caller clips GradientPieces (ClipGradients, optim/clip_gradients.h);
  // then OptimizerStep (stage >= 1; stage 0 leaves the update to the caller).
  void BeginStep();
  void BeginMicroBatch(bool last);
  absl::Status EndMicroBatch();
  // Waits for every reduction of the step.
  absl::Status FinishReduction();
  // [pp] For a caller that ran backward without the micro-batch calls (the
  // pipeline executor, whose micro-batches interleave with other chunks'):
  // reduces the accumulated gradient now, bucket by bucket (stages 0, 1:
  // all-reduce; stage 2: reduce-scatter into the shard, freeing the model's
  // gradient), and waits. Megatron's distributed optimizer does the same.
  absl::Status ReduceWholeGradients();
  // The reduced gradient to clip: the model's whole gradient (stages 0, 1:
  // every rank holds it after the all-reduce, so its norm needs no DP sum)
  // or this rank's owned shard pieces (stages 2, 3: their squares add up
  // over the DP group), each with its tensor's TP replicas.
  std::vector<GradientPiece> GradientPieces();
  // [pp] `tensor` is also held by `holders` - 1 ranks outside the DP group
  // (a tied embedding on the first and the last stage): its pieces count
  // 1/holders in the norm.
  void CountInNormOnce(const std::string& tensor, int holders);
  absl::Status OptimizerStep(double lr);

  // Checkpoints of layouts that store global tensors (TP, PP): the moments
  // (stage >= 1) as whole flat arrays of partition().total() floats in
  // backend memory, gathered over the group, and back (this rank's owned
  // ranges copied in). Exact copies: a same-layout resume is bit for bit.
  absl::Status GatherOptimizerStates(float* exp_avg, float* exp_avg_sq);
  void ScatterOptimizerStates(const float* exp_avg, const float* exp_avg_sq);
  // Stage 3: gathers every parameter into the model's flat array (undone by
  // ShardParameters, which also takes parameters loaded there as the new
  // shard). No-op for other stages.
  absl::Status MaterializeParameters();

  // Stage >= 1: the sharded optimizer (moments at OwnedPiece::shard_offset).
  ShardedAdamW* sharded_optimizer() { return optimizer_.get(); }
  // Stage 3: this rank's parameter shard (at OwnedPiece::shard_offset), in
  // the backend's memory.
  float* parameter_shard() { return param_shard_.f32(); }
  // Every parameter, in the flat order, on every rank (collective under
  // ZeRO-3), in host memory whatever the backend.
  absl::Status GatherParameters(std::vector<float>* out);

  // ModelHooks.
  void BeforeUse(int64_t unit, bool backward) override;
  void AfterUse(int64_t unit, bool backward) override;
  void GradientsReady(int64_t unit) override;

 private:
  DataParallelEngine(LlamaModel* model, comm::Communicator* comm, int stage,
                     FlatPartition partition, MemoryTracker* memory);
  // [pp] The model numbers a part's units locally (0 the embedding, 1 + l
  // its l-th layer, then the head); the partition by the whole model's
  // layers (the parameters' names). Identity for a whole model.
  int64_t WholeModelUnit(int64_t unit) const;
  void Note(const absl::Status& s);
  // ZeRO-3: holds a unit's parameters (gathering buckets nobody holds).
  void Acquire(int64_t unit, bool wait);
  void Release(int64_t unit);
  // All-gathers bucket b: this rank's chunk is src_count floats at src
  // (backend memory, zero-padded to the chunk), the bucket lands at
  // device_dst (backend memory) or else host_dst (host memory).
  CommWorker::Handle SubmitGather(int b, const float* src, int64_t src_count, float* device_dst,
                                  float* host_dst = nullptr);
  CommWorker::Handle SubmitReduceScatter(int b);
  void MarkGradientsLive(int64_t unit);
  kernels::Buffer AllocateFloats(int64_t count);

  // A collective on the worker with what the calling thread does after it:
  // `finish` (given whether it succeeded) and freeing `buffers`.
  struct PendingComm {
    CommWorker::Handle handle;
    std::vector<kernels::Buffer> buffers;
    std::function<void(bool ok)> finish;
    int64_t comm_bytes = 0;  // accounted as kCommBuffers until completion
  };
  CommWorker::Handle Post(std::function<absl::Status()> collective, PendingComm pending);
  // Waits for the task and finishes it on this thread (no-op when done).
  void Complete(const CommWorker::Handle& handle);
  // Completes everything posted, in order.
  void CompleteAll();

  LlamaModel* model_;
  kernels::Ops& ops_;  // the model's backend
  comm::Communicator* comm_;
  int stage_;
  int ranks_, rank_;
  int64_t layers_;
  bool tied_;
  FlatPartition partition_;
  std::vector<OwnedPiece> owned_;
  MemoryTracker* memory_;
  float* params_ = nullptr;  // the model's flat arrays
  float* grads_ = nullptr;
  kernels::Buffer param_shard_;  // stage 3, backend memory
  kernels::Buffer grad_shard_;   // stages 2, 3, backend memory
  std::unique_ptr<ShardedAdamW> optimizer_;
  std::vector<AdamWPiece> pieces_;
  std::vector<int> replicas_;  // per partition tensor: TensorView::replicas
  std::deque<PendingComm> pending_;  // posted, not completed; submission order
  CommWorker worker_;
  std::vector<std::unique_ptr<comm::Work>> pending_all_reduce_;
  bool training_pass_ = false;
  bool last_micro_ = false;
  absl::Status status_;
  // Stage 3 bookkeeping: buckets each unit needs, holders per bucket.
  std::vector<std::vector<int>> unit_buckets_;
  std::vector<bool> held_;
  std::vector<int> holders_;
  std::vector<CommWorker::Handle> gathering_;
  // Stages 2/3: reduce-scatters in flight per unit. Backward waits for those
  // of unit u + kReduceWindow when unit u completes, which bounds the
  // resident full-size gradients to a few units.
  static constexpr int64_t kReduceWindow = 2;
  std::vector<std::vector<CommWorker::Handle>> reducing_;
  // Stages 2/3: which buckets' model gradients are resident (for accounting).
  std::vector<char> grad_live_;
};

}  // namespace loom::engine
