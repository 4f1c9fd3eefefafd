// The small model's loss curve under a precision recipe's backend, for the
// recipe tests (tests/bf16_emulation, tests/fp8_emulation): the same init,
// the same batches of a structured byte corpus and AdamW at lr 1e-3 for any
// backend, so two curves differ only by what the backend rounds.
// Header-only; needs loom_model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine::testing {

constexpr int64_t kRecipeBatch = 8, kRecipeSeq = 64;

inline spec::ModelSpec RecipeModel() {
  spec::ModelSpec c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 384;
  c.max_seq_len = kRecipeSeq;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-5;
  return c;
}

// A byte corpus with structure to learn (words, spaces, punctuation),
// deterministic without any file.
inline std::vector<int32_t> RecipeCorpus() {
  const char* words[] = {"the", "loom", "weaves", "threads", "into", "cloth", "and", "a",
                         "model", "learns", "patterns", "of", "text", "from", "bytes", "slowly"};
  std::vector<int32_t> out;
  uint64_t state = 12345;
  while (out.size() < 40000) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const std::string w = words[(state >> 33) % 16];
    for (char ch : w) out.push_back(static_cast<unsigned char>(ch));
    out.push_back(((state >> 20) % 7 == 0) ? '.' : ' ');
  }
  return out;
}

// Losses of `steps` AdamW steps with `ops`, windows drawn in a fixed order.
inline std::vector<float> TrainRecipeCurve(std::shared_ptr<kernels::Ops> ops, int64_t steps) {
  const std::vector<int32_t> corpus = RecipeCorpus();
  LlamaModel model(RecipeModel(), spec::Recompute::kNone, ops);
  model.InitParameters(1234);
  const int64_t n = model.NumParameters();
  float* param = model.Parameters().front().data;
  float* grad = model.Gradients().front().data;
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  std::vector<int32_t> inputs(kRecipeBatch * kRecipeSeq), targets(kRecipeBatch * kRecipeSeq);
  uint64_t state = 99;
  std::vector<float> losses;
  for (int64_t step = 1; step <= steps; ++step) {
    for (int64_t b = 0; b < kRecipeBatch; ++b) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const size_t start = (state >> 24) % (corpus.size() - kRecipeSeq - 1);
      for (int64_t s = 0; s < kRecipeSeq; ++s) {
        inputs[b * kRecipeSeq + s] = corpus[start + s];
        targets[b * kRecipeSeq + s] = corpus[start + s + 1];
      }
    }
    model.ZeroGradients();
    losses.push_back(
        model.ForwardBackward(inputs.data(), targets.data(), kRecipeBatch, kRecipeSeq, 1.0f));
    ops->AdamW(param, grad, m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
  }
  return losses;
}

// How a recipe's curve departs from fp32's.
struct CurveDistance {
  double max_step = 0;   // largest |recipe - fp32| / fp32 over the steps
  double tail_mean = 0;  // relative difference of the means of the last 10 steps
  bool differs = false;  // some step is not bit-identical (the recipe ran)
  bool finite = true;
};

inline CurveDistance CompareCurves(const std::vector<float>& fp32, const std::vector<float>& recipe) {
  CurveDistance d;
  double tail32 = 0, tail = 0;
  const size_t n = std::min(fp32.size(), recipe.size());
  for (size_t i = 0; i < n; ++i) {
    d.finite = d.finite && std::isfinite(recipe[i]);
    d.max_step = std::max(d.max_step, std::fabs(double{recipe[i]} - fp32[i]) / fp32[i]);
    d.differs = d.differs || recipe[i] != fp32[i];
    if (i + 10 >= n) {
      tail32 += fp32[i] / 10;
      tail += recipe[i] / 10;
    }
  }
  d.tail_mean = std::fabs(tail - tail32) / tail32;
  return d;
}

inline void PrintCurves(const char* recipe_name, const std::vector<float>& fp32,
                        const std::vector<float>& recipe, const CurveDistance& d) {
  std::printf("%s vs fp32 over %zu steps: max per-step relative difference %.5f, last-10 mean "
              "relative difference %.5f\n", recipe_name, fp32.size(), d.max_step, d.tail_mean);
  for (size_t i = 0; i < fp32.size() && i < recipe.size(); i += 10) {
    std::printf("  step %2zu  fp32 %.4f  %s %.4f\n", i + 1, fp32[i], recipe_name, recipe[i]);
  }
}

}  // namespace loom::engine::testing
