// The liveness datagrams: what one seals another reads back; any changed
// byte, another key, a truncated or padded datagram is refused.
#include "common/liveness/beat_datagram.h"

#include "gtest/gtest.h"

namespace loom::liveness {
namespace {

Datagram Beat() {
  Datagram beat;
  beat.kind = Kind::kBeat;
  beat.session = 0x0123456789abcdefULL;
  beat.seq = 42;
  beat.node_id = "node-a";
  return beat;
}

TEST(BeatDatagramTest, ReadsBackWhatWasSealed) {
  const Grant grant = NewGrant();
  ASSERT_EQ(grant.key.size(), kKeyBytes);
  const std::string bytes = Seal(Beat(), grant.key);
  std::optional<Datagram> read = Peek(bytes);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->kind, Kind::kBeat);
  EXPECT_EQ(read->session, 0x0123456789abcdefULL);
  EXPECT_EQ(read->seq, 42);
  EXPECT_EQ(read->node_id, "node-a");
  EXPECT_TRUE(Authentic(bytes, grant.key));
}

TEST(BeatDatagramTest, EveryChangedByteIsRefused) {
  const Grant grant = NewGrant();
  const std::string bytes = Seal(Beat(), grant.key);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string changed = bytes;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    const std::optional<Datagram> read = Peek(changed);
    EXPECT_FALSE(read.has_value() && Authentic(changed, grant.key)) << "byte " << i;
  }
}

TEST(BeatDatagramTest, AnotherKeyTruncationAndPaddingAreRefused) {
  const Grant grant = NewGrant();
  const Grant other = NewGrant();
  EXPECT_NE(grant.key, other.key);
  EXPECT_NE(grant.session, other.session);
  const std::string bytes = Seal(Beat(), grant.key);
  EXPECT_FALSE(Authentic(bytes, other.key));
  EXPECT_FALSE(Authentic(bytes, ""));
  EXPECT_FALSE(Peek(bytes.substr(0, bytes.size() - 1)).has_value());
  EXPECT_FALSE(Peek(bytes + "x").has_value());
  EXPECT_FALSE(Peek("").has_value());
  EXPECT_FALSE(Peek(std::string(kMaxDatagramBytes + 1, 'L')).has_value());
  Datagram unknown = Beat();
  std::string wrong_kind = Seal(unknown, grant.key);
  wrong_kind[4] = 7;
  EXPECT_FALSE(Peek(wrong_kind).has_value());
}

TEST(BeatDatagramTest, ANodeIdTooLongIsNotSealed) {
  Datagram beat = Beat();
  beat.node_id = std::string(256, 'n');
  EXPECT_EQ(Seal(beat, NewGrant().key), "");
  beat.node_id = std::string(255, 'n');
  EXPECT_TRUE(Peek(Seal(beat, NewGrant().key)).has_value());
}

}  // namespace
}  // namespace loom::liveness
