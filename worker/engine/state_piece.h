// One piece of the state a rank holds (TrainingLoop::CheckpointPieces): what
// checkpoints write and load and what snapshots capture and restore, the one
// list of every layout's state. Internal to the training loop's files.
#pragma once

#include <cstdint>
#include <string>

#include "worker/engine/tensor_view.h"

namespace loom::engine {

struct StatePiece {
  TensorView local;   // the parameter's local tensor (shape, place in the global one)
  std::string name;   // the global tensor: the parameter or one of its moments
  int64_t begin = 0;  // elements [begin, begin + count) of the local tensor
  int64_t count = 0;
  float* data = nullptr;  // backend memory holding them
  bool write = false;     // this rank writes it to a checkpoint
  int64_t part = 0;       // the model part (pipeline chunk) it belongs to
};

}  // namespace loom::engine
