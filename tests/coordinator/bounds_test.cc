// Bounded state in the coordinator's pieces: watcher queues coalesce
// progress, cordons can be lifted and expire, a heartbeat on a live session
// revives a node lost for silence, registrations are checked, the RPC method
// label is a fixed set and an ended job's metric series go away.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster/node_limits.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/service/indexed_job_series.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/rpc_metrics_interceptor.h"
#include "coordinator/service/watch_queue.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

loom::v1::WatchJobResponse Progress(int64_t step) {
  loom::v1::WatchJobResponse update;
  update.mutable_progress()->set_step(step);
  update.mutable_job()->mutable_last_progress()->set_step(step);
  return update;
}

loom::v1::WatchJobResponse Event(const std::string& message) {
  loom::v1::WatchJobResponse update;
  update.mutable_event()->set_message(message);
  return update;
}

TEST(WatchQueue, AReaderThatKeepsUpLosesNothing) {
  WatchQueue queue(256, 64);
  for (int step = 1; step <= 64; ++step) ASSERT_TRUE(queue.Push(Progress(step)));
  for (int step = 1; step <= 64; ++step) EXPECT_EQ(queue.Pop()->progress().step(), step);
}

TEST(WatchQueue, ProgressThatNoOneReadsCoalescesIntoTheNewest) {
  WatchQueue queue(256, 64);
  for (int step = 1; step <= 100000; ++step) ASSERT_TRUE(queue.Push(Progress(step)));
  ASSERT_EQ(queue.size(), 64u);
  for (int step = 1; step <= 63; ++step) EXPECT_EQ(queue.Pop()->progress().step(), step);
  EXPECT_EQ(queue.Pop()->progress().step(), 100000);
}

TEST(WatchQueue, EventsAreKeptInOrderBetweenCoalescedProgress) {
  WatchQueue queue(256, 0);
  queue.Push(Progress(1));
  queue.Push(Progress(2));
  queue.Push(Event("restarting"));
  queue.Push(Progress(3));
  queue.Push(Progress(4));
  ASSERT_EQ(queue.size(), 3u);
  EXPECT_EQ(queue.Pop()->progress().step(), 2);
  EXPECT_EQ(queue.Pop()->event().message(), "restarting");
  EXPECT_EQ(queue.Pop()->progress().step(), 4);
  EXPECT_TRUE(queue.empty());
}

TEST(WatchQueue, TheSnapshotWithItsBacklogIsNeverReplaced) {
  WatchQueue queue(256, 0);
  loom::v1::WatchJobResponse snapshot = Progress(7);
  snapshot.add_backlog()->set_step(7);
  queue.Push(snapshot);
  queue.Push(Progress(8));
  ASSERT_EQ(queue.size(), 2u);
  EXPECT_EQ(queue.Pop()->backlog_size(), 1);
}

TEST(WatchQueue, TooManyEventsRefuseInsteadOfGrowing) {
  WatchQueue queue(4, 0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(queue.Push(Event("e")));
  EXPECT_FALSE(queue.Push(Event("one too many")));
  EXPECT_EQ(queue.size(), 4u);
}

class NullChannel final : public NodeChannel {
 public:
  void Send(const loom::v1::CoordinatorMessage&) override { ++sent; }
  int sent = 0;
};

loom::v1::RegisterNode Registration(const std::string& id, int devices) {
  loom::v1::RegisterNode r;
  r.set_node_id(id);
  r.set_hostname("host");
  r.set_address("127.0.0.1");
  loom::v1::Device* d = r.add_devices();
  d->set_kind("cpu");
  d->set_count(devices);
  return r;
}

TEST(NodeRegistry, CordonsCanBeLiftedAndExpire) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  nodes.Register(Registration("node-a", 2), std::make_shared<NullChannel>(), t0);
  nodes.Register(Registration("node-b", 2), std::make_shared<NullChannel>(), t0);
  EXPECT_TRUE(nodes.Cordon("node-a", "failed job-1 2 times", t0));
  EXPECT_TRUE(nodes.Cordon("node-b", "failed job-2 2 times", t0 + absl::Minutes(30)));

  EXPECT_TRUE(nodes.ExpireCordons(t0 + absl::Minutes(59), absl::Hours(1)).empty());
  EXPECT_THAT(nodes.ExpireCordons(t0 + absl::Hours(1), absl::Hours(1)),
              ::testing::ElementsAre("node-a"));
  EXPECT_FALSE(nodes.Get("node-a")->cordoned);
  EXPECT_TRUE(nodes.Get("node-b")->cordoned);

  ASSERT_TRUE(nodes.Uncordon("node-b").ok());
  EXPECT_FALSE(nodes.Get("node-b")->cordoned);
  EXPECT_EQ(nodes.Uncordon("node-b").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(nodes.Uncordon("node-z").code(), absl::StatusCode::kNotFound);
}

TEST(NodeRegistry, AHeartbeatOnTheLiveSessionRevivesANodeLostForSilence) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto session = std::make_shared<NullChannel>();
  nodes.Register(Registration("node-a", 2), session, t0);
  EXPECT_THAT(nodes.ExpireSilent(t0 + absl::Seconds(6), absl::Seconds(5)),
              ::testing::ElementsAre("node-a"));
  EXPECT_FALSE(nodes.Get("node-a")->live);
  EXPECT_FALSE(nodes.Send("node-a", {}));

  // A heartbeat from another session does not revive it; the caller is told
  // the node's own session is gone.
  NullChannel stranger;
  EXPECT_EQ(nodes.Heartbeat("node-a", &stranger, {}, t0 + absl::Seconds(7)),
            NodeRegistry::HeartbeatResult::kOrphaned);
  EXPECT_FALSE(nodes.Get("node-a")->live);

  EXPECT_EQ(nodes.Heartbeat("node-a", session.get(), {}, t0 + absl::Seconds(7)),
            NodeRegistry::HeartbeatResult::kRevived);
  EXPECT_TRUE(nodes.Get("node-a")->live);
  EXPECT_TRUE(nodes.Send("node-a", {}));
  EXPECT_EQ(session->sent, 1);
  // Already live: not revived twice; another session is now stale.
  EXPECT_EQ(nodes.Heartbeat("node-a", session.get(), {}, t0 + absl::Seconds(8)),
            NodeRegistry::HeartbeatResult::kAlive);
  EXPECT_EQ(nodes.Heartbeat("node-a", &stranger, {}, t0 + absl::Seconds(8)),
            NodeRegistry::HeartbeatResult::kStale);
}

TEST(NodeRegistry, ASessionThatWasTakenOverAndLeftIsReportedOrphaned) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto real = std::make_shared<NullChannel>();
  auto impostor = std::make_shared<NullChannel>();
  nodes.Register(Registration("node-a", 2), real, t0);
  nodes.Register(Registration("node-a", 2), impostor, t0 + absl::Seconds(1));
  EXPECT_EQ(nodes.Heartbeat("node-a", real.get(), {}, t0 + absl::Seconds(2)),
            NodeRegistry::HeartbeatResult::kStale);
  EXPECT_TRUE(nodes.SessionClosed("node-a", impostor.get()));
  EXPECT_EQ(nodes.Heartbeat("node-a", real.get(), {}, t0 + absl::Seconds(3)),
            NodeRegistry::HeartbeatResult::kOrphaned);
}

TEST(NodeLimits, NodeIdsAreShortPrintableNames) {
  EXPECT_TRUE(ValidNodeId("node-a"));
  EXPECT_TRUE(ValidNodeId("gpu-07.rack3"));
  EXPECT_TRUE(ValidNodeId("MyHost-1a2b3c4d"));
  EXPECT_FALSE(ValidNodeId(""));
  EXPECT_FALSE(ValidNodeId("node-a\njob job-000001: FAILED"));
  EXPECT_FALSE(ValidNodeId("-leading-dash"));
  EXPECT_FALSE(ValidNodeId("has space"));
  EXPECT_FALSE(ValidNodeId("../etc"));
  EXPECT_FALSE(ValidNodeId(std::string(64, 'a')));
}

TEST(NodeLimits, RegistrationsAreRefusedNamingTheField) {
  EXPECT_TRUE(CheckRegistration(Registration("node-a", 8)).ok());
  const absl::Status empty = CheckRegistration(Registration("", 8));
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.message()), HasSubstr("register.node_id"));
  const absl::Status many = CheckRegistration(Registration("node-a", 20'000'000));
  EXPECT_THAT(std::string(many.message()), HasSubstr("register.devices claims 20000000 devices"));
  EXPECT_FALSE(CheckRegistration(Registration("node-a", -1)).ok());
  loom::v1::RegisterNode forged = Registration("node-a", 1);
  forged.set_hostname("host\nnode node-b: registered");
  const absl::Status newline = CheckRegistration(forged);
  EXPECT_THAT(std::string(newline.message()), HasSubstr("register.hostname"));
  EXPECT_THAT(std::string(newline.message()), ::testing::Not(HasSubstr("node-b")));
  loom::v1::RegisterNode gpu = Registration("node-a", 1);
  gpu.mutable_devices(0)->set_kind("tpu");
  EXPECT_THAT(std::string(CheckRegistration(gpu).message()), HasSubstr("kind"));
  loom::v1::RegisterNode labeled = Registration("node-a", 1);
  (*labeled.mutable_labels())["rack"] = "r1";
  EXPECT_TRUE(CheckRegistration(labeled).ok());
  (*labeled.mutable_labels())["nvlink_domain"] = "d0\nnode node-b: registered";
  const absl::Status label = CheckRegistration(labeled);
  EXPECT_THAT(std::string(label.message()), HasSubstr("register.labels"));
  EXPECT_THAT(std::string(label.message()), ::testing::Not(HasSubstr("node-b")));
  loom::v1::RegisterNode crowded = Registration("node-a", 1);
  for (int i = 0; i < 17; ++i) (*crowded.mutable_labels())[absl::StrCat("k", i)] = "v";
  EXPECT_THAT(std::string(CheckRegistration(crowded).message()),
              HasSubstr("register.labels has 17 labels; at most 16"));
}

TEST(RpcMetrics, TheMethodLabelIsLoomsMethodsOrOther) {
  EXPECT_EQ(RpcMethodLabel("/loom.v1.JobService/SubmitJob"), "/loom.v1.JobService/SubmitJob");
  EXPECT_EQ(RpcMethodLabel("/loom.v1.RankService/StoreSet"), "/loom.v1.RankService/StoreSet");
  EXPECT_EQ(RpcMethodLabel("/loom.v1.NodeService/Session"), "/loom.v1.NodeService/Session");
  EXPECT_EQ(RpcMethodLabel("/grpc.health.v1.Health/Check"), "/grpc.health.v1.Health/Check");
  EXPECT_EQ(RpcMethodLabel("/loom.v1.JobService/MadeUp1"), "other");
  EXPECT_EQ(RpcMethodLabel("/x/y"), "other");
  EXPECT_EQ(RpcMethodLabel(""), "other");
}

TEST(Metrics, AnEndedJobsSeriesAreRemoved) {
  auto metrics = CoordinatorMetrics::Create("");
  ASSERT_TRUE(metrics.ok());
  CoordinatorMetrics& m = **metrics;
  ProgressSample sample{.step = 1, .loss = 2, .step_seconds = 0.1, .tokens_per_second = 10,
                        .mfu = 0.1, .memory_bytes = 100};
  for (int rank = 0; rank < 4; ++rank) m.SetRankProgress("job-000001", "a", rank, sample);
  m.SetJobProgress("job-000001", "a", sample, 100);
  m.SetJobValLoss("job-000001", "a", 2.5);
  m.CountRestart("job-000001", "a");
  m.SetJobProgress("job-000002", "b", sample, 100);
  const size_t before = m.JobSeriesCount();
  EXPECT_EQ(before, 4u * 6 + 7 + 1 + 6);
  m.RemoveJob("job-000001", "a", 4);
  EXPECT_EQ(m.JobSeriesCount(), 6u);  // job-000002's
  m.RemoveJob("job-000002", "b", 0);
  EXPECT_EQ(m.JobSeriesCount(), 0u);
}

// [moe] A mixture-of-experts job's expert-load series: five per job and one
// per expert, removed with the job.
TEST(Metrics, ExpertLoadSeriesComeAndGoWithTheJob) {
  auto metrics = CoordinatorMetrics::Create("");
  ASSERT_TRUE(metrics.ok());
  CoordinatorMetrics& m = **metrics;
  loom::v1::MoeProgress moe;
  for (double n : {10.0, 30.0, 20.0, 20.0}) moe.add_tokens_per_expert(n);
  moe.set_imbalance(1.5);
  m.SetJobMoe("job-000003", "c", moe);
  m.SetJobMoe("job-000003", "c", moe);  // the next step: same series
  EXPECT_EQ(m.JobSeriesCount(), 5u + 4u);
  m.RemoveJob("job-000003", "c", 0);
  EXPECT_EQ(m.JobSeriesCount(), 0u);
}

// A job's indexed series (its ranks, its experts) are rows of one table:
// served with their labels as a family would serve them, and gone in one
// erase when the job is.
TEST(Metrics, IndexedSeriesAreRowsOfTheJobAndGoInOneErase) {
  IndexedJobSeries series("rank", {{"loom_rank_step", "step"}, {"loom_rank_loss", "loss"}});
  const double row[] = {7, 2.5};
  series.SetRow("job-1", "a", 3, row);  // rows 0-2 never reported: not served
  series.SetRow("job-2", "b", 0, row);
  EXPECT_EQ(series.SeriesCount(), 4u);
  std::vector<prometheus::MetricFamily> families = series.Collect();
  ASSERT_EQ(families.size(), 2u);
  EXPECT_EQ(families[0].name, "loom_rank_step");
  ASSERT_EQ(families[0].metric.size(), 2u);
  const auto& labels = families[0].metric[0].label;
  ASSERT_EQ(labels.size(), 3u);
  EXPECT_EQ(labels[0].name, "job");
  EXPECT_EQ(labels[0].value, "job-1");
  EXPECT_EQ(labels[2].name, "rank");
  EXPECT_EQ(labels[2].value, "3");
  EXPECT_EQ(families[1].metric[0].gauge.value, 2.5);
  series.RemoveJob("job-1");
  EXPECT_EQ(series.SeriesCount(), 2u);
  // A row far beyond any job's ranks is ignored, not allocated.
  series.SetRow("job-3", "c", IndexedJobSeries::kMaxRows, row);
  EXPECT_EQ(series.SeriesCount(), 2u);
}

}  // namespace
}  // namespace loom::coordinator
