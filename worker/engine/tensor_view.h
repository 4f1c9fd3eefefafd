// A named view of an fp32 tensor owned elsewhere (a model parameter, its
// gradient, an optimizer state). Checkpoints, export and the optimizer work on
// lists of these, so they need not know the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::engine {

struct TensorView {
  std::string name;            // Hugging Face Llama name, e.g. model.layers.0.mlp.up_proj.weight
  std::vector<int64_t> shape;  // row-major, Hugging Face shape ([out, in] for linear weights)
  float* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace loom::engine
