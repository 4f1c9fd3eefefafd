// Rendering of plans for people (`loomctl plan`) and programs
// (`--format=json`): the best layout and the runners-up with memory
// breakdown, predicted step time, tokens/s, MFU and bubble, and the closest
// out-of-memory rejections with their reasons.
#pragma once

#include <string>

#include "planner/search.h"
#include "nlohmann/json.hpp"

namespace loom::planner {

struct RenderOptions {
  int runners_up = 4;   // candidates shown after the best
  int rejections = 3;   // out-of-memory layouts shown (those closest to fitting)
};

std::string RenderPlanText(const PlanRequest& request, const PlanResult& result,
                           const RenderOptions& options = {});

// {"workload":{...},"cluster":{...},"layouts_considered":N,"fit":N,
//  "out_of_memory":N,"best":{...},"runners_up":[...],"rejected":[...]}
// Bytes are in bytes, times in seconds, fractions in [0,1].
nlohmann::json PlanToJson(const PlanRequest& request, const PlanResult& result,
                          const RenderOptions& options = {});

nlohmann::json LayoutToJson(const Layout& layout);
nlohmann::json MemoryToJson(const MemoryBreakdown& memory);
nlohmann::json StepTimeToJson(const StepTime& time);
nlohmann::json CandidateToJson(const Candidate& candidate);

// "dp8 tp2 pp1 cp1 mbs2 z1" (+ " sp", " rc=full", " 1f1b"/"afab"/"il2" when pp>1).
std::string CompactLayout(const Layout& layout);

}  // namespace loom::planner
