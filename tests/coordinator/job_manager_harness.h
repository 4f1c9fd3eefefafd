// A JobManager on a scratch SQLite store with a real node registry and
// rendezvous store, for the coordinator's JobManager tests: a small
// data-parallel spec, CPU nodes that record what is sent to them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/sqlite_job_store.h"
#include "coordinator/rendezvous/kv_store.h"
#include "gtest/gtest.h"
#include "planner/job_planner.h"
#include "tests/common/scratch_dir.h"

namespace loom::coordinator::testing {

// Two CPU ranks, data-parallel, five steps.
inline constexpr char kSmallDpSpec[] = R"(
name: small
model: {vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 2, ffn_hidden_size: 64,
        max_seq_len: 32}
train: {steps: 5, global_batch_size: 4, micro_batch_size: 2, seq_len: 16, eval_interval: 0}
data: {train_path: corpus.txt}
parallelism: {dp: 2, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0}
resources: {device: cpu, ranks: 2}
)";

// A node's session as the registry sees it, keeping every message sent.
class RecordingChannel final : public NodeChannel {
 public:
  void Send(const loom::v1::CoordinatorMessage& message) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(message);
  }
  std::vector<loom::v1::CoordinatorMessage> messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }

 private:
  absl::Mutex mu_;
  std::vector<loom::v1::CoordinatorMessage> messages_;
};

class JobManagerHarness : public ::testing::Test {
 protected:
  explicit JobManagerHarness(const std::string& scratch_name) : scratch_(scratch_name) {}

  // A fresh manager over the scratch state directory (what was stored stays).
  void Start(JobManagerOptions options = {}, SqliteJobStoreOptions sqlite = {}) {
    jobs_.reset();
    auto store = SqliteJobStore::Open(state_dir(), sqlite);
    ASSERT_TRUE(store.ok()) << store.status();
    StartWith(std::move(options), *std::move(store));
  }
  // The same over a given store (one that wraps the scratch SQLite store).
  void StartWith(JobManagerOptions options, std::unique_ptr<JobStore> store) {
    jobs_.reset();
    options.state_dir = state_dir();
    jobs_ = std::make_unique<JobManager>(options, std::move(store), &nodes_, &kv_, nullptr,
                                         planner::ResolveLayout);
    absl::Status recovered = jobs_->Recover();
    ASSERT_TRUE(recovered.ok()) << recovered;
  }
  std::string state_dir() const { return scratch_ / "state"; }

  // Registers a CPU node with `devices` devices.
  std::shared_ptr<RecordingChannel> AddNode(const std::string& id, int devices) {
    auto channel = std::make_shared<RecordingChannel>();
    loom::v1::RegisterNode r;
    r.set_node_id(id);
    r.set_address("127.0.0.1");
    loom::v1::Device* d = r.add_devices();
    d->set_kind("cpu");
    d->set_count(devices);
    d->set_peak_flops(1e11);
    nodes_.Register(r, channel, absl::Now());
    return channel;
  }

  const loom::testing::ScratchDir scratch_;
  NodeRegistry nodes_;
  KvStore kv_;
  std::unique_ptr<JobManager> jobs_;
};

}  // namespace loom::coordinator::testing
