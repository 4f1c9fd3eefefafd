// Plan and sweep rendering: the text names the best layout and its numbers,
// the JSON carries the same values, the sweep table and SVG have a cell per
// model and node count.
#include "planner/render.h"

#include "absl/strings/str_cat.h"
#include "planner/sweep.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

PlanRequest Request() {
  PlanRequest req;
  req.workload = MakeWorkload(PlaybookModels()[2].shape, 4096, 256, RecipeKind::kBf16Fp32Accum);
  req.cluster = *ClusterPreset("h100-sxm");
  req.cluster.nodes = 2;
  return req;
}

TEST(RenderPlan, TextAndJsonAgree) {
  const PlanRequest req = Request();
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok());
  ASSERT_GE(r->ranked.size(), 5u);
  const std::string text = RenderPlanText(req, *r);
  EXPECT_NE(text.find("Best:"), std::string::npos);
  EXPECT_NE(text.find(LayoutToString(r->ranked[0].layout)), std::string::npos) << text;
  EXPECT_NE(text.find("Runners-up:"), std::string::npos);
  EXPECT_NE(text.find("MFU"), std::string::npos);
  EXPECT_NE(text.find("out of memory"), std::string::npos);

  const nlohmann::json j = PlanToJson(req, *r);
  EXPECT_EQ(j["layouts_considered"], r->layouts_considered);
  EXPECT_EQ(j["best"]["layout"]["dp"], r->ranked[0].layout.dp);
  EXPECT_EQ(j["best"]["layout"]["micro_batch_size"], r->ranked[0].layout.micro_batch_size);
  EXPECT_DOUBLE_EQ(j["best"]["time"]["step_seconds"].get<double>(), r->ranked[0].time.total);
  EXPECT_DOUBLE_EQ(j["best"]["memory"]["total_bytes"].get<double>(), r->ranked[0].memory.total());
  EXPECT_EQ(j["runners_up"].size(), 4u);
  EXPECT_EQ(j["rejected"].size(), 3u);
  EXPECT_NE(j["rejected"][0]["reason"].get<std::string>().find("out of memory"), std::string::npos);
  // The JSON survives a round trip through text.
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
}

TEST(RenderPlan, NothingFits) {
  PlanRequest req = Request();
  req.cluster.nodes = 1;
  req.workload = MakeWorkload(PlaybookModels()[3].shape, 4096, 256, RecipeKind::kBf16Fp32Accum);
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->ranked.empty());
  EXPECT_NE(RenderPlanText(req, *r).find("No layout fits in memory"), std::string::npos);
  EXPECT_TRUE(PlanToJson(req, *r)["best"].is_null());
}

// Long context (issue 15): an 8B Llama-shaped model at 128k tokens on 64
// H100s cannot hold a whole sequence's activations on a rank; the plan picks
// context parallelism and says what it saves against the same ranks as DP.
TEST(RenderPlan, LongContextPicksCpAndExplainsTheMemory) {
  PlanRequest req;
  req.workload = MakeWorkload(PlaybookModels()[2].shape, 131072, 64, RecipeKind::kBf16Fp32Accum);
  req.cluster = *ClusterPreset("h100-sxm");
  req.cluster.nodes = 8;
  absl::StatusOr<PlanResult> r = PlanLayouts(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->ranked.empty());
  const Layout& best = r->ranked[0].layout;
  EXPECT_GT(best.cp, 1) << LayoutToString(best);
  const std::string text = RenderPlanText(req, *r);
  EXPECT_NE(text.find(absl::StrCat("context parallelism: cp=", best.cp)), std::string::npos) << text;
  EXPECT_NE(text.find("GiB saved (cp=1 does not fit the device)"), std::string::npos) << text;
}

TEST(Sweep, TableSvgAndJson) {
  SweepRequest req = PlaybookSweep(*ClusterPreset("h100-sxm"));
  req.node_counts = {1, 8};
  absl::StatusOr<SweepResult> r = RunSweep(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->cells.size(), 8u);
  // 80B cannot train on one node of H100s; 1B can anywhere.
  EXPECT_FALSE(r->cell(3, 0).best.has_value());
  EXPECT_TRUE(r->cell(0, 0).best.has_value());
  EXPECT_TRUE(r->cell(3, 1).best.has_value());
  const std::string table = RenderSweepTable(*r);
  for (const char* label : {"1B", "3B", "8B", "80B", "OOM"}) {
    EXPECT_NE(table.find(label), std::string::npos) << label << "\n" << table;
  }
  const std::string svg = RenderSweepSvg(*r);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t rects = 0;
  for (size_t p = svg.find("<rect"); p != std::string::npos; p = svg.find("<rect", p + 1)) ++rects;
  EXPECT_EQ(rects, 1u + 8u);  // background + one per cell
  const nlohmann::json j = SweepToJson(*r);
  EXPECT_EQ(j["cells"].size(), 8u);
  EXPECT_TRUE(j["cells"][6]["best"].is_null());
}

}  // namespace
}  // namespace loom::planner
