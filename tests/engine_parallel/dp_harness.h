// Runs a job's training loop on dp ranks as threads of the test process, each
// with a real Gloo communicator over loopback, and collects what the tests
// compare: losses, norms, the final parameters (gathered), comm counters and
// memory. Also the tiny job and the parameter count by formula.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/training_loop.h"

namespace loom::engine::testing {

struct RankResult {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<float> params;  // every parameter, flat order, after the last step
  MemoryUsage memory;         // after the last step (peaks of that step)
};

// A job without validation (evaluation would add traffic), dp-ready.
inline spec::JobSpec ParallelJob(const std::string& train_path, int zero_stage) {
  spec::JobSpec job = TinyJob(train_path, "");
  job.train.steps = 10;
  job.train.eval_interval = 0;
  job.parallelism.zero_stage = zero_stage;
  return job;
}

// Parameters of the Llama of `m`, by formula (independent of the model code).
inline int64_t LlamaParameterCount(const spec::ModelSpec& m, int64_t* per_layer = nullptr) {
  const int64_t h = m.hidden_size, q = m.num_heads * m.head_dim(),
                kv = (m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads) * m.head_dim();
  const int64_t layer = h + h * (q + 2 * kv) + q * h + h + 3 * h * m.ffn_hidden_size;
  if (per_layer != nullptr) *per_layer = layer;
  return m.vocab_size * h + m.num_layers * layer + h + (m.tie_embeddings ? 0 : m.vocab_size * h);
}

using RankHook = std::function<void(int rank, TrainingLoop& loop, comm::Communicator& comm)>;

// Trains `steps` steps (or until `until` if given) on dp ranks. before_train
// runs after creation (e.g. restore); after_step after every step.
inline std::vector<RankResult> RunDataParallel(const spec::JobSpec& job, int dp, int64_t steps,
                                               const RankHook& before_train = {},
                                               const RankHook& after_step = {}) {
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, dp, absl::Seconds(60), "dp");
  std::vector<RankResult> out(dp);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& c) {
    auto loop = TrainingLoop::Create(job, rank, dp, &c);
    ASSERT_TRUE(loop.ok()) << loop.status();
    if (before_train) before_train(rank, **loop, c);
    while ((*loop)->step() < steps) {
      auto p = (*loop)->TrainStep();
      ASSERT_TRUE(p.ok()) << p.status();
      out[rank].losses.push_back(p->loss);
      out[rank].norms.push_back(p->grad_norm);
      out[rank].memory = (*loop)->memory();
      if (after_step) after_step(rank, **loop, c);
    }
    ASSERT_TRUE((*loop)->GatherParameters(&out[rank].params).ok());
  });
  return out;
}

inline RankResult RunSingle(const spec::JobSpec& job, int64_t steps) {
  RankResult r;
  auto loop = TrainingLoop::Create(job);
  EXPECT_TRUE(loop.ok()) << loop.status();
  if (!loop.ok()) return r;
  while ((*loop)->step() < steps) {
    auto p = (*loop)->TrainStep();
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) break;
    r.losses.push_back(p->loss);
    r.norms.push_back(p->grad_norm);
    r.memory = (*loop)->memory();
  }
  EXPECT_TRUE((*loop)->GatherParameters(&r.params).ok());
  return r;
}

// max |a - b| / max |b| over the vector (the relative error in the max norm).
inline double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace loom::engine::testing
