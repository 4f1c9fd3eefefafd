// Runs one pipeline stage's instruction list (common/topology/
// instruction.h) for one optimizer step: forwards and backwards of its chunks
// and the activation / gradient transfers with the neighbouring stages over
// the pp group, in exactly the listed order.
//
// Transfers: sends are posted (SendAsync) and waited for only at
// ReduceGradients, so a stage never blocks on a send; a receive is posted and
// waited for at its instruction. Received tensors are kept by (micro-batch,
// chunk) until the compute that needs them, which may come later. Tags name
// the boundary (the downstream virtual stage), the kind and the micro-batch,
// so a message can only match its own receive.
//
// Memory: every boundary tensor (a chunk's input stash, its output, the
// gradients either way, the evaluation's activation) is backend memory from
// the stage's ops (device memory on a GPU), handed to the pp communicator as
// is (NCCL needs device memory) and to the model's Part* calls; buffers are
// reused from a small pool, so a step allocates only until the pool holds
// what the schedule keeps in flight.
//
// Activations: a chunk stashes only its input per micro-batch in flight and
// replays its forward inside the backward (like recompute: full at chunk
// granularity), so the model keeps one set of layer activations. The chunk
// holding the LM head computes nothing at Forward (its loss comes with the
// backward, which follows its forward).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/data/batch_sampler.h"
#include "worker/engine/pipeline_parallel/pipeline_stage.h"

namespace loom::engine {

struct PipelineStepHooks {
  // Fills micro-batch `mb` (0-based) of this step: every stage draws the
  // same batch (the first stage reads its inputs, the last its targets).
  std::function<void(int64_t mb, Batch* out)> fill;
  // At ReduceGradients (every backward done, every send complete), with the
  // sum over this stage's micro-batches of their mean losses (0 on stages
  // without the head).
  std::function<absl::Status(double loss_sum)> reduce_gradients;
  // At OptimizerStep.
  std::function<absl::Status()> optimizer_step;
  // Optional, around each backward pass: a data-parallel engine that reduces
  // buckets while backward runs (a single chunk's) is told where the step is;
  // `last`: the chunk's last micro-batch of the step.
  std::function<void(bool last)> before_backward;
  std::function<absl::Status()> after_backward;
  // Optional: a forward ("forward") or backward ("backward") pass of
  // micro-batch `mb` on `chunk` begins (its inputs are at hand).
  std::function<void(const char* pass, int64_t mb, int64_t chunk)> before_pass;
};

class PipelineExecutor {
 public:
  // pp_comm: the pp group (rank = stage); may be null when plan.pp == 1.
  // Neither is owned.
  PipelineExecutor(PipelineStage* stage, comm::Communicator* pp_comm)
      : stage_(stage), pp_(pp_comm) {}

  // Executes the plan's list for one step. loss_scale multiplies each
  // micro-batch's gradient (1 / micro-batches of the global batch).
  absl::Status RunStep(float loss_scale, const PipelineStepHooks& hooks);

  // Forward only of one batch through every virtual stage (evaluation):
  // the mean loss on the stage holding the head, 0 on the others.
  absl::StatusOr<double> ForwardLoss(const Batch& batch);

 private:
  using Key = std::pair<int64_t, int64_t>;  // (micro-batch, chunk)
  // One boundary tensor: `floats` floats of backend memory.
  struct Tensor {
    kernels::Buffer buffer;
    int64_t floats = 0;
    float* data() const { return buffer.f32(); }
  };
  Tensor Acquire(int64_t floats);
  void Release(Tensor t);
  absl::Status Send(int64_t peer, uint32_t tag, Tensor data);
  absl::Status Recv(int64_t peer, uint32_t tag, Tensor* data);
  absl::Status WaitSends();

  PipelineStage* stage_;
  comm::Communicator* pp_;
  struct PendingSend {
    Tensor data;
    std::unique_ptr<comm::Work> work;
  };
  std::vector<std::unique_ptr<PendingSend>> sends_;
  std::vector<kernels::Buffer> pool_;  // free boundary buffers
};

// The tag of a transfer across the boundary into virtual stage `boundary`
// (kind 0: activation, 1: gradient) for micro-batch `mb`.
uint32_t PipelineTag(int kind, int64_t boundary, int64_t mb);

}  // namespace loom::engine
