// Where each Llama parameter lives in the model's one flat fp32 array: Hugging
// Face names and shapes, in the documented order, with the offsets the forward
// pass relies on. q, k and v are adjacent (one fused [q;k;v] weight for a
// single QKV GEMM) and so are gate and up (one [gate;up] GEMM). Under tensor
// parallelism the layout is this rank's: local shapes, each entry saying where
// its slice sits in the global tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "worker/engine/tensor_parallel/tp_plan.h"

namespace loom::engine {

struct ParameterEntry {
  std::string name;
  std::vector<int64_t> shape;  // local
  int64_t offset = 0;  // in floats, into the flat array
  int64_t numel = 0;
  // Init: 0 = ones (norm weights), otherwise normal(0, init_std).
  double init_std = 0.0;
  // Sharding, as in TensorView: global shape (empty: unsharded), the slice
  // along shard_axis (-1: whole), and the TP ranks holding the same slice.
  std::vector<int64_t> global_shape;
  int shard_axis = -1;
  int64_t shard_offset = 0;
  int replicas = 1;
  // [pp] Index of this tensor in the whole model's order (its init stream).
  int64_t init_index = 0;
};

struct LayerOffsets {
  int64_t input_norm = 0;
  int64_t qkv = 0;  // q_proj, then k_proj, then v_proj rows
  int64_t o = 0;
  int64_t post_norm = 0;
  int64_t gate_up = 0;  // gate_proj rows, then up_proj rows; -1 in an MoE layer
  int64_t down = 0;     // -1 in an MoE layer
  // [moe] An MoE layer (model.moe; moe_layer.h says the layout): the router,
  // the first expert's gate_proj (experts at a stride of 3 F hidden), the
  // shared experts' fused gate/up and down (-1 without shared experts).
  bool moe = false;
  int64_t router = -1;
  int64_t experts = -1;
  int64_t shared_gate_up = -1;
  int64_t shared_down = -1;
  int64_t entries = 9;  // the layer's tensors in `entries`
};

struct ParameterLayout {
  std::vector<ParameterEntry> entries;  // Parameters() order
  std::vector<LayerOffsets> layers;
  int64_t embed = 0;
  int64_t final_norm = 0;
  int64_t lm_head = 0;  // == embed when tied
  int64_t total = 0;
};

// [pp] The part of the model one pipeline chunk holds: decoder layers
// [first_layer, first_layer + num_layers), plus the embedding and/or the final
// norm and LM head. The default is the whole model.
struct ModelPart {
  int64_t first_layer = 0;
  int64_t num_layers = -1;  // -1: every layer from first_layer on
  bool embedding = true;
  bool head = true;          // model.norm, lm_head and the loss
  // [ep] The routed experts held (docs/expert_parallel.md): the contiguous
  // range [first_expert, first_expert + held_experts); -1: all of them. The
  // others' tensors are left out; every kept tensor keeps its name and init
  // stream, so a rank's experts equal the one-process model's.
  int64_t first_expert = 0;
  int64_t held_experts = -1;
  bool Whole(const spec::ModelSpec& c) const {
    return first_layer == 0 && (num_layers < 0 || num_layers == c.num_layers) && embedding && head;
  }
};

// Init std: 0.02 for embeddings, q/k/v, gate/up and lm_head; 0.02/sqrt(2L) for
// the projections that write into the residual stream (o_proj, down_proj), as
// GPT-2 does, so the residual's variance does not grow with depth. [moe] The
// router, every expert's and the shared experts' gate/up take 0.02, their
// down_proj 0.02/sqrt(2L).
ParameterLayout MakeParameterLayout(const spec::ModelSpec& config);
// This rank's layout under `plan` (the same as above when plan.size == 1).
ParameterLayout MakeParameterLayout(const spec::ModelSpec& config, const TpPlan& plan);
// [pp] The entries of `part` only, packed in the same order (names, shapes and
// init streams as in the whole model). embed / final_norm / lm_head are -1
// when the part lacks them; layers[i] is global layer part.first_layer + i.
// A tied head in a part without the embedding gets its own copy of
// model.embed_tokens.weight (the last entry; embed stays -1).
ParameterLayout MakeParameterLayout(const spec::ModelSpec& config, const TpPlan& plan,
                                    const ModelPart& part);
// [pp] INVALID_ARGUMENT naming the rule for a part outside the model.
absl::Status CheckModelPart(const spec::ModelSpec& config, const ModelPart& part);

}  // namespace loom::engine
