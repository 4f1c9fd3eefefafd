// Runs n ranks as threads of the test process, each with its own Gloo
// communicator over loopback TCP, meeting in one InProcessStore.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_process_store.h"

namespace loom::comm::testing {

// A fresh rendezvous namespace per call, so tests never see each other's keys.
inline std::string UniquePrefix(const std::string& what) {
  static std::atomic<int> counter{0};
  return absl::StrCat("test/", what, "/", counter.fetch_add(1));
}

// Creates n communicators (concurrently: each blocks until all have joined).
inline std::vector<std::unique_ptr<Communicator>> MakeGroup(InProcessStore& store, int n, absl::Duration timeout,
                                                            const std::string& name = "tst") {
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  const std::string prefix = UniquePrefix(name);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.group_name = name;
      options.rank = r;
      options.size = n;
      options.key_prefix = prefix;
      options.timeout = timeout;
      auto comm = CreateGlooCommunicator(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[r] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  return comms;
}

// Runs body(rank, comm) on one thread per rank and joins them.
inline void RunRanks(std::vector<std::unique_ptr<Communicator>>& comms,
                     const std::function<void(int, Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(comms.size()); ++r) {
    threads.emplace_back([&, r] { body(r, *comms[r]); });
  }
  for (auto& t : threads) t.join();
}

}  // namespace loom::comm::testing
