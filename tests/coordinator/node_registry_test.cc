// NodeRegistry's one identity rule: a second session cannot take a node id
// whose session is alive; a silent leftover is replaced. And liveness: a node
// is lost after the timeout plus how late heartbeats are being read, so the
// coordinator's own backlog loses no node while a silent one is still lost;
// a session that ends does not lose its node before that timeout either (a
// transient break costs nothing), though nothing is sent to it meanwhile.
#include "coordinator/cluster/node_registry.h"

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

class NullChannel final : public NodeChannel {
 public:
  void Send(const loom::v1::CoordinatorMessage&) override {}
};

loom::v1::RegisterNode Node(const std::string& id) {
  loom::v1::RegisterNode r;
  r.set_node_id(id);
  loom::v1::Device* d = r.add_devices();
  d->set_kind("cpu");
  d->set_count(2);
  return r;
}

TEST(NodeRegistryTest, ASecondSessionCannotReplaceALiveNode) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Duration alive = absl::Seconds(2);
  auto first = std::make_shared<NullChannel>();
  auto second = std::make_shared<NullChannel>();
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), first, t0, alive));
  EXPECT_FALSE(nodes.RegisterIfFree(Node("n1"), second, t0 + absl::Seconds(1), alive));
  // The same session may register again (an agent re-sends its registration).
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), first, t0 + absl::Seconds(1), alive));
  // After the first session closed, or went silent, the id is free.
  EXPECT_TRUE(nodes.SessionClosed("n1", first.get()));
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), second, t0 + absl::Seconds(1), alive));
  auto third = std::make_shared<NullChannel>();
  EXPECT_FALSE(nodes.RegisterIfFree(Node("n1"), third, t0 + absl::Seconds(2), alive));
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), third, t0 + absl::Seconds(10), alive));
  EXPECT_FALSE(nodes.SessionClosed("n1", second.get()));  // no longer the node's session
}

loom::v1::Heartbeat Beat(int64_t sent_us) {
  loom::v1::Heartbeat beat;
  beat.set_sent_monotonic_us(sent_us);
  return beat;
}

TEST(NodeRegistryTest, KeepsTheLabelsOfTheLatestRegistration) {
  NodeRegistry nodes;
  auto channel = std::make_shared<NullChannel>();
  loom::v1::RegisterNode r = Node("n1");
  (*r.mutable_labels())["rack"] = "r1";
  (*r.mutable_labels())["nvlink_domain"] = "d0";
  nodes.Register(r, channel, absl::FromUnixSeconds(1000));
  std::optional<NodeInfo> info = nodes.Get("n1");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->labels, (std::map<std::string, std::string>{{"rack", "r1"}, {"nvlink_domain", "d0"}}));
  // An agent restarted without --labels drops them.
  nodes.Register(Node("n1"), channel, absl::FromUnixSeconds(1001));
  EXPECT_TRUE(nodes.Get("n1")->labels.empty());
}

TEST(HeartbeatLagTest, ASessionsLagIsMeasuredFromItsFastestHeartbeat) {
  SessionLag session;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(session.Observe(0, t0).has_value());  // no send time: no opinion
  // The agent's clock has another origin; only differences count.
  EXPECT_EQ(*session.Observe(5'000'000, t0), absl::ZeroDuration());
  EXPECT_EQ(*session.Observe(6'000'000, t0 + absl::Seconds(3)), absl::Seconds(2));
  // A faster one lowers the baseline for what follows.
  EXPECT_EQ(*session.Observe(7'000'000, t0 + absl::Milliseconds(1500)), absl::ZeroDuration());
  EXPECT_EQ(*session.Observe(8'000'000, t0 + absl::Milliseconds(3000)), absl::Milliseconds(500));
}

TEST(HeartbeatLagTest, TheBacklogIsTheNinetiethPercentileOfTheWindowAndBounded) {
  HeartbeatLag lag(absl::Seconds(2), absl::Seconds(60));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(lag.Backlog(t0), absl::ZeroDuration());
  // Heartbeats are read 3-5 s late; one node's sender is a minute behind.
  const int lags_s[] = {4, 3, 4, 90, 4, 5, 4, 4, 5, 4};
  for (int i = 0; i < 10; ++i) lag.Observe(absl::Seconds(lags_s[i]), t0 + absl::Milliseconds(100 * i));
  EXPECT_EQ(lag.Backlog(t0 + absl::Seconds(1)), absl::Seconds(5));  // the outlier left out
  // Older than the window: forgotten.
  lag.Observe(absl::ZeroDuration(), t0 + absl::Seconds(4));
  EXPECT_EQ(lag.Backlog(t0 + absl::Seconds(4)), absl::ZeroDuration());
  EXPECT_EQ(lag.Backlog(t0 + absl::Seconds(7)), absl::ZeroDuration());
  // Never more credit than the bound.
  lag.Observe(absl::Minutes(5), t0 + absl::Seconds(8));
  EXPECT_EQ(lag.Backlog(t0 + absl::Seconds(8)), absl::Seconds(60));
}

TEST(NodeRegistryTest, ABacklogOfHeartbeatsExtendsTheDeadlineButASilentNodeIsStillLost) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Duration timeout = absl::Seconds(5);
  std::vector<std::shared_ptr<NullChannel>> channels;
  for (const char* id : {"a", "b", "c", "quiet"}) {
    channels.push_back(std::make_shared<NullChannel>());
    nodes.Register(Node(id), channels.back(), t0);
    // A heartbeat read at once: each session's baseline.
    EXPECT_EQ(nodes.Heartbeat(id, channels.back().get(), Beat(1'000'000), t0),
              NodeRegistry::HeartbeatResult::kAlive);
  }
  // The coordinator falls behind: a, b and c keep sending once a second, but
  // their heartbeats are read 6 s after they were sent; "quiet" sends nothing.
  // Heartbeats sent at t0+1 s are read at t0+7 s, and so on.
  for (int sent = 1; sent <= 4; ++sent) {
    const absl::Time read = t0 + absl::Seconds(sent + 6);
    for (int i = 0; i < 3; ++i) {
      nodes.Heartbeat(std::string(1, static_cast<char>('a' + i)), channels[i].get(),
                      Beat(1'000'000 + sent * 1'000'000), read);
    }
    // Without the backlog a, b and c would look silent for 6 s at t0+6 s.
    if (sent == 1) {
      EXPECT_EQ(nodes.HeartbeatBacklog(read), absl::Seconds(6));
    }
  }
  // At t0+10 s: a, b and c were read 0 s ago; quiet was last read at t0, 10 s
  // ago, beyond 5 s + the 6 s backlog? Not yet.
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(10), timeout).empty());
  // Beyond timeout + backlog it is lost, and only it.
  nodes.Heartbeat("a", channels[0].get(), Beat(6'000'000), t0 + absl::Seconds(11));
  nodes.Heartbeat("b", channels[1].get(), Beat(6'000'000), t0 + absl::Seconds(11));
  nodes.Heartbeat("c", channels[2].get(), Beat(6'000'000), t0 + absl::Seconds(11));
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(11100), timeout),
            std::vector<std::string>{"quiet"});
  // Once heartbeats are read on time again the plain timeout applies.
  for (int i = 0; i < 3; ++i) {
    nodes.Heartbeat(std::string(1, static_cast<char>('a' + i)), channels[i].get(),
                    Beat(21'000'000), t0 + absl::Seconds(20));
  }
  EXPECT_EQ(nodes.HeartbeatBacklog(t0 + absl::Seconds(20)), absl::ZeroDuration());
  const std::vector<std::string> lost = nodes.ExpireSilent(t0 + absl::Milliseconds(25100), timeout);
  EXPECT_EQ(lost, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(NodeRegistryTest, ANodeWhoseOwnHeartbeatsLagGetsItsOwnLagMore) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto slow = std::make_shared<NullChannel>();
  nodes.Register(Node("slow"), slow, t0);
  nodes.Heartbeat("slow", slow.get(), Beat(1'000'000), t0);
  // Its heartbeat sent at t0+1 s is read at t0+9 s: 8 s late (its agent's
  // machine, or its link, is behind), while no other node's lags.
  nodes.Heartbeat("slow", slow.get(), Beat(2'000'000), t0 + absl::Seconds(9));
  EXPECT_EQ(nodes.HeartbeatBacklog(t0 + absl::Seconds(12)), absl::ZeroDuration());
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(20), absl::Seconds(5)).empty());
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(22100), absl::Seconds(5)),
            std::vector<std::string>{"slow"});
}

TEST(NodeRegistryTest, WithoutSendTimesTheTimeoutIsPlain) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto channel = std::make_shared<NullChannel>();
  nodes.Register(Node("old-agent"), channel, t0);
  nodes.Heartbeat("old-agent", channel.get(), loom::v1::Heartbeat(), t0 + absl::Seconds(1));
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(6), absl::Seconds(5)).empty());
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(6100), absl::Seconds(5)),
            std::vector<std::string>{"old-agent"});
}

class CountingChannel final : public NodeChannel {
 public:
  void Send(const loom::v1::CoordinatorMessage&) override { ++sent; }
  int sent = 0;
};

TEST(NodeRegistryTest, ANodeWhoseSessionEndedIsLostOnlyAfterTheTimeout) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto session = std::make_shared<CountingChannel>();
  nodes.Register(Node("n1"), session, t0);
  nodes.Heartbeat("n1", session.get(), loom::v1::Heartbeat(), t0 + absl::Seconds(1));
  EXPECT_TRUE(nodes.SessionClosed("n1", session.get()));
  std::optional<NodeInfo> info = nodes.Get("n1");
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->live);
  EXPECT_FALSE(info->connected);
  EXPECT_EQ(nodes.Counts().live, 1);
  // Nothing reaches it meanwhile, and its id is free for its agent's next session.
  EXPECT_FALSE(nodes.Send("n1", loom::v1::CoordinatorMessage()));
  EXPECT_EQ(session->sent, 0);
  // Lost once silent for the timeout from its last heartbeat.
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(6), absl::Seconds(5)).empty());
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(6100), absl::Seconds(5)),
            std::vector<std::string>{"n1"});
  EXPECT_FALSE(nodes.Get("n1")->live);

  // A session that comes back in time keeps the node live all along.
  auto first = std::make_shared<CountingChannel>();
  auto second = std::make_shared<CountingChannel>();
  nodes.Register(Node("n2"), first, t0);
  EXPECT_TRUE(nodes.SessionClosed("n2", first.get()));
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n2"), second, t0 + absl::Seconds(2), absl::Seconds(2)));
  EXPECT_TRUE(nodes.Get("n2")->connected);
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(6), absl::Seconds(5)).empty());
  EXPECT_TRUE(nodes.Send("n2", loom::v1::CoordinatorMessage()));
  EXPECT_EQ(second->sent, 1);
}

// A message the coordinator is still handling (its session reads nothing
// else meanwhile) is the coordinator's delay, not the node's silence: the
// node's clock restarts when the session listens again. Any message proves
// the agent alive, heartbeat or not; a stale session's messages prove nothing.
TEST(NodeRegistryTest, SilenceCountsOnlyWhileTheCoordinatorListens) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Duration timeout = absl::Seconds(3);
  auto session = std::make_shared<NullChannel>();
  nodes.Register(Node("n1"), session, t0);
  nodes.MessageRead("n1", session.get(), t0 + absl::Seconds(1));
  // Handled for 10 s (the job table was busy): never lost meanwhile.
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(10), timeout).empty());
  nodes.MessageHandled("n1", session.get(), t0 + absl::Seconds(11));
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(14), timeout).empty());
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(14100), timeout),
            std::vector<std::string>{"n1"});

  // A progress batch is as good as a heartbeat.
  nodes.Register(Node("n2"), session, t0);
  nodes.MessageRead("n2", session.get(), t0 + absl::Seconds(2));
  nodes.MessageHandled("n2", session.get(), t0 + absl::Seconds(2));
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(5), timeout).empty());
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(5100), timeout),
            std::vector<std::string>{"n2"});

  // A handler stuck for over a minute no longer vouches for the node.
  nodes.Register(Node("n3"), session, t0);
  nodes.MessageRead("n3", session.get(), t0);
  EXPECT_TRUE(nodes.ExpireSilent(t0 + absl::Seconds(60), timeout).empty());
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Seconds(61), timeout),
            std::vector<std::string>{"n3"});

  // Another session's messages say nothing about the current one.
  auto stale = std::make_shared<NullChannel>();
  nodes.Register(Node("n4"), session, t0);
  nodes.MessageRead("n4", stale.get(), t0 + absl::Seconds(2));
  EXPECT_EQ(nodes.ExpireSilent(t0 + absl::Milliseconds(3100), timeout),
            std::vector<std::string>{"n4"});
}

}  // namespace
}  // namespace loom::coordinator
