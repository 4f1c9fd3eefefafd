// Snapshot copies over a real Gloo pair group (loopback): a copy arrives whole
// and parsed, in many chunks; a sender without the asked snapshot says so; a
// copy torn by the sender's death mid-way leaves the receiver with its
// previous complete copy (the copier's background receive, as a buddy runs
// it); an abort of the pair ends a copy waiting for its peer at once; a buddy
// copy leaves out the pieces the buddy holds itself, which its own snapshot
// of the step fills in, and nothing else.
#include "worker/engine/snapshot/snapshot_transfer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/snapshot/snapshot_copier.h"
#include "worker/engine/snapshot/snapshot_generations.h"

namespace loom::engine {
namespace {

// floats of state in one piece, so the image spans many 4 KiB chunks.
std::shared_ptr<Snapshot> Filled(int64_t step, int64_t floats, float base) {
  SnapshotManifest m;
  m.owner = {1, "dp2 tp1 pp1 cp1 ep1 zero0 v1 -", "dp 1/2 tp 0/1 pp 0/1 cp 0/1 ep 0/1"};
  m.step = step;
  m.pieces.push_back({"model.embed_tokens.weight", 0, {floats}, {floats}, -1, 0, 0, floats, 0});
  LayOutSnapshotPieces(&m);
  auto s = std::make_shared<Snapshot>();
  s->Reset(m);
  for (int64_t i = 0; i < floats; ++i) s->data()[i] = base + static_cast<float>(i);
  return s;
}

bool SameBytes(const Snapshot& a, const Snapshot& b) {
  return a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.bytes().data(), b.bytes().data(), static_cast<size_t>(a.size_bytes())) == 0;
}

// A sender that dies after `sends_before_death` chunk sends: its pair group
// is aborted (as the death of its process closes its sockets) and the send fails.
class DyingSender : public comm::Communicator {
 public:
  DyingSender(comm::Communicator* inner, int sends_before_death)
      : inner_(inner), left_(sends_before_death) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(std::span<float> d, comm::ReduceOp op) override {
    return inner_->AllReduce(d, op);
  }
  std::unique_ptr<comm::Work> AllReduceAsync(std::span<float> d, comm::ReduceOp op) override {
    return inner_->AllReduceAsync(d, op);
  }
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override {
    return inner_->ReduceScatter(in, out);
  }
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    return inner_->AllGather(in, out);
  }
  absl::Status Broadcast(std::span<float> d, int root) override {
    return inner_->Broadcast(d, root);
  }
  absl::Status Send(std::span<const float> d, int peer, uint32_t tag) override {
    return inner_->Send(d, peer, tag);
  }
  absl::Status Recv(std::span<float> d, int peer, uint32_t tag) override {
    return inner_->Recv(d, peer, tag);
  }
  std::unique_ptr<comm::Work> SendAsync(std::span<const float> d, int peer, uint32_t tag) override {
    if (left_-- == 0) inner_->Abort("the sender's process died");
    return inner_->SendAsync(d, peer, tag);
  }
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& sc,
                        std::span<float> out, const std::vector<int64_t>& rc) override {
    return inner_->AllToAll(in, sc, out, rc);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  comm::CommStats Stats() const override { return inner_->Stats(); }

 private:
  comm::Communicator* inner_;
  int left_;
};

SnapshotTransferOptions SmallChunks() {
  SnapshotTransferOptions o;
  o.chunk_bytes = 4096;
  return o;
}

// Three pieces; `shared` are the same for every rank (a replicated weight),
// the others this rank's own range of a sharded moment.
std::shared_ptr<Snapshot> ThreePieces(int64_t step, int dp_rank, float base) {
  SnapshotManifest m;
  m.owner = {dp_rank, "dp2 tp1 pp1 cp1 ep1 zero1 v1 -",
             absl::StrCat("dp ", dp_rank, "/2 tp 0/1 pp 0/1 cp 0/1 ep 0/1")};
  m.step = step;
  m.pieces.push_back({"model.embed_tokens.weight", 0, {3000}, {3000}, -1, 0, 0, 3000, 0});
  m.pieces.push_back({"optimizer.exp_avg.model.embed_tokens.weight", 0, {3000}, {3000}, -1, 0,
                      dp_rank * 1500, 1500, 0});
  m.pieces.push_back({"model.norm.weight", 0, {64}, {64}, -1, 0, 0, 64, 0});
  LayOutSnapshotPieces(&m);
  auto s = std::make_shared<Snapshot>();
  s->Reset(m);
  float* d = s->data();
  for (int64_t i = 0; i < 3000; ++i) d[i] = static_cast<float>(step) + 0.5f * static_cast<float>(i);
  for (int64_t i = 0; i < 1500; ++i) d[3000 + i] = base + static_cast<float>(i);
  for (int64_t i = 0; i < 64; ++i) d[4500 + i] = static_cast<float>(step) - static_cast<float>(i);
  return s;
}

std::vector<uint64_t> KeysOf(const Snapshot& s) {
  std::vector<uint64_t> keys;
  for (const SnapshotPiece& p : s.manifest().pieces) keys.push_back(SnapshotPieceKey(p));
  return keys;
}

TEST(SnapshotTransferTest, ABuddyCopyLeavesOutWhatTheBuddyHoldsAndItsOwnSnapshotFillsItIn) {
  comm::InProcessStore store;
  auto pair = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "pair");
  const std::shared_ptr<Snapshot> ward = ThreePieces(5, 0, 100.0f);
  const std::shared_ptr<Snapshot> buddy_own = ThreePieces(5, 1, 900.0f);
  SnapshotTransferOptions options = SmallChunks();
  options.leave_out_held = true;
  Snapshot copy;
  SnapshotTransferStats sent_stats, got_stats;
  absl::Status sent;
  std::thread sender([&] { sent = SendSnapshot(*pair[0], 5, ward.get(), options, &sent_stats); });
  absl::Status got = ReceiveSnapshot(*pair[1], 5, &copy, options, &got_stats, KeysOf(*buddy_own));
  sender.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(got.ok()) << got;
  // The weight and the norm are the buddy's too: only the moment's range travelled.
  EXPECT_EQ(copy.borrowed(), (std::vector<size_t>{0, 2}));
  const int64_t floats_offset = ward->size_bytes() - 4564 * 4;
  EXPECT_EQ(sent_stats.bytes, floats_offset + 1500 * 4);
  EXPECT_EQ(got_stats.bytes, sent_stats.bytes);
  // A copy with borrowed pieces is not passed on as it is...
  Snapshot relayed;
  std::thread refuser([&] { (void)ReceiveSnapshot(*pair[0], 5, &relayed, SmallChunks()); });
  absl::Status passed = SendSnapshot(*pair[1], 5, &copy, SmallChunks());
  refuser.join();
  EXPECT_TRUE(absl::IsNotFound(passed)) << passed;
  // ...nor filled from another step's snapshot...
  absl::Status wrong = copy.FillBorrowed(*ThreePieces(4, 1, 900.0f));
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong)) << wrong;
  EXPECT_NE(wrong.message().find("step 5"), std::string::npos) << wrong;
  // ...but from the buddy's own of the same step it is the ward's, byte for byte.
  ASSERT_TRUE(copy.FillBorrowed(*buddy_own).ok());
  EXPECT_TRUE(copy.borrowed().empty());
  EXPECT_TRUE(SameBytes(copy, *ward));
}

TEST(SnapshotTransferTest, AHolderLackingABorrowedPieceIsRefusedNamingIt) {
  comm::InProcessStore store;
  auto pair = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "pair");
  const std::shared_ptr<Snapshot> ward = ThreePieces(5, 0, 100.0f);
  SnapshotTransferOptions options = SmallChunks();
  options.leave_out_held = true;
  Snapshot copy;
  // The buddy claims the norm, but the snapshot it later fills from lacks it.
  const std::vector<uint64_t> claimed = {SnapshotPieceKey(ward->manifest().pieces[2])};
  std::thread sender([&] { ASSERT_TRUE(SendSnapshot(*pair[0], 5, ward.get(), options).ok()); });
  ASSERT_TRUE(ReceiveSnapshot(*pair[1], 5, &copy, options, nullptr, claimed).ok());
  sender.join();
  absl::Status s = copy.FillBorrowed(*Filled(5, 10, 1.0f));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s;
}

TEST(SnapshotTransferTest, ACopyArrivesWholeInManyChunks) {
  comm::InProcessStore store;
  auto pair = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "pair");
  const std::shared_ptr<Snapshot> sent = Filled(5, 10000, 0.25f);  // ~40 KB: 10+ chunks
  Snapshot received;
  absl::Status send_status, recv_status;
  SnapshotTransferStats send_stats, recv_stats;
  std::thread sender(
      [&] { send_status = SendSnapshot(*pair[0], 5, sent.get(), SmallChunks(), &send_stats); });
  std::thread receiver(
      [&] { recv_status = ReceiveSnapshot(*pair[1], 5, &received, SmallChunks(), &recv_stats); });
  sender.join();
  receiver.join();
  ASSERT_TRUE(send_status.ok()) << send_status;
  ASSERT_TRUE(recv_status.ok()) << recv_status;
  EXPECT_TRUE(SameBytes(*sent, received));
  EXPECT_EQ(received.step(), 5);
  EXPECT_EQ(send_stats.bytes, sent->size_bytes());
  EXPECT_EQ(recv_stats.bytes, sent->size_bytes());
  EXPECT_GT(pair[0]->Stats()["send"].calls, 10);
}

TEST(SnapshotTransferTest, ASenderWithoutTheStepSaysSo) {
  comm::InProcessStore store;
  auto pair = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "pair");
  const std::shared_ptr<Snapshot> other_step = Filled(4, 100, 0);
  Snapshot received;
  absl::Status send_status, recv_status;
  std::thread sender(
      [&] { send_status = SendSnapshot(*pair[0], 5, other_step.get(), SmallChunks()); });
  std::thread receiver(
      [&] { recv_status = ReceiveSnapshot(*pair[1], 5, &received, SmallChunks()); });
  sender.join();
  receiver.join();
  EXPECT_TRUE(absl::IsNotFound(send_status)) << send_status;
  EXPECT_TRUE(absl::IsNotFound(recv_status)) << recv_status;
  EXPECT_NE(recv_status.message().find("the sender holds no snapshot of step 5"), std::string::npos)
      << recv_status;
  EXPECT_NE(recv_status.message().find("over pair:"), std::string::npos) << recv_status;
  EXPECT_TRUE(received.empty());
}

TEST(SnapshotTransferTest, ATornCopyLeavesThePreviousCompleteCopy) {
  comm::InProcessStore store;
  auto pair = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "pair");
  SnapshotGenerations ward_copies;
  const std::shared_ptr<Snapshot> first = Filled(1, 10000, 1.0f);
  const std::shared_ptr<Snapshot> second = Filled(2, 10000, 2.0f);
  {
    // The buddy's side: its background receive, committed when acknowledged.
    SnapshotCopier copier({nullptr, pair[1].get()}, SmallChunks());
    auto commit = [&](std::shared_ptr<Snapshot> copy) { ward_copies.Commit(std::move(copy)); };
    copier.ReceiveFromWard(1, ward_copies.BeginWrite(), {}, commit);
    ASSERT_TRUE(SendSnapshot(*pair[0], 1, first.get(), SmallChunks()).ok());
    copier.WaitIdle();
    ASSERT_TRUE(copier.last_receive().ok()) << copier.last_receive();
    ASSERT_EQ(ward_copies.Steps(), (std::vector<int64_t>{1}));

    // The ward dies three chunks into its copy of step 2.
    copier.ReceiveFromWard(2, ward_copies.BeginWrite(), {}, commit);
    DyingSender dying(pair[0].get(), 3);
    absl::Status sent = SendSnapshot(dying, 2, second.get(), SmallChunks());
    EXPECT_FALSE(sent.ok());
    copier.WaitIdle();
    const absl::Status torn = copier.last_receive();
    EXPECT_FALSE(torn.ok());
    EXPECT_NE(torn.message().find("snapshot copy of step 2 over pair:"), std::string::npos) << torn;
  }
  EXPECT_EQ(ward_copies.Steps(), (std::vector<int64_t>{1}));
  ASSERT_NE(ward_copies.Find(1), nullptr);
  EXPECT_TRUE(SameBytes(*ward_copies.Find(1), *first));
}

TEST(SnapshotTransferTest, AbortingThePairEndsACopyWaitingForItsPeer) {
  comm::InProcessStore store;
  auto pair = comm::testing::MakeGroup(store, 2, absl::Seconds(60), "pair");
  SnapshotCopier copier({pair[0].get(), nullptr}, SmallChunks());
  copier.SendToBuddy(Filled(3, 100, 0));  // the buddy never receives
  // Posted sends leave the queue at once and wait outside it: give the copy
  // time to be waiting (an abort before that ends it the same way).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  pair[0]->Abort("attempt 1 aborted");
  copier.WaitIdle();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0);  // far below the 60 s timeout
  const SnapshotCopier::SendResult result = copier.last_send();
  EXPECT_EQ(result.step, 3);
  EXPECT_TRUE(absl::IsAborted(result.status)) << result.status;
}

}  // namespace
}  // namespace loom::engine
