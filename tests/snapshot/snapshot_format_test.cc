// The snapshot image (worker/engine/snapshot/snapshot.h) and its two
// generations: the image round-trips through its bytes, a damaged image is
// refused naming the fault, a manifest of another owner or piece is refused
// naming the difference, and a snapshot that is never committed leaves the
// complete generations as they were.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "worker/engine/snapshot/snapshot.h"
#include "worker/engine/snapshot/snapshot_generations.h"

namespace loom::engine {
namespace {

SnapshotManifest TwoPieces(int64_t step) {
  SnapshotManifest m;
  m.owner = {3, "dp2 tp1 pp1 cp1 ep1 zero1 v1 -", "dp 1/2 tp 0/1 pp 0/1 cp 0/1 ep 0/1"};
  m.step = step;
  m.tokens = step * 128;
  m.optimizer_step = step;
  m.pieces.push_back({"model.norm.weight", 0, {8}, {8}, -1, 0, 0, 8, 0});
  m.pieces.push_back({"optimizer.exp_avg.lm_head.weight", 0, {4, 8}, {8, 8}, 0, 4, 5, 20, 0});
  LayOutSnapshotPieces(&m);
  return m;
}

std::unique_ptr<Snapshot> Filled(int64_t step, float base) {
  auto s = std::make_unique<Snapshot>();
  s->Reset(TwoPieces(step));
  for (int64_t i = 0; i < s->manifest().data_floats(); ++i)
    s->data()[i] = base + static_cast<float>(i);
  return s;
}

// A copy of `from` through its bytes, as a receiver gets it.
absl::Status CopyThroughBytes(const Snapshot& from, Snapshot* to) {
  std::span<std::byte> buffer = to->PrepareReceive(from.size_bytes());
  std::memcpy(buffer.data(), from.bytes().data(), static_cast<size_t>(from.size_bytes()));
  return to->Adopt();
}

TEST(SnapshotImageTest, RoundTripsThroughItsBytes) {
  std::unique_ptr<Snapshot> s = Filled(7, 0.5f);
  EXPECT_EQ(s->manifest().pieces[1].offset, 8);
  EXPECT_EQ(s->manifest().data_floats(), 28);
  EXPECT_EQ(s->size_bytes() % 4, 0);
  Snapshot copy;
  ASSERT_TRUE(CopyThroughBytes(*s, &copy).ok());
  EXPECT_EQ(copy.step(), 7);
  EXPECT_EQ(copy.manifest().tokens, 7 * 128);
  EXPECT_EQ(copy.manifest().owner, s->manifest().owner);
  EXPECT_EQ(copy.manifest().pieces, s->manifest().pieces);
  EXPECT_EQ(std::memcmp(copy.data(), s->data(), 28 * sizeof(float)), 0);
  EXPECT_TRUE(CheckSnapshotFits(s->manifest(), copy.manifest()).ok());
}

TEST(SnapshotImageTest, ResetReusesTheBufferAndRewritesTheManifest) {
  std::unique_ptr<Snapshot> s = Filled(1, 0);
  const std::byte* before = s->bytes().data();
  s->Reset(TwoPieces(2));
  EXPECT_EQ(s->bytes().data(), before);
  EXPECT_EQ(s->step(), 2);
}

TEST(SnapshotImageTest, ADamagedImageIsRefusedNamingTheFault) {
  std::unique_ptr<Snapshot> s = Filled(1, 0);
  Snapshot copy;
  // Too short for its header.
  copy.PrepareReceive(8);
  absl::Status st = copy.Adopt();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("shorter than its header"), std::string::npos) << st;
  EXPECT_TRUE(copy.empty());
  // Bad magic.
  std::span<std::byte> b = copy.PrepareReceive(s->size_bytes());
  std::memcpy(b.data(), s->bytes().data(), b.size());
  b[0] = std::byte{'X'};
  st = copy.Adopt();
  EXPECT_NE(st.message().find("bad magic"), std::string::npos) << st;
  // Cut short: the floats do not fit.
  b = copy.PrepareReceive(s->size_bytes() - 8);
  std::memcpy(b.data(), s->bytes().data(), b.size());
  st = copy.Adopt();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("does not fit"), std::string::npos) << st;
  // A manifest that is not JSON.
  b = copy.PrepareReceive(s->size_bytes());
  std::memcpy(b.data(), s->bytes().data(), b.size());
  b[41] = std::byte{'#'};
  st = copy.Adopt();
  EXPECT_NE(st.message().find("manifest"), std::string::npos) << st;
  EXPECT_TRUE(copy.empty());
}

TEST(SnapshotFitTest, NamesTheFirstDifference) {
  const SnapshotManifest want = TwoPieces(4);
  SnapshotManifest got = want;
  got.owner.rank = 1;
  absl::Status s = CheckSnapshotFits(want, got);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("it is rank 1's state, not rank 3's"), std::string::npos) << s;
  got = want;
  got.owner.rank = -1;  // unknown: not checked
  EXPECT_TRUE(CheckSnapshotFits(want, got).ok());
  got.owner.layout = "dp1 tp2 pp1 cp1 ep1 zero0 v1 -";
  s = CheckSnapshotFits(want, got);
  EXPECT_NE(s.message().find("its layout differs"), std::string::npos) << s;
  EXPECT_NE(s.message().find("dp1 tp2"), std::string::npos) << s;
  got = want;
  got.owner.place = "dp 0/2 tp 0/1 pp 0/1 cp 0/1 ep 0/1";
  s = CheckSnapshotFits(want, got);
  EXPECT_NE(s.message().find("place in the mesh differs"), std::string::npos) << s;
  got = want;
  got.pieces[1].begin = 0;
  s = CheckSnapshotFits(want, got);
  EXPECT_NE(s.message().find("piece 1 is optimizer.exp_avg.lm_head.weight"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("elements [0, 20)"), std::string::npos) << s;
  got = want;
  got.pieces.pop_back();
  s = CheckSnapshotFits(want, got);
  EXPECT_NE(s.message().find("it holds 1 pieces, this rank 2"), std::string::npos) << s;
}

TEST(SnapshotGenerationsTest, KeepsTwoCompleteAndAFailedWriteLosesNone) {
  SnapshotGenerations gens;
  EXPECT_TRUE(gens.Steps().empty());
  for (int64_t step : {1, 2}) {
    std::shared_ptr<Snapshot> s = gens.BeginWrite();
    s->Reset(TwoPieces(step));
    gens.Commit(s);
  }
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{1, 2}));
  // Writing step 3 reuses the oldest buffer: step 1 is gone, step 2 stays.
  std::shared_ptr<Snapshot> third = gens.BeginWrite();
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{2}));
  EXPECT_NE(gens.Find(2), nullptr);
  // The write fails (never committed): step 2 is still complete.
  third.reset();
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{2}));
  std::shared_ptr<Snapshot> fourth = gens.BeginWrite();  // one complete: a new buffer
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{2}));
  fourth->Reset(TwoPieces(4));
  gens.Commit(fourth);
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{2, 4}));
  // An empty (torn) buffer is never committed.
  std::shared_ptr<Snapshot> torn = gens.BeginWrite();
  torn->PrepareReceive(100);
  gens.Commit(torn);
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{4}));
  EXPECT_GT(gens.newest_bytes(), 0);
  gens.DropAfter(3);
  EXPECT_TRUE(gens.Steps().empty());
}

TEST(SnapshotGenerationsTest, ABufferStillReadIsNotOverwritten) {
  SnapshotGenerations gens;
  for (int64_t step : {1, 2}) {
    std::shared_ptr<Snapshot> s = gens.BeginWrite();
    s->Reset(TwoPieces(step));
    gens.Commit(s);
  }
  std::shared_ptr<const Snapshot> reader = gens.Find(1);  // e.g. being sent
  std::shared_ptr<Snapshot> next = gens.BeginWrite();
  EXPECT_NE(next.get(), reader.get());
  EXPECT_EQ(reader->step(), 1);
}

// A rank's own snapshots (common/snapshot_generations.h): three, so the step
// before the one whose copies may still be in flight elsewhere stays.
TEST(SnapshotGenerationsTest, ThreeGenerationsKeepTheStepBeforeTheNewestTwo) {
  SnapshotGenerations gens(3);
  for (int64_t step : {1, 2, 3}) {
    std::shared_ptr<Snapshot> s = gens.BeginWrite();
    s->Reset(TwoPieces(step));
    gens.Commit(s);
  }
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{1, 2, 3}));
  std::shared_ptr<Snapshot> next = gens.BeginWrite();  // step 1's buffer
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{2, 3}));
  next->Reset(TwoPieces(4));
  gens.Commit(next);
  EXPECT_EQ(gens.Steps(), (std::vector<int64_t>{2, 3, 4}));
}

}  // namespace
}  // namespace loom::engine
