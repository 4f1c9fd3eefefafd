// The rendezvous store: namespaces isolate attempts, waiting gets complete on
// set or at their deadline, adds are atomic, dropping a namespace wakes its
// waiters. Only open namespaces (live attempts) accept requests, and each
// has quotas. The commit gate: commit keys wait for the namespace's fence.
#include "coordinator/rendezvous/kv_store.h"

#include <atomic>
#include <thread>
#include <vector>

#include "common/rpc/commit_gate.h"
#include "common/rpc/rank_entries.h"
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

// The commit gate on a clock the test moves: before the fence a commit key is
// UNAVAILABLE (Set and Add), naming the time left and why, and nothing is
// stored; other keys are not held; after the fence the add succeeds as any.
TEST(KvStore, CommitKeysWaitForTheNamespacesFence) {
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  absl::Time now = t0;
  KvStore kv({}, [&now] { return now; });
  kv.OpenNamespace("job-1/attempt-2",
                   {.until = t0 + absl::Seconds(5),
                    .why = "node n2 was lost and its lease may not have run out"});
  const std::string commit = rpc::CommitKey(7);
  EXPECT_EQ(commit, "loom/commit/7");
  absl::StatusOr<int64_t> early = kv.Add("job-1/attempt-2", commit, 1);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(early.status().message());
  EXPECT_NE(message.find("5.0 s more"), std::string::npos) << message;
  EXPECT_NE(message.find("node n2 was lost"), std::string::npos) << message;
  EXPECT_NE(message.find(commit), std::string::npos) << message;
  EXPECT_EQ(kv.Set("job-1/attempt-2", rpc::CommitKey(8), "1").code(),
            absl::StatusCode::kUnavailable);
  // Rendezvous keys are not held.
  EXPECT_EQ(*kv.Add("job-1/attempt-2", "barrier/ready", 1), 1);
  ASSERT_TRUE(kv.Set("job-1/attempt-2", "addr/0", "x").ok());
  // The time left is rounded up, never "0.0 s".
  now = t0 + absl::Milliseconds(4960);
  absl::StatusOr<int64_t> late = kv.Add("job-1/attempt-2", commit, 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(late.status().message()).find("0.1 s more"), std::string::npos)
      << late.status();
  now = t0 + absl::Seconds(5);
  absl::StatusOr<int64_t> on_time = kv.Add("job-1/attempt-2", commit, 1);
  ASSERT_TRUE(on_time.ok()) << on_time.status();
  EXPECT_EQ(*on_time, 1);  // the refused adds were not counted
  EXPECT_TRUE(kv.Set("job-1/attempt-2", rpc::CommitKey(8), "1").ok());
}

TEST(KvStore, WithoutAFenceACommitKeyIsAnyKey) {
  KvStore kv;
  kv.OpenNamespace("job-1/attempt-1");
  EXPECT_EQ(*kv.Add("job-1/attempt-1", rpc::CommitKey(3), 1), 1);
  // A fence already past holds nothing either.
  kv.OpenNamespace("job-1/attempt-2", {.until = absl::Now() - absl::Seconds(1), .why = "old"});
  EXPECT_EQ(*kv.Add("job-1/attempt-2", rpc::CommitKey(3), 1), 1);
}

TEST(KvStore, OpeningAgainRaisesTheFenceButNeverLowersItAndKeepsTheKeys) {
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  absl::Time now = t0;
  KvStore kv({}, [&now] { return now; });
  kv.OpenNamespace("ns", {.until = t0 + absl::Seconds(2), .why = "first"});
  ASSERT_TRUE(kv.Set("ns", "k", "v").ok());
  kv.OpenNamespace("ns", {.until = t0 + absl::Seconds(10), .why = "second"});
  kv.OpenNamespace("ns", {.until = t0 + absl::Seconds(1), .why = "third"});  // earlier: ignored
  kv.OpenNamespace("ns");
  now = t0 + absl::Seconds(5);
  absl::StatusOr<int64_t> held = kv.Add("ns", rpc::CommitKey(1), 1);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(held.status().message()).find("second"), std::string::npos)
      << held.status();
  EXPECT_EQ(*kv.Get("ns", "k", absl::Seconds(1)), "v");
  now = t0 + absl::Seconds(10);
  EXPECT_TRUE(kv.Add("ns", rpc::CommitKey(1), 1).ok());
}

TEST(KvStore, ADroppedNamespaceRefusesACommitAsNotFoundFenceOrNot) {
  KvStore kv;
  kv.OpenNamespace("job-1/attempt-2", {.until = absl::Now() + absl::Hours(1), .why = "lease"});
  kv.DropNamespace("job-1/attempt-2");
  EXPECT_EQ(kv.Add("job-1/attempt-2", rpc::CommitKey(7), 1).status().code(),
            absl::StatusCode::kNotFound);
  kv.OpenNamespace("job-1/attempt-1");
  kv.DropNamespace("job-1/attempt-1");
  EXPECT_EQ(kv.Add("job-1/attempt-1", rpc::CommitKey(7), 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(KvStore, AnInPlaceAttemptStartsWithTheSurvivorsEntriesAndTheirCount) {
  KvStore kv;
  kv.OpenNamespace("job-1/attempt-1");
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(kv.Set("job-1/attempt-1", rpc::RankEntryKey(r, "addr"), "h:" + std::to_string(r)).ok());
    ASSERT_TRUE(kv.Add("job-1/attempt-1", std::string(rpc::kJoinedKey), 1).ok());
  }
  ASSERT_TRUE(kv.Set("job-1/attempt-1", "gloo/dp/0,1,2,3/0", "pair addresses").ok());
  ASSERT_TRUE(kv.Add("job-1/attempt-1", rpc::CommitKey(5), 1).ok());

  // Rank 2 is relaunched; 0, 1 and 3 keep their processes.
  CarriedEntries carried{.from = "job-1/attempt-1", .survivors = {true, true, false, true}};
  EXPECT_EQ(kv.OpenNamespace("job-1/attempt-2", {}, &carried), 3u);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(*kv.Get("job-1/attempt-2", rpc::RankEntryKey(r, "addr"), absl::ZeroDuration()),
              "h:" + std::to_string(r));
  }
  EXPECT_FALSE(kv.Get("job-1/attempt-2", rpc::RankEntryKey(2, "addr"), absl::ZeroDuration()).ok());
  // A communicator's own keys and the commit keys start over.
  EXPECT_FALSE(kv.Get("job-1/attempt-2", "gloo/dp/0,1,2,3/0", absl::ZeroDuration()).ok());
  EXPECT_FALSE(kv.Get("job-1/attempt-2", rpc::CommitKey(5), absl::ZeroDuration()).ok());
  // The relaunched rank's add completes the world.
  EXPECT_EQ(*kv.Add("job-1/attempt-2", std::string(rpc::kJoinedKey), 1), 4);
  ASSERT_TRUE(kv.Set("job-1/attempt-2", rpc::RankEntryKey(2, "addr"), "h:2b").ok());
  // The failed attempt's namespace is unchanged until it is dropped.
  EXPECT_EQ(*kv.Get("job-1/attempt-1", rpc::RankEntryKey(2, "addr"), absl::ZeroDuration()), "h:2");
  EXPECT_EQ(*kv.Get("job-1/attempt-1", std::string(rpc::kJoinedKey), absl::ZeroDuration()), "4");

  // With the old namespace gone nothing is copied, the survivors still count.
  kv.DropNamespace("job-1/attempt-1");
  carried.from = "job-1/attempt-1";
  EXPECT_EQ(kv.OpenNamespace("job-1/attempt-3", {}, &carried), 0u);
  EXPECT_EQ(*kv.Get("job-1/attempt-3", std::string(rpc::kJoinedKey), absl::ZeroDuration()), "3");
}

TEST(KvStore, AWaitingGetOfACarriedKeyIsAnswered) {
  KvStore kv;
  kv.OpenNamespace("a1");
  ASSERT_TRUE(kv.Set("a1", rpc::RankEntryKey(0, "addr"), "h:0").ok());
  kv.OpenNamespace("a2");
  std::atomic<bool> answered{false};
  kv.GetAsync("a2", std::string(rpc::kJoinedKey), absl::Now() + absl::Seconds(10),
              [&](absl::StatusOr<std::string> v) { answered = v.ok() && *v == "1"; });
  CarriedEntries carried{.from = "a1", .survivors = {true, false}};
  EXPECT_EQ(kv.OpenNamespace("a2", {}, &carried), 1u);
  EXPECT_TRUE(answered.load());
}

TEST(RankEntries, OnlyKeysOfTheirFormNameARank) {
  EXPECT_EQ(rpc::RankOfEntry(rpc::RankEntryKey(12, "addr")), 12);
  EXPECT_EQ(rpc::RankOfEntry("loom/rank/3/a/b"), 3);
  for (const char* key : {"loom/rank/", "loom/rank/3", "loom/rank/3/", "loom/rank//a",
                          "loom/rank/-1/a", "loom/rank/x/a", "loom/joined", "rank/3/a"}) {
    EXPECT_FALSE(rpc::RankOfEntry(key).has_value()) << key;
  }
}

}  // namespace
}  // namespace loom::coordinator
