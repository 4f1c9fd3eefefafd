// The pipeline's point-to-point messages match by posting order, as NCCL
// needs: NCCL has no tags (worker/comm/nccl_communicator.h), so a send from
// stage a to stage b meets the receive b posted from a in the same position.
// Every boundary tensor has the same size, so a schedule whose sender and
// receiver disagree on the order would silently swap activations on a GPU
// while Gloo (which matches tags) trains correctly. Each rank's pp
// communicator records the tags it posts per peer; for every pair, the
// sender's sequence must equal the receiver's, through training steps with
// an evaluation and a checkpoint, for the schedules the engine runs.
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

// Forwards everything to `inner` and records the tags of the point-to-point
// operations in posting order, per peer.
class OrderRecorder final : public comm::Communicator {
 public:
  explicit OrderRecorder(comm::Communicator* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(std::span<float> data, comm::ReduceOp op) override {
    return inner_->AllReduce(data, op);
  }
  std::unique_ptr<comm::Work> AllReduceAsync(std::span<float> data, comm::ReduceOp op) override {
    return inner_->AllReduceAsync(data, op);
  }
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override {
    return inner_->ReduceScatter(in, out);
  }
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    return inner_->AllGather(in, out);
  }
  absl::Status Broadcast(std::span<float> data, int root) override {
    return inner_->Broadcast(data, root);
  }
  absl::Status Send(std::span<const float> data, int peer, uint32_t tag) override {
    sends_[peer].push_back(tag);
    return inner_->Send(data, peer, tag);
  }
  absl::Status Recv(std::span<float> data, int peer, uint32_t tag) override {
    recvs_[peer].push_back(tag);
    return inner_->Recv(data, peer, tag);
  }
  std::unique_ptr<comm::Work> SendAsync(std::span<const float> data, int peer,
                                        uint32_t tag) override {
    sends_[peer].push_back(tag);
    return inner_->SendAsync(data, peer, tag);
  }
  std::unique_ptr<comm::Work> RecvAsync(std::span<float> data, int peer, uint32_t tag) override {
    recvs_[peer].push_back(tag);
    return inner_->RecvAsync(data, peer, tag);
  }
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts,
                        std::span<float> out, const std::vector<int64_t>& recv_counts) override {
    return inner_->AllToAll(in, send_counts, out, recv_counts);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  comm::CommStats Stats() const override { return inner_->Stats(); }

  // Tags posted to / from each peer, in order (read after the rank's thread ends).
  const std::map<int, std::vector<uint32_t>>& sends() const { return sends_; }
  const std::map<int, std::vector<uint32_t>>& recvs() const { return recvs_; }

 private:
  comm::Communicator* inner_;
  std::map<int, std::vector<uint32_t>> sends_, recvs_;
};

struct Case {
  const char* name;
  int pp;
  spec::Schedule schedule;
  int virtual_stages;
  int layers;
};

class PipelineP2pOrderTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }
  testing::ScratchDir dir_;
};

TEST_P(PipelineP2pOrderTest, SendsAndReceivesPairUpInPostingOrder) {
  const Case& c = GetParam();
  spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
  job.model.num_layers = c.layers;
  job.train.steps = 2;
  job.train.eval_interval = 2;
  job.parallelism.pp = c.pp;
  job.parallelism.schedule = c.schedule;
  job.parallelism.virtual_stages = c.virtual_stages;
  comm::InProcessStore store;
  std::vector<std::unique_ptr<comm::Communicator>> group =
      comm::testing::MakeGroup(store, c.pp, absl::Seconds(60), "pp");
  std::vector<std::unique_ptr<OrderRecorder>> recorders;
  for (auto& g : group) recorders.push_back(std::make_unique<OrderRecorder>(g.get()));
  std::vector<std::thread> threads;
  for (int p = 0; p < c.pp; ++p) {
    threads.emplace_back([&, p] {
      absl::StatusOr<std::unique_ptr<TrainingLoop>> loop =
          TrainingLoop::Create(job, 0, 1, nullptr, nullptr, recorders[p].get());
      ASSERT_TRUE(loop.ok()) << loop.status();
      while (!(*loop)->done()) {
        absl::StatusOr<StepProgress> s = (*loop)->TrainStep();
        ASSERT_TRUE(s.ok()) << s.status();
      }
      ASSERT_TRUE((*loop)->SaveCheckpoint(dir_ / "ckpt").ok());
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t messages = 0;
  for (int a = 0; a < c.pp; ++a) {
    for (int b = 0; b < c.pp; ++b) {
      if (a == b) continue;
      auto sent = recorders[a]->sends().find(b);
      auto received = recorders[b]->recvs().find(a);
      const std::vector<uint32_t> none;
      const std::vector<uint32_t>& s = sent != recorders[a]->sends().end() ? sent->second : none;
      const std::vector<uint32_t>& r =
          received != recorders[b]->recvs().end() ? received->second : none;
      EXPECT_EQ(s, r) << "stage " << a << " -> stage " << b
                      << ": the sender posts in another order than the receiver";
      messages += static_cast<int64_t>(s.size());
    }
  }
  // Activations and gradients of every micro-batch over every boundary, both
  // steps, and the evaluation's activations.
  EXPECT_GT(messages, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineP2pOrderTest,
    ::testing::Values(Case{"pp2_1f1b", 2, spec::Schedule::k1F1B, 1, 2},
                      Case{"pp2_afab", 2, spec::Schedule::kAfab, 1, 2},
                      Case{"pp2_interleaved", 2, spec::Schedule::kInterleaved, 2, 4},
                      Case{"pp4_1f1b", 4, spec::Schedule::k1F1B, 1, 4},
                      Case{"pp4_interleaved", 4, spec::Schedule::kInterleaved, 2, 8}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace loom::engine
