// The rendezvous store: namespaces isolate attempts, waiting gets complete on
// set or at their deadline, adds are atomic, dropping a namespace wakes its
// waiters.
#include "coordinator/rendezvous/kv_store.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

TEST(KvStore, SetThenGet) {
  KvStore kv;
  kv.Set("job-1/attempt-1", "k", "v");
  absl::StatusOr<std::string> value = kv.Get("job-1/attempt-1", "k", absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST(KvStore, NamespacesDoNotMix) {
  KvStore kv;
  kv.Set("job-1/attempt-1", "k", "old");
  absl::StatusOr<std::string> value = kv.Get("job-1/attempt-2", "k", absl::Milliseconds(100));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(KvStore, WaitingGetCompletesWhenSet) {
  KvStore kv;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    kv.Set("ns", "late", "here");
  });
  absl::StatusOr<std::string> value = kv.Get("ns", "late", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
}

TEST(KvStore, WaitingGetTimesOutNamingTheKey) {
  KvStore kv;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = kv.Get("ns", "never", absl::Milliseconds(200));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(value.status().message()).find("never"), std::string::npos);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST(KvStore, AddIsAtomicAcrossThreads) {
  KvStore kv;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) kv.Add("ns", "counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(kv.Add("ns", "counter", 0), 4000);
  EXPECT_EQ(*kv.Get("ns", "counter", absl::Seconds(1)), "4000");
}

TEST(KvStore, AddWakesWaiters) {
  KvStore kv;
  std::atomic<bool> done = false;
  kv.GetAsync("ns", "n", absl::Now() + absl::Seconds(5), [&](absl::StatusOr<std::string> v) {
    EXPECT_EQ(*v, "3");
    done = true;
  });
  kv.Add("ns", "n", 3);
  EXPECT_TRUE(done);
}

TEST(KvStore, DropNamespaceCancelsWaiters) {
  KvStore kv;
  std::atomic<int> code = -1;
  kv.GetAsync("ns", "k", absl::Now() + absl::Seconds(30),
              [&](absl::StatusOr<std::string> v) { code = static_cast<int>(v.status().code()); });
  EXPECT_EQ(kv.NamespaceCount(), 1u);
  kv.DropNamespace("ns");
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(kv.NamespaceCount(), 0u);
}

}  // namespace
}  // namespace loom::coordinator
