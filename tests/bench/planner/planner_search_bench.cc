// Time to plan: enumerate, estimate, reject and rank every layout of the
// playbook's 80B model on 64 nodes of 8 H100s (goal: under 100 ms), plus the
// whole playbook sweep (4 models x 7 node counts).
#include "benchmark/benchmark.h"
#include "planner/search.h"
#include "planner/sweep.h"

namespace loom::planner {
namespace {

PlanRequest Request80B(int64_t nodes) {
  PlanRequest req;
  req.workload = MakeWorkload(PlaybookModels()[3].shape, 4096, 256, RecipeKind::kBf16Fp32Accum);
  req.cluster = *ClusterPreset("h100-sxm");
  req.cluster.nodes = nodes;
  return req;
}

void BM_Plan80BOn64Nodes(benchmark::State& state) {
  const PlanRequest req = Request80B(64);
  int64_t considered = 0, fit = 0;
  for (auto _ : state) {
    absl::StatusOr<PlanResult> r = PlanLayouts(req);
    considered = r->layouts_considered;
    fit = static_cast<int64_t>(r->ranked.size());
    benchmark::DoNotOptimize(r);
  }
  state.counters["layouts"] = static_cast<double>(considered);
  state.counters["fit"] = static_cast<double>(fit);
  state.counters["layouts_per_s"] =
      benchmark::Counter(static_cast<double>(considered), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Plan80BOn64Nodes)->Unit(benchmark::kMillisecond);

void BM_PlaybookSweep(benchmark::State& state) {
  const SweepRequest req = PlaybookSweep(*ClusterPreset("h100-sxm"));
  for (auto _ : state) {
    absl::StatusOr<SweepResult> r = RunSweep(req);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_PlaybookSweep)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom::planner

BENCHMARK_MAIN();
