// tp_tensors.h on a real TP model (2 ranks, one kv head replicated, vocabulary
// split unevenly): gathering each shard gives the single-process tensor
// exactly, scattering the global tensor gives the shard back, and the global
// gradient norm and clipping match one process's.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "tests/engine/reference_clip.h"
#include "worker/engine/optim/clip_gradients.h"

namespace loom::engine {
namespace {

TEST(TpTensorsTest, GatherScatterNormAndClipMatchOneProcess) {
  const spec::ModelSpec c = testing::TinyModel(4, 1, false);
  const testing::TokenBatch b = testing::RandomTokens(2, 10, 37, 4);
  constexpr double kMaxNorm = 0.05;  // below the norm: clipping happens

  LlamaModel single(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(1));
  single.InitParameters(9);
  single.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 10, 1.0f);
  const testing::TensorMap params = testing::ToMap(single.Parameters());
  const double norm = testing::GlobalNorm(single.Gradients());
  ASSERT_GT(norm, kMaxNorm);
  testing::ClipByGlobalNorm(single.Gradients(), kMaxNorm);
  const testing::TensorMap clipped = testing::ToMap(single.Gradients());

  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "tp");
  std::vector<std::vector<testing::Shard>> grads(2);
  std::vector<double> norms(2);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& tp) {
    LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(1), {&tp, true});
    model.InitParameters(9);
    for (const TensorView& v : model.Parameters()) {
      std::vector<float> global;
      ASSERT_TRUE(GatherGlobal(v, &tp, &global).ok());
      EXPECT_EQ(global, params.at(v.name)) << v.name;
      std::vector<float> local(static_cast<size_t>(v.numel()), -1.0f);
      TensorView target = v;
      target.data = local.data();
      ScatterGlobal(params.at(v.name), target);
      EXPECT_EQ(local, std::vector<float>(v.data, v.data + v.numel())) << v.name;
    }
    model.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 10, 1.0f);
    absl::StatusOr<double> n =
        ClipGradients(model.ops(), GradientPieces(model.Gradients()), {&tp}, kMaxNorm);
    ASSERT_TRUE(n.ok()) << n.status();
    norms[rank] = *n;
    grads[rank] = testing::Snapshot(model.Gradients());
  });
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_NEAR(norms[0], norm, 1e-5 * norm);
  testing::ExpectMapsNear(testing::Assemble(grads), clipped, 1e-5, "clipped gradients");
}

}  // namespace
}  // namespace loom::engine
