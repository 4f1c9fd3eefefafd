// Bytes each rank sends per step, by operation, against the analytic volumes
// of the DP reduction (docs/engine.md, "Traffic per step"), for every ZeRO
// stage: N parameters (by formula), n ranks, M micro-batches per rank, ring
// definitions of docs/comm.md (all-reduce 2(n-1)/n of the buffer,
// reduce-scatter and all-gather (n-1)/n of the full buffer). Sizes are chosen
// so no bucket needs padding: then the volumes are exact functions of N.
#include <map>
#include <span>

#include "gtest/gtest.h"
#include "tests/engine_parallel/dp_harness.h"

namespace loom::engine {
namespace {

struct Case {
  int stage;
  int dp;
  bool tied;
};

class ZeroTrafficTest : public ::testing::TestWithParam<Case> {};

TEST_P(ZeroTrafficTest, BytesPerStepMatchFormulas) {
  const Case c = GetParam();
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  spec::JobSpec job = testing::ParallelJob(dir / "train.txt", c.stage);
  job.model.tie_embeddings = c.tied;
  job.train.steps = 3;
  const int n = c.dp;
  const int64_t micro = job.train.global_batch_size / (job.train.micro_batch_size * n);
  int64_t per_layer = 0;
  const int64_t N = testing::LlamaParameterCount(job.model, &per_layer);
  const int64_t L = job.model.num_layers;
  const int64_t embed = job.model.vocab_size * job.model.hidden_size;
  const int64_t B = 4 * N;  // gradient / parameter bytes
  const int64_t ring = (n - 1) * B / n;

  std::map<std::string, int64_t> want;
  if (c.stage <= 1) {
    want["all_reduce"] = 2 * ring + 2 * (n - 1) * 4 / n;  // gradients + the loss
  } else {
    want["all_reduce"] = 2 * (n - 1) * 8 / n;              // loss and squared norm together
    want["reduce_scatter"] = micro * ring;                  // every micro-batch
  }
  if (c.stage == 1 || c.stage == 2) want["all_gather"] = ring;  // updated parameters
  if (c.stage == 3) {
    // Forward gathers every unit (the head again gathers a tied embedding),
    // backward every layer again (the head is kept from forward, the
    // embedding's backward reads no weights).
    const int64_t forward = N + (c.tied ? embed : 0);
    const int64_t backward = L * per_layer;
    want["all_gather"] = micro * (n - 1) * 4 * (forward + backward) / n;
  }

  std::vector<std::map<std::string, int64_t>> got(n);
  std::vector<comm::CommStats> before(n);
  // Counters are cumulative per communicator: step 2 is the difference.
  testing::RunDataParallel(job, n, 2, {}, [&](int rank, TrainingLoop& loop, comm::Communicator& comm) {
    const comm::CommStats s = comm.Stats();
    if (loop.step() == 1) {
      before[rank] = s;
      return;
    }
    for (const auto& [op, counters] : s) {
      const auto it = before[rank].find(op);
      const int64_t prior = it == before[rank].end() ? 0 : it->second.bytes;
      if (counters.bytes - prior != 0) got[rank][op] = counters.bytes - prior;
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got[r], want) << "rank " << r << " stage " << c.stage << " dp " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ZeroTrafficTest,
    ::testing::Values(Case{0, 2, false}, Case{1, 2, false}, Case{2, 2, false}, Case{3, 2, false},
                      Case{3, 2, true}, Case{0, 4, false}, Case{1, 4, false}, Case{2, 4, false},
                      Case{3, 4, false}),
    [](const auto& info) {
      return "zero" + std::to_string(info.param.stage) + "_dp" + std::to_string(info.param.dp) +
             (info.param.tied ? "_tied" : "");
    });

// Buckets: with a small bucket the gradient all-reduce is split into several
// calls (launched during backward), with the same total volume.
TEST(ZeroBucketsTest, BucketSizeSetsTheNumberOfAllReduces) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  spec::JobSpec job = testing::ParallelJob(dir / "train.txt", 0);
  job.model.hidden_size = 128;  // ~0.6M parameters: 2.4 MB of gradients
  job.model.ffn_hidden_size = 384;
  job.model.num_layers = 2;
  job.train.steps = 1;
  const int64_t N = testing::LlamaParameterCount(job.model);
  for (int64_t mb : {1, 64}) {
    job.parallelism.bucket_mb = mb;
    std::vector<comm::CommStats> stats(2);
    testing::RunDataParallel(job, 2, 1, {}, [&](int rank, TrainingLoop& loop, comm::Communicator& c) {
      stats[rank] = c.Stats();
      ASSERT_NE(loop.dp_engine(), nullptr);
      const int64_t buckets = static_cast<int64_t>(loop.dp_engine()->partition().buckets().size());
      EXPECT_EQ(stats[rank]["all_reduce"].calls, buckets + 1);  // + the loss
      if (mb == 1) {
        EXPECT_GE(buckets, 2);  // 1.8 MB of gradients in 1 MiB buckets
      } else {
        EXPECT_EQ(buckets, 1);
      }
    });
    EXPECT_EQ(stats[0]["all_reduce"].bytes, 4 * N + 4);
  }
}

// Forwards to a real communicator and records, for each gradient collective,
// whether the embedding's gradient (the last one backward computes) was still
// untouched when it was issued: then it was issued during backward.
class ProbeCommunicator : public comm::Communicator {
 public:
  explicit ProbeCommunicator(comm::Communicator* inner) : inner_(inner) {}
  void Watch(const float* data, int64_t n) { watched_ = data, watched_n_ = n; }
  std::vector<bool> during_backward;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(std::span<float> d, comm::ReduceOp op) override {
    return inner_->AllReduce(d, op);
  }
  std::unique_ptr<comm::Work> AllReduceAsync(std::span<float> d, comm::ReduceOp op) override {
    Probe(d.size());
    return inner_->AllReduceAsync(d, op);
  }
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override {
    Probe(in.size());
    return inner_->ReduceScatter(in, out);
  }
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    return inner_->AllGather(in, out);
  }
  absl::Status Broadcast(std::span<float> d, int root) override { return inner_->Broadcast(d, root); }
  absl::Status Send(std::span<const float> d, int peer, uint32_t tag) override {
    return inner_->Send(d, peer, tag);
  }
  absl::Status Recv(std::span<float> d, int peer, uint32_t tag) override {
    return inner_->Recv(d, peer, tag);
  }
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& sc,
                        std::span<float> out, const std::vector<int64_t>& rc) override {
    return inner_->AllToAll(in, sc, out, rc);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  comm::CommStats Stats() const override { return inner_->Stats(); }

 private:
  void Probe(size_t size) {
    if (watched_ == nullptr || size < 2) return;
    bool zero = true;
    for (int64_t i = 0; i < watched_n_; ++i) zero = zero && watched_[i] == 0.0f;
    during_backward.push_back(zero);
  }
  comm::Communicator* inner_;
  const float* watched_ = nullptr;
  int64_t watched_n_ = 0;
};

// Buckets go out while backward still runs: the first gradient collective of
// the step is issued before the embedding's gradient exists (one micro-batch
// per rank, so nothing was accumulated before).
TEST(ZeroBucketsTest, ReductionsStartDuringBackward) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  for (int stage : {0, 2, 3}) {
    spec::JobSpec job = testing::ParallelJob(dir / "train.txt", stage);
    job.model.hidden_size = 128;
    job.model.ffn_hidden_size = 384;
    job.parallelism.bucket_mb = 1;
    job.train.global_batch_size = 4;
    job.train.steps = 1;
    comm::InProcessStore store;
    auto comms = comm::testing::MakeGroup(store, 2, absl::Seconds(60), "dp");
    std::vector<std::vector<bool>> seen(2);
    comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& c) {
      ProbeCommunicator probe(&c);
      auto loop = TrainingLoop::Create(job, rank, 2, &probe);
      ASSERT_TRUE(loop.ok()) << loop.status();
      const TensorView embed = (*loop)->model().Gradients()[0];
      probe.Watch(embed.data, embed.numel());
      ASSERT_TRUE((*loop)->TrainStep().ok());
      seen[rank] = probe.during_backward;
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_GE(seen[r].size(), 2u) << "stage " << stage;
      EXPECT_TRUE(seen[r].front()) << "stage " << stage << ": first bucket waited for backward";
      EXPECT_FALSE(seen[r].back()) << "stage " << stage;  // the embedding's own bucket
    }
  }
}

}  // namespace
}  // namespace loom::engine
