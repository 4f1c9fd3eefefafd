// Stage partition: which transformer layers each pipeline stage (and each of
// its model chunks, for interleaved schedules) runs.
//
// The model is the sequence [embedding, layer 0 .. layer n-1, LM head]; it is
// cut into pp * virtual_stages contiguous chunks, one per virtual stage, each
// with at least one layer. The embedding rides with virtual stage 0 and the LM
// head with the last one, and their costs count in the balance: the cut
// minimises the most expensive chunk, then (among such cuts) the sum of
// squared chunk costs; remaining ties put the extra layers on later chunks,
// whose stages hold fewer activations in flight.
//
// Megatron's convention: chunk c of stage s is virtual stage c * pp + s, so a
// micro-batch visits stage 0..pp-1 with chunk 0, then again with chunk 1, ...
// Pure logic, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::topology {

// What the default end costs are derived from.
struct ModelDims {
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // SwiGLU: three h x ffn matrices per block
  int64_t vocab_size = 0;
  int64_t seq_len = 0;
  int64_t num_heads = 0;        // 0: multi-head attention with kv heads = heads
  int64_t num_kv_heads = 0;     // 0: same as num_heads
  bool tie_embeddings = false;
};

// Costs of the embedding and the LM head in layer-equivalents (a block = 1).
struct EndCosts {
  double embedding = 1.0;
  double lm_head = 1.0;
};

enum class CostBasis {
  kFlops,   // time per micro-batch: matmul FLOPs per token (embedding lookup ~ free)
  kParams,  // memory: parameter counts (a tied LM head adds no parameters)
};

// End costs relative to one block. FLOPs per token (forward; backward scales
// the same): block = 2*(2h^2 + 2h*kv + 3h*ffn) + 2*seq*h (causal attention),
// LM head = 2*h*vocab, embedding = h (a row copy). Params: block = 2h^2 +
// 2h*kv + 3h*ffn + 2h, embedding = vocab*h, LM head = vocab*h (0 when tied).
absl::StatusOr<EndCosts> DefaultEndCosts(const ModelDims& dims,
                                         CostBasis basis = CostBasis::kFlops);

struct PartitionRequest {
  int64_t num_layers = 0;
  int64_t pp = 1;
  int64_t virtual_stages = 1;
  // End costs in layer-equivalents; when unset they are DefaultEndCosts(dims).
  std::optional<EndCosts> end_costs;
  ModelDims dims;
  // Optional per-layer costs (size num_layers, each > 0); empty: 1 per layer.
  std::vector<double> layer_costs;
};

struct ModelChunk {
  int64_t stage = 0;
  int64_t chunk = 0;          // index among this stage's chunks
  int64_t virtual_stage = 0;  // chunk * pp + stage
  int64_t first_layer = 0;    // layers [first_layer, first_layer + num_layers)
  int64_t num_layers = 0;
  bool has_embedding = false;
  bool has_lm_head = false;
  double cost = 0;            // layer-equivalents, end costs included
  bool operator==(const ModelChunk&) const = default;
};

struct StagePartition {
  int64_t pp = 1;
  int64_t virtual_stages = 1;
  EndCosts end_costs;
  std::vector<ModelChunk> chunks;  // index = virtual stage

  const ModelChunk& At(int64_t stage, int64_t chunk) const {
    return chunks[chunk * pp + stage];
  }
  // The stage's chunks in chunk order.
  std::vector<ModelChunk> ChunksOfStage(int64_t stage) const;
  double StageCost(int64_t stage) const;
  double MaxChunkCost() const;
};

// INVALID_ARGUMENT when pp or virtual_stages < 1, there are fewer layers than
// pp * virtual_stages chunks, a cost is not positive (ends may be 0), or the
// end costs cannot be derived from dims.
absl::StatusOr<StagePartition> PartitionLayers(const PartitionRequest& request);

}  // namespace loom::topology
