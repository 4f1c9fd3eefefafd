// The model chunks one pipeline stage holds (one LlamaModel per chunk, each
// restricted to its layers and, on the first and last virtual stage, the
// embedding or the final norm + LM head), seen as one parameter list for the
// optimizer, clipping and checkpoints. Interleaved schedules give a stage
// several non-adjacent chunks; a plain schedule gives it one.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/pipeline_parallel/pipeline_plan.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class PipelineStage {
 public:
  // The TP options apply to every chunk (they share the TP group, which they
  // use one at a time).
  // `ops` is the backend every chunk runs on (the rank's, MakeOpsForJob);
  // the chunks' tensors and the executor's boundary buffers are its memory.
  // `experts`: the routed experts every chunk holds ([ep] ModelPart's
  // first_expert and held_experts; its layer fields are ignored).
  PipelineStage(const spec::ModelSpec& config, spec::Recompute recompute, const PipelinePlan& plan,
                TensorParallelOptions parallel, std::shared_ptr<kernels::Ops> ops,
                const ModelPart& experts = {});

  // Each tensor from the whole model's init stream: the stages together hold
  // exactly the single-process weights.
  void InitParameters(uint64_t seed);

  int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }
  LlamaModel& model(int64_t chunk) { return *chunks_[static_cast<size_t>(chunk)]; }
  const PipelineChunk& chunk(int64_t chunk) const { return plan_.chunks[static_cast<size_t>(chunk)]; }
  const PipelinePlan& plan() const { return plan_; }
  // The backend shared by every chunk.
  kernels::Ops& ops() { return *ops_; }

  // Every chunk's tensors, chunk after chunk (global names).
  std::vector<TensorView> Parameters();
  std::vector<TensorView> Gradients();
  void ZeroGradients();
  int64_t NumParameters() const;
  int64_t ActivationBytes() const;

 private:
  PipelinePlan plan_;
  std::shared_ptr<kernels::Ops> ops_;
  std::vector<std::unique_ptr<LlamaModel>> chunks_;
};

// Tied embeddings split over stages: the first stage holds the embedding, the
// last one a copy for its LM head (model/parameter_layout.h), and the two
// gradients are summed between them after every backward.
bool TiedAcrossStages(const spec::ModelSpec& config, int64_t pp);

}  // namespace loom::engine
