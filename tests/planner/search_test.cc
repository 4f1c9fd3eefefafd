// Layout search: every enumerated layout obeys the rules and every layout
// that obeys them is enumerated (checked against a brute force over all
// axis values), fixed axes hold, out-of-memory layouts are rejected with a
// reason, the rest come out fastest first.
#include "planner/search.h"

#include <set>
#include <tuple>

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

Workload Model(int64_t layers = 32, int64_t heads = 32, int64_t kv = 8) {
  ModelShape m;
  m.name = "test-8b";
  m.vocab_size = 128256;
  m.hidden_size = 4096;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = kv;
  m.ffn_hidden_size = 14336;
  return MakeWorkload(m, 4096, 256, RecipeKind::kBf16Fp32Accum);
}

ClusterSpec H100(int64_t nodes) {
  ClusterSpec c = *ClusterPreset("h100-sxm");
  c.nodes = nodes;
  return c;
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int64_t, int>;

Key KeyOf(const Layout& l) {
  return {l.dp, l.tp, l.pp, l.cp, l.zero_stage, l.micro_batch_size, static_cast<int>(l.recompute)};
}

TEST(Enumerate, MatchesBruteForce) {
  const Workload w = Model(30, 24, 8);  // 30 layers, 24 heads: not powers of two
  const ClusterSpec c = H100(2);       // 16 ranks
  SearchSpace s;
  std::set<Key> got;
  for (const Layout& l : EnumerateLayouts(w, c, s)) {
    EXPECT_TRUE(ValidateLayout(w, c, l, s).ok()) << LayoutToString(l);
    EXPECT_EQ(l.sequence_parallel, l.tp > 1);
    EXPECT_TRUE(got.insert(KeyOf(l)).second) << "duplicate " << LayoutToString(l);
  }
  std::set<Key> want;
  for (int64_t tp = 1; tp <= 16; ++tp)
    for (int64_t cp = 1; cp <= 16; ++cp)
      for (int64_t pp = 1; pp <= 16; ++pp)
        for (int64_t dp = 1; dp <= 16; ++dp) {
          if (dp * tp * pp * cp != 16) continue;
          if (24 % tp || (8 % tp && tp % 8) || 14336 % tp || tp > 8) continue;
          if (cp > 1 && 4096 % (2 * cp)) continue;
          if (30 % pp) continue;
          for (int64_t mbs = 1; mbs <= 256; ++mbs) {
            if (256 % (dp * mbs)) continue;
            for (int z = 0; z <= 3; ++z) {
              if (dp * cp == 1 && z > 0) continue;
              for (int rc = 0; rc < 3; ++rc) want.insert(Key{dp, tp, pp, cp, z, mbs, rc});
            }
          }
        }
  EXPECT_EQ(got, want);
  EXPECT_GT(want.size(), 100u);
}

TEST(Enumerate, FixedAxesHold) {
  SearchSpace s;
  s.tp = 4;
  s.pp = 2;
  s.zero_stage = 1;
  s.micro_batch_size = 2;
  s.recompute = spec::Recompute::kSelective;
  s.sequence_parallel = false;
  const std::vector<Layout> layouts = EnumerateLayouts(Model(), H100(4), s);
  ASSERT_FALSE(layouts.empty());
  for (const Layout& l : layouts) {
    EXPECT_EQ(l.tp, 4);
    EXPECT_EQ(l.pp, 2);
    EXPECT_EQ(l.zero_stage, 1);
    EXPECT_EQ(l.micro_batch_size, 2);
    EXPECT_EQ(l.recompute, spec::Recompute::kSelective);
    EXPECT_FALSE(l.sequence_parallel);
    EXPECT_EQ(l.dp * l.cp, 4);
    EXPECT_EQ(l.micro_batch_size * l.grad_accum * l.dp, 256);
  }
}

// What `parallelism: auto` searches: every schedule under a pipeline and
// sequence parallelism on and off under TP, each layout valid; the
// accept hook drops what it refuses.
TEST(Enumerate, SearchSchedulesCoversEverySchedule) {
  SearchSpace s;
  s.tp = 2;
  s.pp = 2;
  s.cp = 1;
  s.ep = 1;
  s.search_schedules = true;
  std::set<std::pair<spec::Schedule, bool>> seen;
  for (const Layout& l : EnumerateLayouts(Model(), H100(1), s)) {
    EXPECT_TRUE(ValidateLayout(Model(), H100(1), l).ok()) << LayoutToString(l);
    EXPECT_EQ(l.virtual_stages, l.schedule == spec::Schedule::kInterleaved ? 2 : 1);
    seen.insert({l.schedule, l.sequence_parallel});
  }
  EXPECT_EQ(seen.size(), 6u);  // 3 schedules x sequence parallelism on/off
  s.accept = [](const Layout& l) { return l.schedule != spec::Schedule::kAfab; };
  for (const Layout& l : EnumerateLayouts(Model(), H100(1), s)) {
    EXPECT_NE(l.schedule, spec::Schedule::kAfab);
  }
}

TEST(Validate, NamesTheFieldAndRule) {
  const Workload w = Model();
  const ClusterSpec c = H100(1);
  Layout l;
  l.dp = 8;
  l.grad_accum = 32;
  EXPECT_TRUE(ValidateLayout(w, c, l).ok());
  Layout bad = l;
  bad.tp = 3;
  bad.dp = 1;
  absl::Status st = ValidateLayout(w, c, bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("parallelism.tp=3"), std::string::npos) << st;
  EXPECT_NE(st.message().find("num_heads"), std::string::npos) << st;
  bad = l;
  bad.pp = 3;
  bad.dp = 1;
  EXPECT_NE(ValidateLayout(w, c, bad).message().find("parallelism.pp=3"), std::string::npos);
  bad = l;
  bad.dp = 4;
  EXPECT_NE(ValidateLayout(w, c, bad).message().find("must equal the 8 ranks"), std::string::npos);
  bad = l;
  bad.grad_accum = 3;
  EXPECT_NE(ValidateLayout(w, c, bad).message().find("train.global_batch_size"), std::string::npos);
  bad = l;
  bad.dp = 1;
  bad.tp = 16;
  bad.grad_accum = 256;
  EXPECT_NE(ValidateLayout(w, H100(2), bad).message().find("inside a node"), std::string::npos);
  // The rulebook's rules on the layout's own numbers (common/spec/job_spec_rules.h).
  bad = l;
  bad.zero_stage = 4;
  EXPECT_NE(ValidateLayout(w, c, bad).message().find("parallelism.zero_stage=4 must be 0, 1, 2"),
            std::string::npos);
  bad = l;
  bad.dp = 4;
  bad.pp = 2;
  bad.grad_accum = 64;
  bad.schedule = spec::Schedule::kInterleaved;
  EXPECT_NE(ValidateLayout(w, c, bad).message().find("parallelism.virtual_stages=1 must be"),
            std::string::npos);
  bad.virtual_stages = 2;
  EXPECT_TRUE(ValidateLayout(w, c, bad).ok()) << ValidateLayout(w, c, bad);
  bad.micro_batch_size = 4;
  bad.grad_accum = 16;
  EXPECT_TRUE(ValidateLayout(w, c, bad).ok());
  bad.dp = 8;
  bad.pp = 1;
  bad.micro_batch_size = 3;  // 256 sequences do not split into micro-batches of 3 over dp 8
  bad.grad_accum = 10;
  EXPECT_NE(ValidateLayout(w, c, bad).message().find("must be divisible by parallelism.dp=8"),
            std::string::npos);
}

TEST(Plan, RejectsOutOfMemoryAndRanksTheRest) {
  PlanRequest req;
  req.workload = Model();
  req.cluster = H100(1);
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->ranked.empty());
  ASSERT_FALSE(r->rejected.empty());
  EXPECT_EQ(r->layouts_considered, static_cast<int64_t>(r->ranked.size() + r->rejected.size()));
  // Layouts with memory headroom first, then the tight ones; fastest first
  // within each.
  for (size_t i = 1; i < r->ranked.size(); ++i) {
    const Candidate& a = r->ranked[i - 1];
    const Candidate& b = r->ranked[i];
    EXPECT_TRUE(!a.tight || b.tight) << i;
    if (a.tight == b.tight) EXPECT_LE(a.time.total, b.time.total) << i;
  }
  const double headroom = req.space.memory_headroom * req.cluster.memory_bytes;
  for (const Candidate& c : r->ranked) {
    EXPECT_LE(c.memory.total(), req.cluster.memory_bytes);
    EXPECT_EQ(c.tight, c.memory.total() > req.cluster.memory_bytes - headroom);
  }
  for (const Rejection& x : r->rejected) {
    EXPECT_GT(x.memory.total(), req.cluster.memory_bytes);
    EXPECT_NE(x.Reason().find("out of memory"), std::string::npos);
  }
}

// A layout that fits only inside the headroom is chosen only when no layout
// with headroom exists, even when it is predicted faster.
TEST(Plan, PrefersHeadroomOverSpeed) {
  PlanRequest req;
  req.workload = Model();
  req.cluster = H100(1);
  req.space.memory_headroom = 0;
  absl::StatusOr<PlanResult> no_headroom = PlanLayouts(req);
  ASSERT_TRUE(no_headroom.ok()) << no_headroom.status();
  const Candidate fastest = no_headroom->ranked.front();
  EXPECT_FALSE(fastest.tight);
  // A headroom that just makes the fastest layout tight.
  req.space.memory_headroom = 1.0 - fastest.memory.total() / req.cluster.memory_bytes + 1e-9;
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(r->ranked.front().tight) << "the case needs a smaller layout";
  EXPECT_LT(r->ranked.front().memory.total(), fastest.memory.total());
  EXPECT_GT(r->ranked.front().time.total, fastest.time.total);
  // Everything tight: the fastest layout is the answer again.
  req.space.memory_headroom = 1.0;
  absl::StatusOr<PlanResult> all_tight = PlanLayouts(req);
  ASSERT_TRUE(all_tight.ok());
  EXPECT_TRUE(all_tight->ranked.front().tight);
  EXPECT_EQ(all_tight->ranked.front().time.total, fastest.time.total);
}

TEST(Plan, TooBigForTheClusterMeansNothingFits) {
  ModelShape m = Model().model;
  m.num_layers = 400;  // ~200B parameters on one node
  PlanRequest req;
  req.workload = MakeWorkload(m, 4096, 256, RecipeKind::kBf16Fp32Accum);
  req.cluster = H100(1);
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ranked.empty());
  EXPECT_FALSE(r->rejected.empty());
}

TEST(Plan, NoValidLayoutNamesTheFixedAxis) {
  PlanRequest req;
  req.workload = Model();
  req.cluster = H100(1);
  req.space.tp = 5;
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("parallelism.tp=5"), std::string::npos) << r.status();
}

TEST(Plan, MoreMemoryNeverFitsFewerLayouts) {
  PlanRequest req;
  req.workload = Model();
  req.cluster = H100(1);
  const size_t h100 = PlanLayouts(req)->ranked.size();
  req.cluster.memory_bytes *= 1.75;  // H200's 141 GB
  EXPECT_GT(PlanLayouts(req)->ranked.size(), h100);
}

// [moe] A DeepSeek-V3-like model (671B parameters, 37B active: 256 routed
// experts top-8 plus one shared, the first three layers dense; Llama attention
// in place of MLA) on 256 nodes: layouts fit, the fastest splits the experts
// over an ep group, and without ep (experts whole on every rank) it is slower
// or nothing fits at all.
Workload DeepSeekV3Like() {
  ModelShape m;
  m.name = "deepseek-v3-like";
  m.vocab_size = 129280;
  m.hidden_size = 7168;
  m.num_layers = 61;
  m.num_heads = 128;
  m.num_kv_heads = 128;
  m.ffn_hidden_size = 18432;
  m.num_experts = 256;
  m.top_k = 8;
  m.expert_ffn = 2048;
  m.shared_ffn = 2048;
  m.first_dense_layers = 3;
  return MakeWorkload(m, 4096, 4096, RecipeKind::kBf16Fp32Accum);
}

TEST(Plan, MoeModelPrefersExpertParallelism) {
  const Workload w = DeepSeekV3Like();
  EXPECT_NEAR(static_cast<double>(w.params.total), 6.8e11, 0.3e11);
  EXPECT_NEAR(static_cast<double>(w.params.active), 3.9e10, 0.4e10);
  PlanRequest req;
  req.workload = w;
  req.cluster = H100(256);
  req.space.cp = 1;
  req.space.recompute = spec::Recompute::kFull;
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->ranked.empty());
  const Candidate& best = r->ranked.front();
  EXPECT_GT(best.layout.ep, 1) << LayoutToString(best.layout);
  EXPECT_GT(best.time.ep_comm, 0);
  req.space.ep = 1;
  absl::StatusOr<PlanResult> no_ep = PlanLayouts(req);
  if (no_ep.ok() && !no_ep->ranked.empty()) {
    EXPECT_GT(no_ep->ranked.front().time.total, best.time.total);
  }
  req.space.ep = 3;  // 256 experts do not split over 3 ranks
  absl::StatusOr<PlanResult> bad = PlanLayouts(req);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.moe.num_experts=256"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace loom::planner
