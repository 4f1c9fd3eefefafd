// Learning-rate schedule, global-norm clipping and AdamW, each against values
// computed by hand from the definitions.
#include <cmath>
#include <memory>
#include <numbers>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/engine/reference_clip.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/clip_gradients.h"
#include "worker/engine/optim/lr_schedule.h"

namespace loom::engine {
namespace {

spec::TrainSpec Schedule(spec::LrSchedule kind) {
  spec::TrainSpec t;
  t.steps = 100;
  t.warmup_steps = 10;
  t.lr = 1e-3;
  t.min_lr_ratio = 0.1;
  t.lr_schedule = kind;
  return t;
}

TEST(LrScheduleTest, LinearWarmupFromZero) {
  const spec::TrainSpec t = Schedule(spec::LrSchedule::kCosine);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 5), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 1e-3);
}

TEST(LrScheduleTest, CosineEndsAtMinimum) {
  const spec::TrainSpec t = Schedule(spec::LrSchedule::kCosine);
  EXPECT_NEAR(LearningRate(t, 100), 1e-4, 1e-15);
  // Halfway through the decay the cosine is at the midpoint of lr and min.
  EXPECT_NEAR(LearningRate(t, 55), 0.5 * (1e-3 + 1e-4), 1e-15);
  const double p = 30.0 / 90.0;
  EXPECT_NEAR(LearningRate(t, 40), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(std::numbers::pi * p)), 1e-15);
  for (int64_t s = 11; s < 100; ++s) EXPECT_GT(LearningRate(t, s), LearningRate(t, s + 1));
}

TEST(LrScheduleTest, LinearAndConstant) {
  const spec::TrainSpec lin = Schedule(spec::LrSchedule::kLinear);
  EXPECT_NEAR(LearningRate(lin, 55), 5.5e-4, 1e-15);
  EXPECT_NEAR(LearningRate(lin, 100), 1e-4, 1e-15);
  const spec::TrainSpec cst = Schedule(spec::LrSchedule::kConstant);
  EXPECT_DOUBLE_EQ(LearningRate(cst, 5), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(cst, 100), 1e-3);
}

TEST(LrScheduleTest, NoWarmup) {
  spec::TrainSpec t = Schedule(spec::LrSchedule::kCosine);
  t.warmup_steps = 0;
  EXPECT_LT(LearningRate(t, 1), 1e-3);
  EXPECT_GT(LearningRate(t, 1), 0.999e-3);
  EXPECT_NEAR(LearningRate(t, 100), 1e-4, 1e-15);
}

TEST(GradClipTest, ClipFactorIsPyTorchs) {
  EXPECT_EQ(ClipFactor(5.0, 10.0), 1.0f);  // below the threshold
  EXPECT_EQ(ClipFactor(5.0, 0.0), 1.0f);   // disabled
  EXPECT_FLOAT_EQ(ClipFactor(5.0, 1.0), static_cast<float>(1.0 / (5.0 + 1e-6)));
}

// The host reference the tests compare the engine's clipping with.
TEST(GradClipTest, ReferenceNormAndScale) {
  using testing::ClipByGlobalNorm;
  using testing::GlobalNorm;
  std::vector<float> a = {3.0f, 0.0f}, b = {0.0f, 4.0f, 0.0f};
  std::vector<TensorView> grads = {{"a", {2}, a.data()}, {"b", {3}, b.data()}};
  EXPECT_DOUBLE_EQ(GlobalNorm(grads), 5.0);
  // Below the threshold: untouched.
  EXPECT_DOUBLE_EQ(ClipByGlobalNorm(grads, 10.0), 5.0);
  EXPECT_EQ(a[0], 3.0f);
  // Disabled with 0.
  EXPECT_DOUBLE_EQ(ClipByGlobalNorm(grads, 0.0), 5.0);
  EXPECT_EQ(a[0], 3.0f);
  // Above: scaled to (almost exactly) the threshold, direction kept.
  EXPECT_DOUBLE_EQ(ClipByGlobalNorm(grads, 1.0), 5.0);
  EXPECT_NEAR(a[0], 0.6f, 1e-6);
  EXPECT_NEAR(b[1], 0.8f, 1e-6);
  EXPECT_NEAR(GlobalNorm(grads), 1.0, 1e-6);
}

// Reference AdamW (PyTorch semantics) in double.
void ReferenceAdamW(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                    std::vector<double>& v, double lr, double b1, double b2, double eps, double wd,
                    int step) {
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1 - lr * wd;
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const double mhat = m[i] / (1 - std::pow(b1, step));
    const double vhat = v[i] / (1 - std::pow(b2, step));
    p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
  }
}

TEST(AdamWTest, MatchesHandComputationAndSkipsDecayOnNorms) {
  spec::TrainSpec t;
  t.beta1 = 0.9;
  t.beta2 = 0.95;
  t.eps = 1e-8;
  t.weight_decay = 0.1;
  std::vector<float> w = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, -0.75f};  // [2, 3] matrix
  std::vector<float> n = {1.0f, 1.5f};                              // [2] norm weight
  std::vector<float> gw(6), gn(2);
  std::unique_ptr<kernels::Ops> cpu = kernels::cpu::MakeCpuOps(1);
  AdamW opt({{"w", {2, 3}, w.data()}, {"n", {2}, n.data()}},
            {{"w", {2, 3}, gw.data()}, {"n", {2}, gn.data()}}, t, *cpu);
  std::vector<double> rw(w.begin(), w.end()), rn(n.begin(), n.end());
  std::vector<double> mw(6, 0), vw(6, 0), mn(2, 0), vn(2, 0);
  const double lrs[] = {1e-2, 5e-3, 2e-2};
  for (int step = 1; step <= 3; ++step) {
    for (int i = 0; i < 6; ++i) gw[i] = 0.1f * static_cast<float>((i * 7 + step * 3) % 5) - 0.2f;
    gn = {0.3f * step, -0.05f};
    std::vector<double> dgw(gw.begin(), gw.end()), dgn(gn.begin(), gn.end());
    opt.Step(lrs[step - 1]);
    ReferenceAdamW(rw, dgw, mw, vw, lrs[step - 1], 0.9, 0.95, 1e-8, 0.1, step);
    ReferenceAdamW(rn, dgn, mn, vn, lrs[step - 1], 0.9, 0.95, 1e-8, 0.0, step);
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(w[i], rw[i], 1e-6) << "step " << step << " i " << i;
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(n[i], rn[i], 1e-6) << "step " << step << " i " << i;
  }
  EXPECT_EQ(opt.step(), 3);
  std::vector<TensorView> states = opt.States();
  ASSERT_EQ(states.size(), 4u);
  EXPECT_EQ(states[0].name, "optimizer.exp_avg.w");
  EXPECT_EQ(states[3].name, "optimizer.exp_avg_sq.n");
  EXPECT_EQ(states[3].shape, std::vector<int64_t>{2});
  EXPECT_NEAR(states[0].data[1], mw[1], 1e-7);
  EXPECT_NEAR(states[2].data[5], vw[5], 1e-9);
}

TEST(AdamWTest, DecayRule) {
  std::vector<float> x(1);
  EXPECT_TRUE(AdamW::DecaysWeight({"q", {4, 4}, x.data()}));
  EXPECT_FALSE(AdamW::DecaysWeight({"norm", {4}, x.data()}));
}

}  // namespace
}  // namespace loom::engine
