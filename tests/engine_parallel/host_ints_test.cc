// Control values cross the groups as integers, exactly: flags, pids and file
// digests (sizes beyond 2^32, CRCs with the top bit set) survive a broadcast
// and an all-gather over a real Gloo group bit for bit, where a float sum
// would round them.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/parallel/host_floats.h"

namespace loom::engine {
namespace {

TEST(HostIntsTest, BroadcastAndAllGatherAreExact) {
  constexpr int kRanks = 3;
  comm::InProcessStore store;
  auto group = comm::testing::MakeGroup(store, kRanks, absl::Seconds(30), "dp");
  std::vector<std::vector<int32_t>> gathered(kRanks);
  std::vector<std::vector<int32_t>> broadcast(kRanks);
  comm::testing::RunRanks(group, [&](int rank, comm::Communicator& c) {
    auto ops = kernels::cpu::MakeCpuOps(1);
    std::vector<int32_t> root = {16777217, std::numeric_limits<int32_t>::min(), -1};
    std::vector<int32_t> mine = rank == 0 ? root : std::vector<int32_t>{0, 0, 0};
    ASSERT_TRUE(BroadcastHostInts(*ops, &c, mine.data(), 3, 0).ok());
    broadcast[rank] = mine;
    const std::vector<int32_t> own = {rank, 16777217 + rank,
                                      std::numeric_limits<int32_t>::max() - rank};
    gathered[rank].assign(3 * kRanks, 0);
    ASSERT_TRUE(AllGatherHostInts(*ops, &c, own.data(), 3, gathered[rank].data()).ok());
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(broadcast[r],
              (std::vector<int32_t>{16777217, std::numeric_limits<int32_t>::min(), -1}));
    for (int from = 0; from < kRanks; ++from) {
      EXPECT_EQ(gathered[r][3 * from], from);
      EXPECT_EQ(gathered[r][3 * from + 1], 16777217 + from);
      EXPECT_EQ(gathered[r][3 * from + 2], std::numeric_limits<int32_t>::max() - from);
    }
  }
}

TEST(HostIntsTest, FileDigestRoundTrips) {
  FileDigest d;
  d.bytes = (int64_t{1} << 40) + 12345;
  d.crc32 = 0xdeadbeefu;
  int32_t slot[kDigestInts] = {};
  EncodeFileDigest(d, slot);
  EXPECT_EQ(slot[0], 1);
  const FileDigest back = DecodeFileDigest(slot);
  EXPECT_EQ(back.bytes, d.bytes);
  EXPECT_EQ(back.crc32, d.crc32);
}

}  // namespace
}  // namespace loom::engine
