// The rendezvous store: namespaces isolate attempts, waiting gets complete on
// set or at their deadline, adds are atomic, dropping a namespace wakes its
// waiters. Only open namespaces (live attempts) accept requests, and each
// has quotas.
#include "coordinator/rendezvous/kv_store.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

TEST(KvStore, SetThenGet) {
  KvStore kv;
  kv.OpenNamespace("job-1/attempt-1");
  ASSERT_TRUE(kv.Set("job-1/attempt-1", "k", "v").ok());
  absl::StatusOr<std::string> value = kv.Get("job-1/attempt-1", "k", absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST(KvStore, NamespacesDoNotMix) {
  KvStore kv;
  kv.OpenNamespace("job-1/attempt-1");
  kv.OpenNamespace("job-1/attempt-2");
  ASSERT_TRUE(kv.Set("job-1/attempt-1", "k", "old").ok());
  absl::StatusOr<std::string> value = kv.Get("job-1/attempt-2", "k", absl::Milliseconds(100));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(KvStore, WaitingGetCompletesWhenSet) {
  KvStore kv;
  kv.OpenNamespace("ns");
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(kv.Set("ns", "late", "here").ok());
  });
  absl::StatusOr<std::string> value = kv.Get("ns", "late", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
}

TEST(KvStore, AStoreWakesOnlyItsKeysWaitersAndTheOthersStillTimeOut) {
  KvStore kv;
  kv.OpenNamespace("ns");
  std::atomic<int> go = 0;
  std::atomic<int> other = -1;
  for (int i = 0; i < 3; ++i) {
    kv.GetAsync("ns", "go", absl::Now() + absl::Seconds(30), [&](absl::StatusOr<std::string> v) {
      if (v.ok() && *v == "1") ++go;
    });
  }
  kv.GetAsync("ns", "other", absl::Now() + absl::Milliseconds(200),
              [&](absl::StatusOr<std::string> v) { other = static_cast<int>(v.status().code()); });
  ASSERT_TRUE(kv.Set("ns", "addr/0", "x").ok());
  EXPECT_EQ(go.load(), 0);
  ASSERT_TRUE(kv.Add("ns", "go", 1).ok());
  EXPECT_EQ(go.load(), 3);  // all of them, at once
  EXPECT_EQ(other.load(), -1);
  while (other.load() == -1) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(other.load(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
}

TEST(KvStore, WaitingGetTimesOutNamingTheKey) {
  KvStore kv;
  kv.OpenNamespace("ns");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = kv.Get("ns", "never", absl::Milliseconds(200));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(value.status().message()).find("never"), std::string::npos);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST(KvStore, AddIsAtomicAcrossThreads) {
  KvStore kv;
  kv.OpenNamespace("ns");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) kv.Add("ns", "counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*kv.Add("ns", "counter", 0), 4000);
  EXPECT_EQ(*kv.Get("ns", "counter", absl::Seconds(1)), "4000");
}

TEST(KvStore, AddWakesWaiters) {
  KvStore kv;
  kv.OpenNamespace("ns");
  std::atomic<bool> done = false;
  kv.GetAsync("ns", "n", absl::Now() + absl::Seconds(5), [&](absl::StatusOr<std::string> v) {
    EXPECT_EQ(*v, "3");
    done = true;
  });
  ASSERT_TRUE(kv.Add("ns", "n", 3).ok());
  EXPECT_TRUE(done);
}

TEST(KvStore, DropNamespaceCancelsWaiters) {
  KvStore kv;
  kv.OpenNamespace("ns");
  std::atomic<int> code = -1;
  kv.GetAsync("ns", "k", absl::Now() + absl::Seconds(30),
              [&](absl::StatusOr<std::string> v) { code = static_cast<int>(v.status().code()); });
  EXPECT_EQ(kv.NamespaceCount(), 1u);
  kv.DropNamespace("ns");
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(kv.NamespaceCount(), 0u);
}

TEST(KvStore, NamespacesThatAreNotOpenRefuseEveryRequest) {
  KvStore kv;
  EXPECT_EQ(kv.Set("job-9/attempt-1", "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv.Add("job-9/attempt-1", "k", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv.Get("job-9/attempt-1", "k", absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(kv.NamespaceCount(), 0u);  // nothing was created by asking
  kv.OpenNamespace("job-9/attempt-1");
  kv.DropNamespace("job-9/attempt-1");
  EXPECT_EQ(kv.Set("job-9/attempt-1", "k", "v").code(), absl::StatusCode::kNotFound);
}

TEST(KvStore, QuotasBoundKeysValuesAndNamespaceBytes) {
  KvStore kv({.max_keys = 3, .max_key_bytes = 8, .max_value_bytes = 10,
              .max_namespace_bytes = 40, .max_waiters = 1});
  kv.OpenNamespace("ns");
  EXPECT_EQ(kv.Set("ns", "k", std::string(11, 'x')).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.Set("ns", "much-too-long-key", "v").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("ns", "a", std::string(10, 'x')).ok());
  ASSERT_TRUE(kv.Set("ns", "b", std::string(10, 'x')).ok());
  // 22 bytes held; a third key of 11 fits, replacing one counts only the change.
  ASSERT_TRUE(kv.Set("ns", "c", std::string(10, 'x')).ok());
  ASSERT_TRUE(kv.Set("ns", "a", std::string(5, 'y')).ok());
  const absl::Status fourth = kv.Set("ns", "d", "v");
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(fourth.message()).find("keys"), std::string::npos) << fourth;
  // The namespace's byte quota: 6 + 11 + 11 = 28 held; 40 at most.
  EXPECT_EQ(kv.Set("ns", "b", std::string(10, 'z')).code(), absl::StatusCode::kOk);
  KvStore small({.max_keys = 100, .max_key_bytes = 8, .max_value_bytes = 10,
                 .max_namespace_bytes = 25, .max_waiters = 1});
  small.OpenNamespace("ns");
  ASSERT_TRUE(small.Set("ns", "a", std::string(10, 'x')).ok());
  ASSERT_TRUE(small.Set("ns", "b", std::string(10, 'x')).ok());
  const absl::Status full = small.Set("ns", "c", std::string(10, 'x'));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(full.message()).find("bytes"), std::string::npos) << full;
  // Waiters are bounded too.
  std::atomic<int> second = -1;
  small.GetAsync("ns", "never-1", absl::Now() + absl::Seconds(30), [](auto) {});
  small.GetAsync("ns", "never-2", absl::Now() + absl::Seconds(30),
                 [&](absl::StatusOr<std::string> v) { second = static_cast<int>(v.status().code()); });
  EXPECT_EQ(second, static_cast<int>(absl::StatusCode::kResourceExhausted));
  small.DropNamespace("ns");
}

TEST(KvStore, AddOnAValueThatIsNotANumberIsAnErrorNotACrash) {
  KvStore kv;
  kv.OpenNamespace("ns");
  ASSERT_TRUE(kv.Set("ns", "k", "not a number").ok());
  EXPECT_EQ(kv.Add("ns", "k", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace loom::coordinator
