// The board's rules: only the counting session's authentic beats, each with
// a newer sequence number, are heard and acked; and the registry keeps the
// board in step (the node's current session while it is live), so beats keep
// a node from being lost for silence, and only such a node.
#include "coordinator/cluster/liveness_board.h"

#include "coordinator/cluster/node_registry.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using liveness::Datagram;
using liveness::Grant;
using liveness::Kind;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

std::string Beat(const std::string& node, const Grant& grant, int64_t seq) {
  return liveness::Seal(Datagram{Kind::kBeat, grant.session, seq, node}, grant.key);
}

TEST(LivenessBoardTest, HearsTheCountingSessionAndAcksWithItsKey) {
  LivenessBoard board;
  const Grant grant = liveness::NewGrant();
  board.Count("n1", grant);
  EXPECT_EQ(board.HeardAt("n1"), absl::InfinitePast());
  std::optional<std::string> ack = board.Accept(Beat("n1", grant, 3), kT0);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(board.HeardAt("n1"), kT0);
  std::optional<Datagram> read = liveness::Peek(*ack);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->kind, Kind::kAck);
  EXPECT_EQ(read->seq, 3);
  EXPECT_EQ(read->session, grant.session);
  EXPECT_TRUE(liveness::Authentic(*ack, grant.key));
  EXPECT_EQ(board.heard(), 1);
}

TEST(LivenessBoardTest, RefusesReplaysForgeriesOtherSessionsAndUnknownNodes) {
  LivenessBoard board;
  const Grant grant = liveness::NewGrant();
  const Grant other = liveness::NewGrant();
  board.Count("n1", grant);
  ASSERT_TRUE(board.Accept(Beat("n1", grant, 5), kT0).has_value());
  const absl::Time later = kT0 + absl::Seconds(1);
  EXPECT_FALSE(board.Accept(Beat("n1", grant, 5), later).has_value());  // replayed
  EXPECT_FALSE(board.Accept(Beat("n1", grant, 4), later).has_value());  // older
  EXPECT_FALSE(board.Accept(Beat("n1", other, 6), later).has_value());  // another session
  Grant forged = grant;
  forged.key = other.key;
  EXPECT_FALSE(board.Accept(Beat("n1", forged, 7), later).has_value());  // wrong key
  EXPECT_FALSE(board.Accept(Beat("n2", grant, 8), later).has_value());   // unknown node
  EXPECT_FALSE(board.Accept("not a beat", later).has_value());
  const std::string ack_shaped =
      liveness::Seal(Datagram{Kind::kAck, grant.session, 9, "n1"}, grant.key);
  EXPECT_FALSE(board.Accept(ack_shaped, later).has_value());  // only beats are heard
  EXPECT_EQ(board.HeardAt("n1"), kT0);
  EXPECT_EQ(board.refused(), 7);
  EXPECT_TRUE(board.Accept(Beat("n1", grant, 10), later).has_value());
}

TEST(LivenessBoardTest, AStoppedSessionIsNotHeardAndKeepsItsNewestSequence) {
  LivenessBoard board;
  const Grant grant = liveness::NewGrant();
  board.Count("n1", grant);
  ASSERT_TRUE(board.Accept(Beat("n1", grant, 5), kT0).has_value());
  board.Stop("n1");
  EXPECT_EQ(board.HeardAt("n1"), absl::InfinitePast());
  EXPECT_EQ(board.LastBeat("n1"), kT0);  // still told in the loss's log line
  EXPECT_FALSE(board.Accept(Beat("n1", grant, 6), kT0).has_value());
  // Counting again (a revival): beats captured before are still stale.
  board.Count("n1", grant);
  EXPECT_FALSE(board.Accept(Beat("n1", grant, 5), kT0).has_value());
  EXPECT_TRUE(board.Accept(Beat("n1", grant, 7), kT0).has_value());
  // A new grant (a new session) starts over.
  const Grant next = liveness::NewGrant();
  board.Count("n1", next);
  EXPECT_FALSE(board.Accept(Beat("n1", grant, 8), kT0).has_value());
  EXPECT_TRUE(board.Accept(Beat("n1", next, 1), kT0).has_value());
}

class GrantedChannel final : public NodeChannel {
 public:
  void Send(const loom::v1::CoordinatorMessage&) override {}
  const Grant* liveness_grant() const override { return &grant; }
  Grant grant = liveness::NewGrant();
};

loom::v1::RegisterNode Node(const std::string& id) {
  loom::v1::RegisterNode r;
  r.set_node_id(id);
  loom::v1::Device* d = r.add_devices();
  d->set_kind("cpu");
  d->set_count(2);
  return r;
}

TEST(LivenessBoardTest, BeatsKeepALiveNodeFromBeingLostForSilence) {
  LivenessBoard board;
  NodeRegistry nodes;
  nodes.SetLivenessBoard(&board);
  const absl::Duration timeout = absl::Seconds(5);
  auto channel = std::make_shared<GrantedChannel>();
  nodes.Register(Node("n1"), channel, kT0);
  // No session message for 20 s, but a beat every second.
  for (int s = 1; s <= 20; ++s) {
    ASSERT_TRUE(board.Accept(Beat("n1", channel->grant, s), kT0 + absl::Seconds(s)).has_value());
    EXPECT_TRUE(nodes.ExpireSilent(kT0 + absl::Seconds(s) + absl::Milliseconds(500), timeout)
                    .empty());
  }
  // The beats stop: lost a timeout after the last one, and from then on no
  // beat is heard (only the session brings it back).
  EXPECT_TRUE(nodes.ExpireSilent(kT0 + absl::Seconds(25), timeout).empty());
  EXPECT_EQ(nodes.ExpireSilent(kT0 + absl::Seconds(26), timeout), std::vector<std::string>{"n1"});
  EXPECT_FALSE(board.Accept(Beat("n1", channel->grant, 21), kT0 + absl::Seconds(26)).has_value());
  loom::v1::Heartbeat heartbeat;
  EXPECT_EQ(nodes.Heartbeat("n1", channel.get(), heartbeat, kT0 + absl::Seconds(27)),
            NodeRegistry::HeartbeatResult::kRevived);
  EXPECT_TRUE(board.Accept(Beat("n1", channel->grant, 22), kT0 + absl::Seconds(28)).has_value());
}

TEST(LivenessBoardTest, OnlyTheCurrentSessionOfALiveNodeBeats) {
  LivenessBoard board;
  NodeRegistry nodes;
  nodes.SetLivenessBoard(&board);
  auto first = std::make_shared<GrantedChannel>();
  nodes.Register(Node("n1"), first, kT0);
  ASSERT_TRUE(board.Accept(Beat("n1", first->grant, 1), kT0).has_value());
  // The session ends: its beats no longer count, so they cannot keep the
  // node (or its agent's lease) alive without a session.
  ASSERT_TRUE(nodes.SessionClosed("n1", first.get()));
  EXPECT_FALSE(board.Accept(Beat("n1", first->grant, 2), kT0).has_value());
  EXPECT_EQ(nodes.ExpireSilent(kT0 + absl::Seconds(6), absl::Seconds(5)),
            std::vector<std::string>{"n1"});
  // A new session replaces it: only the new grant is heard.
  auto second = std::make_shared<GrantedChannel>();
  nodes.Register(Node("n1"), second, kT0 + absl::Seconds(7));
  EXPECT_FALSE(board.Accept(Beat("n1", first->grant, 3), kT0 + absl::Seconds(7)).has_value());
  EXPECT_TRUE(board.Accept(Beat("n1", second->grant, 1), kT0 + absl::Seconds(7)).has_value());
  // And a live node beating on its session refuses a takeover, however long
  // its session has been quiet.
  auto thief = std::make_shared<GrantedChannel>();
  ASSERT_TRUE(board.Accept(Beat("n1", second->grant, 2), kT0 + absl::Seconds(20)).has_value());
  EXPECT_FALSE(nodes.RegisterIfFree(Node("n1"), thief, kT0 + absl::Seconds(20.5),
                                    absl::Seconds(2)));
}

}  // namespace
}  // namespace loom::coordinator
