// High availability on etcd (coordinator/ha/): the --state URL, and against a
// real single-member etcd started by the test (skipped where etcd is not
// installed): leader election, the job store's records, and fencing — a
// coordinator whose term ended cannot write, whatever it believes.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/ha/etcd_client.h"
#include "coordinator/ha/etcd_job_store.h"
#include "coordinator/ha/etcd_target.h"
#include "coordinator/ha/leader_election.h"
#include "coordinator/ha/shared_value.h"
#include "coordinator/jobs/job_manager.h"
#include "gtest/gtest.h"
#include "planner/job_planner.h"
#include "tests/common/scratch_dir.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator::ha {
namespace {

TEST(EtcdTarget, ParsesEndpointsAndPrefix) {
  auto target = ParseEtcdTarget("etcd://10.0.0.1:2379,etcd-b:2379/loom/prod/");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->endpoints, (std::vector<std::string>{"10.0.0.1:2379", "etcd-b:2379"}));
  EXPECT_EQ(target->prefix, "/loom/prod");
}

TEST(EtcdTarget, RejectsWhatItCannotUse) {
  for (const char* bad : {"sqlite:///x", "etcd://h:2379", "etcd://h:2379/", "etcd://h/loom",
                          "etcd://h:0/loom", "etcd://:2379/loom", "etcd://h:2379,/loom"}) {
    auto target = ParseEtcdTarget(bad);
    ASSERT_FALSE(target.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(target.status())) << bad;
    EXPECT_NE(target.status().message().find("--state="), std::string::npos) << bad;
  }
}

TEST(EtcdTarget, PrefixRangeEndCoversExactlyThePrefix) {
  EXPECT_EQ(PrefixRangeEnd("/loom/jobs/"), "/loom/jobs0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  close(fd);
  return ntohs(address.sin_port);
}

std::string FindEtcd() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    const std::string path = absl::StrCat(dir, "/etcd");
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

loom::v1::Job MakeJob(const std::string& id, loom::v1::JobState state) {
  loom::v1::Job job;
  job.set_id(id);
  job.set_name("tiny");
  job.set_state(state);
  return job;
}

// One etcd member on loopback ports, killed by pid at the end.
class EtcdHa : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = FindEtcd();
    if (etcd_.empty()) GTEST_SKIP() << "etcd is not installed (scripts/install_deps.sh)";
    ASSERT_FALSE(scratch_.path().empty());
    endpoint_ = absl::StrCat("127.0.0.1:", FreePort());
    peer_ = absl::StrCat("http://127.0.0.1:", FreePort());
    client_ = std::make_unique<EtcdClient>(std::vector<std::string>{endpoint_},
                                           grpc::InsecureChannelCredentials());
    StartEtcd();
  }

  // Starts the member (again: same ports, same data) and waits until it answers.
  void StartEtcd() {
    std::vector<std::string> args = {
        etcd_,
        "--name=t0",
        "--data-dir=" + (scratch_ / "etcd"),
        "--listen-client-urls=http://" + endpoint_,
        "--advertise-client-urls=http://" + endpoint_,
        "--listen-peer-urls=" + peer_,
        "--initial-advertise-peer-urls=" + peer_,
        "--initial-cluster=t0=" + peer_};
    const std::string log = scratch_ / "etcd.log";
    // posix_spawn, not fork: no fork handlers of the gRPC this test links run.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_GT(pid_, 0);
    for (int i = 0; i < 200; ++i) {
      if (absl::IsNotFound(client_->Get("/probe").status())) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    FAIL() << "etcd did not answer within 20 s; its log:\n" << text.str();
  }

  // SIGKILL: whatever it had not acknowledged is gone with it.
  void KillEtcd() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }

  void TearDown() override { KillEtcd(); }

  ElectionOptions Options(const std::string& address) {
    return {.leader_key = "/t/leader",
            .address = address,
            .lease_ttl = absl::Seconds(2),
            .poll_interval = absl::Milliseconds(50)};
  }

  loom::testing::ScratchDir scratch_{"loom_etcd_ha"};
  std::string etcd_;
  pid_t pid_ = -1;
  std::string endpoint_;
  std::string peer_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdHa, StoreKeepsJobsAndNeverReusesADeletedSequence) {
  LeaderElection election(client_.get(), Options("a:1"));
  absl::Notification never;
  ASSERT_TRUE(election.Campaign(never, [](const std::string&) {}, [](const std::string&) {}).ok());
  EtcdJobStore store(client_.get(), "/t", election.Fence());
  const loom::v1::Job one = MakeJob("job-abc123-000002", loom::v1::PENDING);
  const loom::v1::Job two = MakeJob("job-abc123-000010", loom::v1::RUNNING);
  ASSERT_TRUE(store.PutAll({&two, &one}).ok());
  ASSERT_TRUE(store.Put(MakeJob("job-abc123-000002", loom::v1::STARTING)).ok());

  // Another client (a coordinator taking over) reads what was acknowledged.
  EtcdClient other({endpoint_}, grpc::InsecureChannelCredentials());
  EtcdJobStore reader(&other, "/t", election.Fence());
  auto jobs = reader.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "job-abc123-000002");  // in sequence order
  EXPECT_EQ((*jobs)[0].state(), loom::v1::STARTING);
  EXPECT_EQ((*jobs)[1].state(), loom::v1::RUNNING);

  ASSERT_TRUE(store.Delete({"job-abc123-000010"}).ok());
  jobs = reader.LoadAll();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
  auto max = reader.MaxSequence();
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(*max, 10);
}

TEST_F(EtcdHa, BatchesLargerThanOneTransactionAreAllStored) {
  LeaderElection election(client_.get(), Options("a:1"));
  absl::Notification never;
  ASSERT_TRUE(election.Campaign(never, [](const std::string&) {}, [](const std::string&) {}).ok());
  EtcdJobStore store(client_.get(), "/t", election.Fence());
  // 250 jobs (over 128 operations) of 20 KiB (over 1.5 MiB together).
  std::vector<loom::v1::Job> jobs;
  for (int i = 1; i <= 250; ++i) {
    jobs.push_back(MakeJob(absl::StrCat("job-abc123-", 100000 + i), loom::v1::PENDING));
    jobs.back().set_spec_yaml(std::string(20 << 10, 'x'));
  }
  std::vector<const loom::v1::Job*> pointers;
  for (const loom::v1::Job& job : jobs) pointers.push_back(&job);
  ASSERT_TRUE(store.PutAll(pointers).ok());
  auto loaded = store.LoadAll();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 250u);
}

TEST_F(EtcdHa, StandbyLeadsWhenTheLeaderGoesAndTheOldLeaderCannotWrite) {
  std::atomic<bool> a_lost{false};
  LeaderElection a(client_.get(), Options("a:1"));
  absl::Notification never;
  ASSERT_TRUE(a.Campaign(never, [](const std::string&) {},
                         [&](const std::string&) { a_lost = true; })
                  .ok());
  EtcdJobStore a_store(client_.get(), "/t", a.Fence());
  ASSERT_TRUE(a_store.Put(MakeJob("job-abc123-000001", loom::v1::RUNNING)).ok());

  // b stands by and sees a as the leader.
  EtcdClient b_client({endpoint_}, grpc::InsecureChannelCredentials());
  LeaderElection b(&b_client, Options("b:2"));
  absl::Notification stop_b;
  std::atomic<bool> b_leads{false};
  std::string seen;
  absl::Mutex seen_mu;
  std::thread campaign([&] {
    b_leads = b.Campaign(stop_b,
                         [&](const std::string& leader) {
                           absl::MutexLock lock(&seen_mu);
                           seen = leader;
                         },
                         [](const std::string&) {})
                  .ok();
  });
  for (int i = 0; i < 100; ++i) {
    {
      absl::MutexLock lock(&seen_mu);
      if (seen == "a:1") break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  {
    absl::MutexLock lock(&seen_mu);
    EXPECT_EQ(seen, "a:1");
  }
  EXPECT_FALSE(b_leads);

  // a's lease ends (as when it stalls past its TTL): b takes over.
  ASSERT_TRUE(client_->LeaseRevoke(a.lease()).ok());
  for (int i = 0; i < 200 && !b_leads; ++i) absl::SleepFor(absl::Milliseconds(50));
  stop_b.Notify();
  campaign.join();
  ASSERT_TRUE(b_leads);
  auto leader = client_->Get("/t/leader");
  ASSERT_TRUE(leader.ok());
  EXPECT_EQ(leader->value(), "b:2");

  // a still holds a store with its old term: every write is refused and
  // changes nothing; b's writes go through.
  absl::Status fenced = a_store.Put(MakeJob("job-abc123-000001", loom::v1::FAILED));
  EXPECT_TRUE(absl::IsFailedPrecondition(fenced)) << fenced;
  EXPECT_TRUE(IsFenced(fenced)) << fenced;
  EXPECT_NE(fenced.message().find("no longer leads"), std::string::npos) << fenced;
  EXPECT_TRUE(absl::IsFailedPrecondition(a_store.Delete({"job-abc123-000001"})));
  EtcdJobStore b_store(&b_client, "/t", b.Fence());
  auto jobs = b_store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state(), loom::v1::RUNNING);
  EXPECT_TRUE(b_store.Put(MakeJob("job-abc123-000001", loom::v1::SUCCEEDED)).ok());

  // a notices its term is over within its TTL (the coordinator then exits).
  for (int i = 0; i < 100 && !a_lost; ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(a_lost);
}

TEST_F(EtcdHa, UserTokensIssuedByOneLeaderAreKnownToTheNext) {
  LeaderElection a(client_.get(), Options("a:1"));
  absl::Notification never;
  ASSERT_TRUE(a.Campaign(never, [](const std::string&) {}, [](const std::string&) {}).ok());
  auto a_tokens = auth::UserTokenStore::Open(EtcdTokenPersistence(client_.get(), "/t/tokens", a.Fence()));
  ASSERT_TRUE(a_tokens.ok()) << a_tokens.status();
  auto token = (*a_tokens)->Create("alice");
  ASSERT_TRUE(token.ok()) << token.status();
  // The value in etcd is the hash, never the token.
  auto stored = client_->Get("/t/tokens");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->value().find(*token), std::string::npos);

  ASSERT_TRUE(client_->LeaseRevoke(a.lease()).ok());
  LeaderElection b(client_.get(), Options("b:2"));
  ASSERT_TRUE(b.Campaign(never, [](const std::string&) {}, [](const std::string&) {}).ok());
  auto b_tokens = auth::UserTokenStore::Open(EtcdTokenPersistence(client_.get(), "/t/tokens", b.Fence()));
  ASSERT_TRUE(b_tokens.ok());
  auto user = (*b_tokens)->Lookup(*token);
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(*user, "alice");
  // The old leader can no longer issue or revoke: UNAVAILABLE (a client
  // goes to the leader), marked fenced (the coordinator stops acting).
  const absl::Status create = (*a_tokens)->Create("mallory").status();
  EXPECT_TRUE(absl::IsUnavailable(create)) << create;
  EXPECT_TRUE(IsFenced(create)) << create;
  const absl::Status revoke = (*a_tokens)->Revoke("alice").status();
  EXPECT_TRUE(absl::IsUnavailable(revoke) && IsFenced(revoke)) << revoke;
  EXPECT_TRUE((*a_tokens)->Lookup(*token).ok());  // nothing changed
  EXPECT_TRUE((*b_tokens)->Lookup(*token).ok());
}

// A job manager on etcd: clients hear UNAVAILABLE for what etcd, stopped,
// could not store, and a manager started after etcd is back holds exactly
// what they were told.
TEST_F(EtcdHa, WhatClientsAreToldIsWhatEtcdHoldsWhenEtcdStopsDuringWrites) {
  LeaderElection election(client_.get(), Options("a:1"));
  absl::Notification never;
  ASSERT_TRUE(election.Campaign(never, [](const std::string&) {}, [](const std::string&) {}).ok());
  NodeRegistry nodes;
  KvStore kv;
  auto start = [&] {
    auto jobs = std::make_unique<JobManager>(
        JobManagerOptions{.state_dir = scratch_ / "state"},
        std::make_unique<EtcdJobStore>(client_.get(), "/t", election.Fence()), &nodes, &kv,
        nullptr, planner::ResolveLayout);
    EXPECT_TRUE(jobs->Recover().ok());
    return jobs;
  };
  auto jobs = start();
  auto kept = jobs->Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  auto cancelled = jobs->Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(kept.ok() && cancelled.ok());
  ASSERT_TRUE(jobs->Cancel(cancelled->id()).ok());

  KillEtcd();
  auto lost = jobs->Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable) << lost.status();
  auto cancel = jobs->Cancel(kept->id());
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable) << cancel.status();
  const absl::Status deleted = jobs->Delete(cancelled->id());
  EXPECT_EQ(deleted.code(), absl::StatusCode::kUnavailable) << deleted;
  EXPECT_EQ(jobs->Get(kept->id())->state(), loom::v1::PENDING);
  EXPECT_TRUE(jobs->Get(cancelled->id()).ok());
  jobs.reset();

  StartEtcd();
  jobs = start();
  auto page = jobs->List(100);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs.size(), 2u);
  EXPECT_EQ(page->jobs[0].id(), kept->id());
  EXPECT_EQ(page->jobs[0].state(), loom::v1::PENDING);
  EXPECT_EQ(page->jobs[1].id(), cancelled->id());
  EXPECT_EQ(page->jobs[1].state(), loom::v1::CANCELLED);
}

// A fenced write (another coordinator leads) makes the job manager stop
// acting at once: the caller hears UNAVAILABLE, nothing reaches the agents,
// nothing more is accepted or decided.
TEST_F(EtcdHa, AFencedWriteStopsTheJobManagerActingAtOnce) {
  LeaderElection election(client_.get(), Options("a:1"));
  absl::Notification never;
  ASSERT_TRUE(election.Campaign(never, [](const std::string&) {}, [](const std::string&) {}).ok());
  NodeRegistry nodes;
  KvStore kv;
  auto channel = std::make_shared<testing::RecordingChannel>();
  loom::v1::RegisterNode node;
  node.set_node_id("node-a");
  node.set_address("127.0.0.1");
  loom::v1::Device* device = node.add_devices();
  device->set_kind("cpu");
  device->set_count(2);
  nodes.Register(node, channel, absl::Now());
  absl::Notification fenced;
  JobManagerOptions options{.state_dir = scratch_ / "state"};
  options.on_fenced = [&](const absl::Status& why) {
    EXPECT_TRUE(IsFenced(why)) << why;
    fenced.Notify();
  };
  JobManager jobs(options, std::make_unique<EtcdJobStore>(client_.get(), "/t", election.Fence()),
                  &nodes, &kv, nullptr, planner::ResolveLayout);
  ASSERT_TRUE(jobs.Recover().ok());
  auto job = jobs.Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(job.ok()) << job.status();
  jobs.WaitIdle();
  ASSERT_EQ(jobs.Get(job->id())->state(), loom::v1::STARTING);
  const size_t launches = channel->messages().size();
  ASSERT_EQ(launches, 2u);

  // Its term ends (the lease is gone: another coordinator may lead now).
  ASSERT_TRUE(client_->LeaseRevoke(election.lease()).ok());
  auto cancel = jobs.Cancel(job->id());
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable) << cancel.status();
  EXPECT_NE(cancel.status().message().find("no longer leads"), std::string::npos);
  fenced.WaitForNotification();
  jobs.OnNodeLost("node-a", "its agent's session ended");
  auto refused = jobs.Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  jobs.WaitIdle();
  EXPECT_EQ(channel->messages().size(), launches);  // no kill left
  EXPECT_EQ(jobs.Get(job->id())->state(), loom::v1::STARTING);  // as stored
  auto stored = client_->Get(absl::StrCat("/t/jobs/", job->id()));
  ASSERT_TRUE(stored.ok());
  loom::v1::Job record;
  ASSERT_TRUE(record.ParseFromString(stored->value()));
  EXPECT_EQ(record.state(), loom::v1::STARTING);
}

TEST_F(EtcdHa, SharedValuesAreCreatedOnceForEveryone) {
  auto first = LoadOrCreateShared(client_.get(), "/t/secrets/k", [] { return std::string("one"); });
  auto second = LoadOrCreateShared(client_.get(), "/t/secrets/k", [] { return std::string("two"); });
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, "one");
  EXPECT_EQ(*second, "one");
}

}  // namespace
}  // namespace loom::coordinator::ha
