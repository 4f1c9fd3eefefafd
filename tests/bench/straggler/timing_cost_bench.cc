// What per-rank timing and straggler detection cost (docs/observability.md):
//  1. a rank's side: small all-reduces on two Gloo ranks (threads, loopback),
//     in alternating blocks through the plain group and through the timed
//     group (timed_communicator.h), plus a step summary per block; prints the
//     median time per call of each and their difference;
//     (on a loaded machine the transport's noise hides the difference), and
//     the timing alone: two clock reads and one Record per call;
//  2. the coordinator's side: StragglerDetector::Observe for every rank of
//     one stage of `ranks` ranks, per step; prints the time per report.
// A benchmark, not a test: the numbers go to docs/observability.md.
//
// usage: timing_cost_bench [--calls=2000] [--blocks=10] [--floats=256] [--ranks=4096]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/health/straggler_detector.h"
#include "worker/comm/collective_clock.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/timed_communicator.h"

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return def;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  const int64_t calls = Flag(argc, argv, "calls", 2000);
  const int64_t blocks = Flag(argc, argv, "blocks", 10);
  const int64_t floats = Flag(argc, argv, "floats", 256);
  const int64_t ranks = Flag(argc, argv, "ranks", 4096);

  comm::InProcessStore store;
  std::vector<std::unique_ptr<comm::Communicator>> plain(2);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto made = comm::CreateGroupCommunicator(store, "bench", "dp", {0, 1}, r, absl::Seconds(60),
                                                  "127.0.0.1");
        if (!made.ok()) {
          std::fprintf(stderr, "group: %s\n", made.status().ToString().c_str());
          std::exit(1);
        }
        plain[r] = std::move(*made);
      });
    }
    for (auto& t : threads) t.join();
  }
  std::vector<comm::Communicator*> raw = {plain[0].get(), plain[1].get()};
  std::vector<std::shared_ptr<comm::CollectiveClock>> clocks = {
      std::make_shared<comm::CollectiveClock>(), std::make_shared<comm::CollectiveClock>()};
  // The timed groups wrap groups of their own (a wrapper owns its group).
  std::vector<std::unique_ptr<comm::Communicator>> timed(2);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto made = comm::CreateGroupCommunicator(store, "bench-timed", "dp", {0, 1}, r,
                                                  absl::Seconds(60), "127.0.0.1");
        if (!made.ok()) std::exit(1);
        timed[r] = std::make_unique<comm::TimedCommunicator>(std::move(*made), clocks[r]);
      });
    }
    for (auto& t : threads) t.join();
  }
  std::vector<double> plain_us, timed_us;
  for (int64_t b = 0; b < blocks; ++b) {
    for (bool with_timing : {false, true}) {
      std::vector<double> took(2);
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          comm::Communicator& c = with_timing ? *timed[r] : *raw[r];
          std::vector<float> x(floats, 1.0f);
          if (with_timing) clocks[r]->BeginStep(absl::Now());
          const absl::Time start = absl::Now();
          for (int64_t i = 0; i < calls; ++i) {
            if (!c.AllReduce(x).ok()) std::exit(1);
          }
          if (with_timing) clocks[r]->Summary();
          took[r] = absl::ToDoubleMicroseconds(absl::Now() - start) / calls;
        });
      }
      for (auto& t : threads) t.join();
      (with_timing ? timed_us : plain_us).push_back(took[0]);
    }
  }
  const double p = Median(plain_us), t = Median(timed_us);
  std::printf("{\"what\":\"all_reduce of %lld floats, 2 ranks\",\"plain_us_per_call\":%.2f,"
              "\"timed_us_per_call\":%.2f,\"timing_us_per_call\":%.2f}\n",
              static_cast<long long>(floats), p, t, t - p);

  // The timing alone, without a transport under it: what a timed call adds
  // (two clock reads and one Record).
  {
    comm::CollectiveClock clock;
    clock.BeginStep(absl::Now());
    const int64_t n = 1000000;
    const absl::Time begin = absl::Now();
    for (int64_t i = 0; i < n; ++i) {
      const absl::Time entered = absl::Now();
      clock.Record("dp[0,1,2,3]", "all_reduce", entered, absl::Now() - entered);
    }
    const double ns = absl::ToDoubleNanoseconds(absl::Now() - begin) / static_cast<double>(n);
    std::printf("{\"what\":\"clock reads and Record per call\",\"ns_per_call\":%.1f}\n", ns);
  }

  coordinator::StragglerDetector detector(coordinator::StragglerPolicy{},
                                          std::vector<int>(static_cast<size_t>(ranks), 0));
  const int64_t steps = 40;
  const absl::Time start = absl::Now();
  for (int64_t step = 1; step <= steps; ++step) {
    for (int64_t r = 0; r < ranks; ++r) {
      detector.Observe(static_cast<int32_t>(r), step, 0.1 + 1e-6 * static_cast<double>((r * 7 + step) % 13), 0.2);
    }
  }
  const double us = absl::ToDoubleMicroseconds(absl::Now() - start);
  std::printf("{\"what\":\"detector, one stage of %lld ranks, %lld steps\",\"us_per_report\":%.3f,"
              "\"ms_per_step\":%.2f}\n",
              static_cast<long long>(ranks), static_cast<long long>(steps),
              us / static_cast<double>(ranks * steps), us / 1000 / static_cast<double>(steps));
  return 0;
}
