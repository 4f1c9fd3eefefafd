// What the graceful stop's vote (TrainingLoop::AnyRank, docs/scheduling.md)
// costs each step on CPU ranks: one all-reduce of a single float over a Gloo
// group per mesh axis of more than one rank. Ranks are threads on loopback,
// as the integration tests' are processes on loopback; prints the median time
// per vote over blocks of calls, for a group of 2, 4 and 8 ranks.
// A benchmark, not a test: the numbers go to docs/scheduling.md.
//
// usage: stop_vote_bench [--calls=500] [--blocks=7]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/in_process_store.h"

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return def;
}

// Median microseconds per vote on a group of `size` ranks.
double VoteMicros(loom::comm::InProcessStore& store, int size, int64_t calls, int64_t blocks) {
  using loom::comm::Communicator;
  std::vector<std::unique_ptr<Communicator>> groups(static_cast<size_t>(size));
  std::vector<int> members;
  for (int r = 0; r < size; ++r) members.push_back(r);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        auto made = loom::comm::CreateGroupCommunicator(
            store, absl::StrCat("vote-", size), "dp", members, r, absl::Seconds(60), "127.0.0.1");
        if (!made.ok()) {
          std::fprintf(stderr, "group: %s\n", made.status().ToString().c_str());
          std::exit(1);
        }
        groups[static_cast<size_t>(r)] = std::move(*made);
      });
    }
    for (auto& t : threads) t.join();
  }
  std::vector<double> per_block;
  for (int64_t b = 0; b < blocks; ++b) {
    std::vector<double> took(static_cast<size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        float flag = 0.0f;
        const absl::Time start = absl::Now();
        for (int64_t i = 0; i < calls; ++i) {
          if (!groups[static_cast<size_t>(r)]->AllReduce(std::span<float>(&flag, 1)).ok()) {
            std::exit(1);
          }
        }
        took[static_cast<size_t>(r)] = absl::ToDoubleMicroseconds(absl::Now() - start) /
                                       static_cast<double>(calls);
      });
    }
    for (auto& t : threads) t.join();
    per_block.push_back(took[0]);
  }
  std::sort(per_block.begin(), per_block.end());
  return per_block[per_block.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t calls = Flag(argc, argv, "calls", 500);
  const int64_t blocks = Flag(argc, argv, "blocks", 7);
  loom::comm::InProcessStore store;
  for (int size : {2, 4, 8}) {
    std::printf("{\"what\":\"stop vote: all_reduce of 1 float\",\"ranks\":%d,\"us_per_vote\":%.1f}\n",
                size, VoteMicros(store, size, calls, blocks));
  }
  return 0;
}
