#include "coordinator/service/plan_service.h"

#include <cstdint>
#include <utility>

#include "coordinator/jobs/layout_proto.h"
#include "planner/job_planner.h"

namespace loom::coordinator {
namespace {

void AddMemory(loom::v1::PlanCandidate& c, const planner::MemoryBreakdown& m) {
  const std::pair<const char*, double> items[] = {
      {"weights", m.weights},           {"gradients", m.gradients},
      {"optimizer", m.optimizer},       {"activations", m.activations},
      {"logits", m.logits},             {"zero3_gathered", m.zero3_gathered},
      {"comm_buffers", m.comm_buffers}, {"overhead", m.overhead}};
  for (const auto& [name, bytes] : items) {
    loom::v1::MemoryItem* item = c.add_memory();
    item->set_name(name);
    item->set_bytes(static_cast<int64_t>(bytes));
  }
  if (m.snapshots_on_device && m.snapshots > 0) {  // a CPU rank's: in its memory
    loom::v1::MemoryItem* item = c.add_memory();
    item->set_name("snapshots");
    item->set_bytes(static_cast<int64_t>(m.snapshots));
  }
  c.set_memory_bytes(static_cast<int64_t>(m.total()));
}

}  // namespace

absl::StatusOr<loom::v1::PlanJobResponse> PlanJob(const loom::v1::PlanJobRequest& request) {
  planner::PlanOptions options;
  options.profile = request.profile();
  options.max_candidates = request.max_candidates();
  absl::StatusOr<planner::JobPlan> plan =
      planner::PlanJobSpec(request.spec_yaml(), request.source_name(), options);
  if (!plan.ok()) return plan.status();
  loom::v1::PlanJobResponse response;
  for (int i = 0; i < plan->shown; ++i) {
    const planner::Candidate& c = plan->result.ranked[i];
    loom::v1::PlanCandidate* out = response.add_candidates();
    *out->mutable_layout() = LayoutToProto(c.layout);
    out->set_fits(true);
    AddMemory(*out, c.memory);
    out->set_host_memory_bytes(static_cast<int64_t>(c.host_bytes_per_node));
    out->set_step_seconds(c.time.total);
    out->set_tokens_per_second(c.time.tokens_per_second);
    out->set_mfu(c.time.mfu);
    out->set_bubble_fraction(c.time.bubble_fraction);
  }
  response.set_layouts_considered(plan->result.layouts_considered);
  response.set_layouts_rejected(static_cast<int64_t>(plan->result.rejected.size()));
  response.set_text(plan->text);
  response.set_json(plan->json.dump(2));
  return response;
}

}  // namespace loom::coordinator
