// How fast the scheduling policy decides (docs/scale.md, "Scheduling"): one
// Decide over 1,000 waiting jobs from 10 users on 256 nodes of 8 GPUs with
// 200 running, and the whole simulated run of those 1,000 jobs.
#include <benchmark/benchmark.h>

#include "tests/coordinator/scheduling_simulation.h"

namespace loom::coordinator::sched::testing {
namespace {

ClusterView BusyCluster() {
  SimConfig config;
  std::vector<SimJob> jobs = MakeJobs(config);
  ClusterView view;
  view.now_s = 3600;
  view.capacity["gpu"] = config.devices;
  int64_t held = 0;
  for (int i = 0; i < 200; ++i) {
    RunningJob r{.id = absl::StrCat("run-", i),
                 .user = absl::StrCat("user-", i % 10),
                 .priority = i % 3,
                 .kind = "gpu",
                 .devices = 8,
                 .started_s = 1000.0 + i,
                 .runtime_s = (i % 4 == 0) ? 0 : 7200.0};
    held += r.devices;
    view.running.push_back(r);
  }
  view.free["gpu"] = config.devices - held;  // 448 free
  for (const SimJob& j : jobs) view.waiting.push_back(j.spec);
  for (int u = 0; u < 10; ++u) view.usage[absl::StrCat("user-", u)] = 1000.0 * u;
  view.quotas.users[{"user-0", "gpu"}] = 512;
  view.quotas.users[{"user-1", "gpu"}] = 256;
  return view;
}

void BM_DecideOver1000Waiting(benchmark::State& state) {
  const ClusterView view = BusyCluster();
  PolicyOptions options;
  options.preemption = state.range(0) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(Decide(view, options));
  state.counters["decisions_per_s"] = benchmark::Counter(
      static_cast<double>(view.waiting.size()) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["passes_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecideOver1000Waiting)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_SimulateAllJobs(benchmark::State& state) {
  SimConfig config;
  config.user_quota = {{"user-0", 512}, {"user-1", 256}};
  int64_t calls = 0;
  for (auto _ : state) {
    SimResult result = Simulate(config);
    calls = result.decide_calls;
    benchmark::DoNotOptimize(result);
  }
  state.counters["decide_calls"] = static_cast<double>(calls);
}
BENCHMARK(BM_SimulateAllJobs)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
}  // namespace loom::coordinator::sched::testing

BENCHMARK_MAIN();
