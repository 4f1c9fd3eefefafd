// Results of every Gloo collective, checked exactly against references
// computed here, for groups of 2, 3 and 4 ranks running as threads.
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/traffic.h"

namespace loom::comm {
namespace {

using testing::MakeGroup;
using testing::RunRanks;

// Small integers: every summation order gives the same float, so results
// compare exactly whatever order the algorithm adds in.
float Value(int rank, size_t i) { return static_cast<float>((rank * 7 + static_cast<int>(i) * 3) % 23) - 11.0f; }

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { comms_ = MakeGroup(store_, GetParam(), absl::Seconds(20)); }
  int n() const { return GetParam(); }

  InProcessStore store_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

TEST_P(CollectivesTest, AllReduceSumAndMax) {
  for (size_t len : {size_t{1}, size_t{7}, size_t{1001}, size_t{70000}}) {
    RunRanks(comms_, [&](int r, Communicator& comm) {
      std::vector<float> sum(len), max(len);
      for (size_t i = 0; i < len; ++i) sum[i] = max[i] = Value(r, i);
      ASSERT_TRUE(comm.AllReduce(sum, ReduceOp::kSum).ok());
      ASSERT_TRUE(comm.AllReduce(max, ReduceOp::kMax).ok());
      for (size_t i = 0; i < len; ++i) {
        float want_sum = 0, want_max = Value(0, i);
        for (int q = 0; q < n(); ++q) {
          want_sum += Value(q, i);
          want_max = std::max(want_max, Value(q, i));
        }
        ASSERT_EQ(sum[i], want_sum) << "len " << len << " i " << i;
        ASSERT_EQ(max[i], want_max) << "len " << len << " i " << i;
      }
    });
  }
}

TEST_P(CollectivesTest, AllReduceGivesEveryRankTheSameBits) {
  // Non-integer values: the sum depends on the order of additions, and every
  // rank must still end with bitwise the same result (replicas stay equal).
  std::vector<std::vector<float>> results(n());
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<float> x(4099);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / static_cast<float>(3 + r + i % 97) + 1e-3f * r;
    ASSERT_TRUE(comm.AllReduce(x).ok());
    results[r] = x;
  });
  for (int r = 1; r < n(); ++r) {
    ASSERT_EQ(0, std::memcmp(results[0].data(), results[r].data(), results[0].size() * sizeof(float)))
        << "rank " << r;
  }
}

TEST_P(CollectivesTest, ReduceScatter) {
  for (size_t chunk : {size_t{1}, size_t{5}, size_t{3000}}) {
    RunRanks(comms_, [&](int r, Communicator& comm) {
      std::vector<float> in(chunk * n());
      for (size_t i = 0; i < in.size(); ++i) in[i] = Value(r, i);
      std::vector<float> out(chunk, -999);
      ASSERT_TRUE(comm.ReduceScatter(in, out).ok());
      for (size_t i = 0; i < chunk; ++i) {
        float want = 0;
        for (int q = 0; q < n(); ++q) want += Value(q, r * chunk + i);
        ASSERT_EQ(out[i], want) << "chunk " << chunk << " i " << i;
      }
    });
  }
}

TEST_P(CollectivesTest, AllGather) {
  const size_t len = 9;
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<float> in(len);
    for (size_t i = 0; i < len; ++i) in[i] = Value(r, i);
    std::vector<float> out(len * n(), -999);
    ASSERT_TRUE(comm.AllGather(in, out).ok());
    for (int q = 0; q < n(); ++q) {
      for (size_t i = 0; i < len; ++i) ASSERT_EQ(out[q * len + i], Value(q, i));
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < n(); ++root) {
    RunRanks(comms_, [&](int r, Communicator& comm) {
      std::vector<float> data(513);
      for (size_t i = 0; i < data.size(); ++i) data[i] = r == root ? Value(root, i) : -1.0f;
      ASSERT_TRUE(comm.Broadcast(data, root).ok());
      for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], Value(root, i)) << "root " << root;
    });
  }
}

TEST_P(CollectivesTest, AllToAllUnevenSplits) {
  // Rank r sends (r + 2j) % 4 elements to rank j: some splits are empty.
  auto count = [](int src, int dst) { return static_cast<int64_t>((src + 2 * dst) % 4); };
  auto encode = [](int src, int dst, int64_t i) { return static_cast<float>(src * 1000 + dst * 100 + i); };
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<int64_t> send_counts(n()), recv_counts(n());
    std::vector<float> in;
    for (int j = 0; j < n(); ++j) {
      send_counts[j] = count(r, j);
      recv_counts[j] = count(j, r);
      for (int64_t i = 0; i < send_counts[j]; ++i) in.push_back(encode(r, j, i));
    }
    std::vector<float> out(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}), -1);
    ASSERT_TRUE(comm.AllToAll(in, send_counts, out, recv_counts).ok());
    size_t at = 0;
    for (int j = 0; j < n(); ++j) {
      for (int64_t i = 0; i < recv_counts[j]; ++i) ASSERT_EQ(out[at++], encode(j, r, i)) << "from " << j;
    }
  });
}

TEST_P(CollectivesTest, AllToAllInt64IsExactAndCounted) {
  // Values a float would round (beyond 2^24 and 2^53, negative), chunks of 3.
  auto encode = [](int src, int dst, int64_t i) {
    return (int64_t{1} << 60) + int64_t{16777217} * (src * 16 + dst) - i * 3;
  };
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<int64_t> in, out(3 * n(), -1);
    for (int j = 0; j < n(); ++j) {
      for (int64_t i = 0; i < 3; ++i) in.push_back(encode(r, j, i) * (i == 2 ? -1 : 1));
    }
    ASSERT_TRUE(comm.AllToAllInt64(in, out).ok());
    for (int j = 0; j < n(); ++j) {
      for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(out[3 * j + i], encode(j, r, i) * (i == 2 ? -1 : 1)) << j;
    }
    std::vector<int64_t> bad(3 * n() + 1);
    EXPECT_EQ(comm.AllToAllInt64(bad, bad).code(), absl::StatusCode::kInvalidArgument);
    const OpCounters c = comm.Stats().at("all_to_all_int64");
    EXPECT_EQ(c.calls, 1);
    EXPECT_EQ(c.bytes, (n() - 1) * 3 * 8);
    EXPECT_EQ(c.logical_bytes, n() * 3 * 8);
  });
}

TEST_P(CollectivesTest, SendRecvBothWaysAtOnce) {
  // Every rank sends right and receives from the left with both in flight,
  // the pipeline's pattern; blocking calls in one order would deadlock.
  RunRanks(comms_, [&](int r, Communicator& comm) {
    const int right = (r + 1) % n(), left = (r + n() - 1) % n();
    std::vector<float> out(100), in(100, -1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = Value(r, i);
    auto send = comm.SendAsync(out, right, 11);
    auto recv = comm.RecvAsync(in, left, 11);
    ASSERT_TRUE(send->Wait().ok());
    ASSERT_TRUE(recv->Wait().ok());
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], Value(left, i));
  });
}

TEST_P(CollectivesTest, TagsMatchSendsToReceives) {
  RunRanks(comms_, [&](int r, Communicator& comm) {
    if (r == 0) {
      std::vector<float> a(4, 7.0f), b(6, 3.0f);
      auto first = comm.SendAsync(a, 1, 7);
      auto second = comm.SendAsync(b, 1, 3);
      ASSERT_TRUE(first->Wait().ok());
      ASSERT_TRUE(second->Wait().ok());
    } else if (r == 1) {
      std::vector<float> b(6), a(4);
      ASSERT_TRUE(comm.Recv(b, 0, 3).ok());  // posted in the other order
      ASSERT_TRUE(comm.Recv(a, 0, 7).ok());
      EXPECT_EQ(a, std::vector<float>(4, 7.0f));
      EXPECT_EQ(b, std::vector<float>(6, 3.0f));
    }
  });
}

TEST_P(CollectivesTest, AsyncAllReduceOverlapsWithWorkAndKeepsOrder) {
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<std::vector<float>> buckets(3, std::vector<float>(20000));
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (size_t i = 0; i < buckets[b].size(); ++i) buckets[b][i] = Value(r + static_cast<int>(b), i);
    }
    std::vector<std::unique_ptr<Work>> works;
    for (auto& bucket : buckets) works.push_back(comm.AllReduceAsync(bucket));
    // Work on this thread while the reductions run on the communicator's.
    double busy = 0;
    for (int i = 0; i < 200000; ++i) busy += i * 0.5;
    EXPECT_GT(busy, 0);
    // A blocking collective queued behind the asynchronous ones.
    std::vector<float> one = {static_cast<float>(r)}, all(n());
    ASSERT_TRUE(comm.AllGather(one, all).ok());
    for (int q = 0; q < n(); ++q) EXPECT_EQ(all[q], q);
    for (size_t b = 0; b < works.size(); ++b) {
      ASSERT_TRUE(works[b]->Wait().ok());
      ASSERT_TRUE(works[b]->Wait().ok());  // twice is fine
      for (size_t i = 0; i < buckets[b].size(); ++i) {
        float want = 0;
        for (int q = 0; q < n(); ++q) want += Value(q + static_cast<int>(b), i);
        ASSERT_EQ(buckets[b][i], want);
      }
    }
    ASSERT_TRUE(comm.Barrier().ok());
  });
}

TEST_P(CollectivesTest, CountersFollowTheAlgorithmVolumes) {
  const int64_t elems = 12 * 100;  // divisible by 2, 3 and 4
  const int64_t bytes = elems * 4;
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<float> full(elems, 1.0f), shard(elems / n()), gathered(elems);
    ASSERT_TRUE(comm.AllReduce(full).ok());
    ASSERT_TRUE(comm.AllReduce(full).ok());
    ASSERT_TRUE(comm.ReduceScatter(full, shard).ok());
    ASSERT_TRUE(comm.AllGather(shard, gathered).ok());
    ASSERT_TRUE(comm.Broadcast(full, 0).ok());
    std::vector<int64_t> counts(n(), 10);
    std::vector<float> a2a_in(10 * n()), a2a_out(10 * n());
    ASSERT_TRUE(comm.AllToAll(a2a_in, counts, a2a_out, counts).ok());
    ASSERT_TRUE(comm.Barrier().ok());
    if (r == 0) {
      ASSERT_TRUE(comm.Send(shard, 1, 5).ok());
    } else if (r == 1) {
      ASSERT_TRUE(comm.Recv(shard, 0, 5).ok());
    }

    const CommStats stats = comm.Stats();
    // The ring volumes written out, not through traffic.h.
    EXPECT_EQ(stats.at("all_reduce").calls, 2);
    EXPECT_EQ(stats.at("all_reduce").bytes, 2 * (2 * (n() - 1) * bytes / n()));
    EXPECT_EQ(stats.at("all_reduce").logical_bytes, 2 * bytes);
    EXPECT_EQ(stats.at("reduce_scatter").bytes, (n() - 1) * bytes / n());
    EXPECT_EQ(stats.at("all_gather").bytes, (n() - 1) * bytes / n());
    // With SP, reduce-scatter plus all-gather move what one all-reduce does.
    EXPECT_EQ(stats.at("reduce_scatter").bytes + stats.at("all_gather").bytes,
              stats.at("all_reduce").bytes / 2);
    EXPECT_EQ(stats.at("all_to_all").bytes, (n() - 1) * 10 * 4);
    EXPECT_EQ(stats.at("barrier").calls, 1);
    EXPECT_EQ(stats.at("barrier").bytes, 0);
    // The binomial tree: root 0 feeds 1 and 2; with four ranks 1 feeds 3.
    const int children = r == 0 ? (n() == 2 ? 1 : 2) : (n() == 4 && r == 1 ? 1 : 0);
    EXPECT_EQ(stats.at("broadcast").bytes, children * bytes) << "rank " << r;
    if (r == 0) {
      EXPECT_EQ(stats.at("send").bytes, bytes / n());
    }
    if (r == 1) {
      EXPECT_EQ(stats.at("recv").bytes, 0);
      EXPECT_EQ(stats.at("recv").logical_bytes, bytes / n());
    }
    const CommProgress progress = comm.Progress();
    EXPECT_EQ(progress.issued, progress.completed);
    EXPECT_TRUE(progress.current_op.empty());
  });
  // Summed over the group the broadcast sends n-1 copies.
  int64_t total = 0;
  for (auto& comm : comms_) total += comm->Stats().at("broadcast").bytes;
  EXPECT_EQ(total, (n() - 1) * bytes);
}

TEST_P(CollectivesTest, BadArgumentsAreRejectedWithoutBreakingTheGroup) {
  RunRanks(comms_, [&](int r, Communicator& comm) {
    std::vector<float> in(5), out(2);
    absl::Status bad = comm.ReduceScatter(in, out);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.message().find("group tst: reduce_scatter"), std::string::npos) << bad;
    EXPECT_EQ(comm.Send(in, r, 0).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Broadcast(in, n()).code(), absl::StatusCode::kInvalidArgument);
    std::vector<float> x(3, 1.0f);
    ASSERT_TRUE(comm.AllReduce(x).ok());
    EXPECT_EQ(x[0], static_cast<float>(n()));
  });
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, CollectivesTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return absl::StrCat("n", info.param); });

}  // namespace
}  // namespace loom::comm
