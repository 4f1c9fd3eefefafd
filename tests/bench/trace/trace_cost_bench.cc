// What `loomctl trace` costs (docs/observability.md, "Traces"):
//  1. a rank's side, per collective call through the CollectiveClock with the
//     trace recorder as its observer: outside the traced step (one atomic
//     load more than the timing alone) and in it (an event added);
//  2. per phase change in the traced step;
//  3. the coordinator's side: assembling the JSON of `ranks` ranks of
//     `events` events each (the caps: 64 and 1024), and its size.
// A benchmark, not a test: the numbers go to tests/bench/trace/results.md.
//
// usage: trace_cost_bench [--calls=200000] [--ranks=64] [--events=1024]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/service/trace_assembly.h"
#include "worker/comm/collective_clock.h"
#include "worker/trainer/step_trace.h"

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return def;
}

// Nanoseconds per call of `calls` calls of fn.
template <typename Fn>
double PerCall(int64_t calls, Fn&& fn) {
  const absl::Time start = absl::Now();
  for (int64_t i = 0; i < calls; ++i) fn(i);
  return absl::ToDoubleNanoseconds(absl::Now() - start) / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  const int64_t calls = Flag(argc, argv, "calls", 200000);
  const int64_t ranks = Flag(argc, argv, "ranks", 64);
  const int64_t events = Flag(argc, argv, "events", trainer::kMaxTraceEvents);

  const std::string group = "tp[0,1]";
  const absl::Time now = absl::Now();
  comm::CollectiveClock plain;
  plain.BeginStep(now);
  const double timing_only = PerCall(calls, [&](int64_t) {
    plain.Record(group, "all_reduce", absl::Now(), absl::Microseconds(3), 4096);
  });

  auto recorder = std::make_shared<trainer::StepTraceRecorder>();
  comm::CollectiveClock clock;
  clock.set_observer([recorder](const std::string& g, const char* op, absl::Time entered,
                                absl::Duration blocked, int64_t bytes) {
    // As the trainer's observer does (worker/trainer/rank_epochs.cc).
    if (recorder->recording()) recorder->Collective(g, op, entered, blocked, bytes, absl::Now());
  });
  clock.BeginStep(now);
  recorder->BeginStep(1, false, now);
  const double observed_idle = PerCall(calls, [&](int64_t) {
    clock.Record(group, "all_reduce", absl::Now(), absl::Microseconds(3), 4096);
  });
  // Recording: a fresh step every kMaxTraceEvents calls, so every call adds
  // an event (none is dropped).
  int64_t step = 2;
  const double recording = PerCall(calls, [&](int64_t i) {
    if (i % trainer::kMaxTraceEvents == 0) recorder->BeginStep(++step, true, absl::Now());
    clock.Record(group, "all_reduce", absl::Now(), absl::Microseconds(3), 4096);
  });
  const double phases = PerCall(calls, [&](int64_t i) {
    if (i % trainer::kMaxTraceEvents == 0) recorder->BeginStep(++step, true, absl::Now());
    recorder->Phase(i % 2 == 0 ? "forward" : "backward", i % 8, 0, absl::Now());
  });
  std::printf("per collective call: timing alone %.0f ns, with the recorder outside the traced "
              "step %.0f ns, in it %.0f ns\n",
              timing_only, observed_idle, recording);
  std::printf("per phase change in the traced step: %.0f ns\n", phases);

  // A full trace per rank, as the trainer would send it.
  trainer::StepTraceRecorder full;
  full.BeginStep(7, true, now);
  for (int64_t i = 0; i < events; ++i) {
    if (i % 4 == 0) {
      full.Phase("forward", i % 16, 0, now + absl::Microseconds(10 * i));
    } else {
      full.Collective(i % 3 == 0 ? "pp[0,2]" : group, "all_reduce", now + absl::Microseconds(10 * i),
                      absl::Microseconds(2), 1 << 20, now + absl::Microseconds(10 * i + 5));
    }
  }
  std::optional<loom::v1::StepTrace> trace = full.Finish(7, now + absl::Microseconds(10 * events));
  if (!trace.has_value()) return 1;
  std::vector<coordinator::RankTrace> traces;
  for (int64_t r = 0; r < ranks; ++r) {
    traces.push_back({static_cast<int>(r), "TP(0)-CP(0)-PP(0)-DP(0)-Rank(0)", "node-a", *trace});
  }
  const absl::Time begin = absl::Now();
  const std::string json = coordinator::ChromeTraceJson({"job-1", 7, {}}, traces);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - begin);
  std::printf("one rank's trace: %d events (%lld dropped), %zu bytes encoded in its report\n",
              trace->events_size(), static_cast<long long>(trace->dropped_events()),
              trace->ByteSizeLong());
  std::printf("assembly of %lld ranks: %.1f ms, %.2f MiB of JSON\n", static_cast<long long>(ranks),
              ms, static_cast<double>(json.size()) / (1 << 20));
  return 0;
}
