// Prints the peak-memory table of docs/parallel_memory.md: per ZeRO stage and
// DP size, the peaks of the engine's own accounting (MemoryTracker) on rank 0
// during the second optimizer step of a small Llama. Not a test.
//   OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive engine_zero_memory_report
#include <cstdio>

#include "tests/engine_parallel/dp_harness.h"

namespace loom::engine {
namespace {

int Main() {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(200000, 1));
  spec::JobSpec base = testing::ParallelJob(dir / "train.txt", 0);
  base.model.hidden_size = 256;
  base.model.num_layers = 8;
  base.model.num_heads = 8;
  base.model.num_kv_heads = 4;
  base.model.ffn_hidden_size = 768;
  base.model.max_seq_len = 64;
  base.train.seq_len = 64;
  base.train.global_batch_size = 8;
  base.train.micro_batch_size = 2;
  base.train.steps = 2;
  const int64_t n = testing::LlamaParameterCount(base.model);
  std::printf("model: hidden 256, 8 layers, 8 heads (4 kv), ffn 768, vocab 256: %lld parameters "
              "(%.2f MiB fp32); seq 64, micro-batch 2, global batch 8\n\n",
              static_cast<long long>(n), n * 4 / 1048576.0);
  std::printf("| dp | ZeRO | parameters | gradients | optimizer states | activations | comm buffers "
              "| total peak (MiB) |\n|---|---|---|---|---|---|---|---|\n");
  auto row = [](int dp, int stage, const MemoryUsage& u) {
    auto mib = [](int64_t b) { return b / 1048576.0; };
    std::printf("| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | **%.2f** |\n", dp, stage,
                mib(u.Peak(MemoryKind::kParameters)), mib(u.Peak(MemoryKind::kGradients)),
                mib(u.Peak(MemoryKind::kOptimizerStates)), mib(u.Peak(MemoryKind::kActivations)),
                mib(u.Peak(MemoryKind::kCommBuffers)), mib(u.total_peak));
  };
  row(1, 0, testing::RunSingle(base, 2).memory);
  for (int dp : {2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      spec::JobSpec job = base;
      job.parallelism.zero_stage = stage;
      row(dp, stage, testing::RunDataParallel(job, dp, 2)[0].memory);
    }
  }
  return 0;
}

}  // namespace
}  // namespace loom::engine

int main() { return loom::engine::Main(); }
