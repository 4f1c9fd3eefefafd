// Prints the CPU engine's measured peak memory per layout beside the
// planner's prediction (docs/planner.md's table), from the committed CSV.
//   build/bin/planner_engine_memory_report [--csv=tools/planner/data/engine_memory.csv]
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "planner/constants.h"
#include "tools/planner/engine_memory.h"

ABSL_FLAG(std::string, csv, LOOM_ENGINE_MEMORY_CSV,
          "measured peaks (planner_engine_memory's output)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace loom::planner;
  absl::StatusOr<std::vector<eval::EngineMemoryCase>> cases =
      eval::LoadEngineMemoryCsv(absl::GetFlag(FLAGS_csv));
  if (!cases.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cases.status().message()).c_str());
    return 1;
  }
  const std::vector<eval::EngineMemoryComparison> rows =
      eval::CompareEngineMemory(*cases, CpuEngineConstants());
  std::fputs(eval::RenderEngineMemoryTable(rows).c_str(), stdout);
  double worst = 0, sum = 0;
  for (const auto& r : rows) {
    worst = std::max(worst, std::abs(r.relative_error));
    sum += std::abs(r.relative_error);
  }
  std::printf("\n%zu layouts: mean |error| %.2f%%, max %.2f%%\n", rows.size(),
              100.0 * sum / rows.size(), 100.0 * worst);
  return 0;
}
