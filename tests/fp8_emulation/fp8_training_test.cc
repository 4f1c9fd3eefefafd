// The small model trained under the emulated fp8 recipe against the same
// run in fp32: same init, same batches, AdamW. The fp8 curve must follow the
// fp32 one within the tolerance below, and must not be the fp32 curve (the
// quantized path ran).
//
// Tolerance, and why: e4m3 keeps 3 mantissa bits (relative rounding error up
// to 2^-4, 16x bf16's), so every quantized GEMM input carries a few percent
// of noise; round-to-nearest is unbiased and the fine-grained scales keep
// small values out of underflow, so the noise moves the trajectory, not its
// expectation. What a per-step tolerance can promise depends on how chaotic
// the run is: at lr 3e-3 this tiny model amplifies even bf16 rounding of the
// same GEMM inputs to 9% per-step loss differences, so the test trains at lr
// 1e-3, where the trajectory is stable. Measured there (2026-11-30, 60 steps,
// loss 5.59 -> 1.10): fp8 within 1.23% of fp32 at every step and 0.39% on the
// mean of the last 10 steps (bf16-rounded inputs, for scale: 0.11%). The test
// allows 3% per step and 1% on the last-10 mean (about 2.5x the measurement),
// which a wrong scale, layout or rounding mode exceeds by far. DeepSeek-V3
// reports < 0.25% relative loss error against BF16 for large models.
#include <gtest/gtest.h>

#if defined(LOOM_FP8_TEST_MODEL)

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8_emulation_ops.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

constexpr int64_t kBatch = 8, kSeq = 64, kSteps = 60;

spec::ModelSpec SmallModel() {
  spec::ModelSpec c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 384;
  c.max_seq_len = kSeq;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-5;
  return c;
}

// A byte corpus with structure to learn (words, spaces, punctuation),
// deterministic without any file.
std::vector<int32_t> Corpus() {
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

// Losses of kSteps AdamW steps with `ops`, windows drawn in a fixed order.
std::vector<float> Train(std::shared_ptr<kernels::Ops> ops) {
  const std::vector<int32_t> corpus = Corpus();
  LlamaModel model(SmallModel(), spec::Recompute::kNone, ops);
  model.InitParameters(1234);
  const int64_t n = model.NumParameters();
  float* param = model.Parameters().front().data;
  float* grad = model.Gradients().front().data;
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  std::vector<int32_t> inputs(kBatch * kSeq), targets(kBatch * kSeq);
  uint64_t state = 99;
  std::vector<float> losses;
  for (int64_t step = 1; step <= kSteps; ++step) {
    for (int64_t b = 0; b < kBatch; ++b) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const size_t start = (state >> 24) % (corpus.size() - kSeq - 1);
      for (int64_t s = 0; s < kSeq; ++s) {
        inputs[b * kSeq + s] = corpus[start + s];
        targets[b * kSeq + s] = corpus[start + s + 1];
      }
    }
    model.ZeroGradients();
    losses.push_back(model.ForwardBackward(inputs.data(), targets.data(), kBatch, kSeq, 1.0f));
    ops->AdamW(param, grad, m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
  }
  return losses;
}

TEST(Fp8Training, LossCurveFollowsFp32) {
  auto fp8_ops = std::make_shared<kernels::cpu::Fp8EmulationOps>(kernels::cpu::MakeCpuOps(2));
  const std::vector<float> fp32 = Train(kernels::cpu::MakeCpuOps(2));
  const std::vector<float> fp8 = Train(fp8_ops);
  // Per layer and step: 4 forward GEMMs (q|k|v and gate|up fused), 4 dgrad,
  // 4 wgrad; the LM head's stay fp32.
  EXPECT_EQ(fp8_ops->quantized_gemms(), kSteps * 2 * 12);
  double max_rel = 0, tail32 = 0, tail8 = 0;
  bool differs = false;
  for (int64_t i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(std::isfinite(fp8[i])) << "step " << i + 1;
    const double rel = std::fabs(fp8[i] - fp32[i]) / fp32[i];
    max_rel = std::max(max_rel, rel);
    differs = differs || fp8[i] != fp32[i];
    EXPECT_LT(rel, 0.03) << "step " << i + 1 << ": fp8 " << fp8[i] << " fp32 " << fp32[i];
    if (i >= kSteps - 10) {
      tail32 += fp32[i] / 10;
      tail8 += fp8[i] / 10;
    }
  }
  EXPECT_TRUE(differs) << "the fp8 run is bit-identical to fp32: nothing was quantized";
  EXPECT_LT(fp32.back(), 0.6 * fp32.front()) << "the model did not learn; the check is void";
  EXPECT_LT(std::fabs(tail8 - tail32) / tail32, 0.01);
  std::printf("fp8 vs fp32 over %lld steps: first loss %.4f/%.4f, last-10 mean %.4f/%.4f, "
              "max relative difference %.4f\n",
              static_cast<long long>(kSteps), fp8.front(), fp32.front(), tail8, tail32, max_rel);
  for (int64_t i = 0; i < kSteps; i += 10)
    std::printf("  step %2lld  fp32 %.4f  fp8 %.4f\n", static_cast<long long>(i + 1), fp32[i],
                fp8[i]);
}

}  // namespace
}  // namespace loom::engine

#endif  // LOOM_FP8_TEST_MODEL
