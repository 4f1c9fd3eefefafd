#include "worker/engine/pipeline_parallel/pipeline_stage.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::engine {

bool TiedAcrossStages(const spec::ModelSpec& config, int64_t pp) {
  return pp > 1 && config.tie_embeddings;
}

PipelineStage::PipelineStage(const spec::ModelSpec& config, spec::Recompute recompute,
                             const PipelinePlan& plan, TensorParallelOptions parallel,
                             std::shared_ptr<kernels::Ops> ops, const ModelPart& experts)
    : plan_(plan), ops_(std::move(ops)) {
  for (const PipelineChunk& c : plan_.chunks) {
    ModelPart part{c.first_layer, c.num_layers, c.embedding, c.head};
    part.first_expert = experts.first_expert;  // [ep]
    part.held_experts = experts.held_experts;
    chunks_.push_back(std::make_unique<LlamaModel>(config, recompute, ops_, parallel, part));
  }
}

void PipelineStage::InitParameters(uint64_t seed) {
  for (auto& m : chunks_) m->InitParameters(seed);
}

std::vector<TensorView> PipelineStage::Parameters() {
  std::vector<TensorView> all;
  for (auto& m : chunks_) {
    for (TensorView& v : m->Parameters()) all.push_back(std::move(v));
  }
  return all;
}

std::vector<TensorView> PipelineStage::Gradients() {
  std::vector<TensorView> all;
  for (auto& m : chunks_) {
    for (TensorView& v : m->Gradients()) all.push_back(std::move(v));
  }
  return all;
}

void PipelineStage::ZeroGradients() {
  for (auto& m : chunks_) m->ZeroGradients();
}

int64_t PipelineStage::NumParameters() const {
  int64_t n = 0;
  for (const auto& m : chunks_) n += m->NumParameters();
  return n;
}

int64_t PipelineStage::ActivationBytes() const {
  int64_t n = 0;
  for (const auto& m : chunks_) n += m->ActivationBytes();
  return n;
}

}  // namespace loom::engine
