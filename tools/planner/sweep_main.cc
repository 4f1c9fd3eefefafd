// planner_sweep: the playbook grid (1B, 3B, 8B, 80B on 1–64 nodes) planned
// on a cluster preset; prints the table and writes the heatmap as SVG.
//   planner_sweep [--cluster=h100-sxm] [--svg=FILE] [--json]
#include <cstdio>
#include <fstream>
#include <string>

#include "planner/render.h"
#include "planner/sweep.h"

int main(int argc, char** argv) {
  std::string cluster_name = "h100-sxm", svg_path;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--cluster=", 0) == 0) {
      cluster_name = arg.substr(10);
    } else if (arg.rfind("--svg=", 0) == 0) {
      svg_path = arg.substr(6);
    } else if (arg == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: planner_sweep [--cluster=NAME] [--svg=FILE] [--json]\n");
      return 2;
    }
  }
  auto cluster = loom::planner::ClusterPreset(cluster_name);
  if (!cluster.ok()) {
    std::fprintf(stderr, "planner_sweep: %s\n", std::string(cluster.status().message()).c_str());
    return 2;
  }
  auto result = loom::planner::RunSweep(loom::planner::PlaybookSweep(*cluster));
  if (!result.ok()) {
    std::fprintf(stderr, "planner_sweep: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", loom::planner::SweepToJson(*result).dump(2).c_str());
  } else {
    std::fputs(loom::planner::RenderSweepTable(*result).c_str(), stdout);
  }
  if (!svg_path.empty()) {
    std::ofstream out(svg_path);
    out << loom::planner::RenderSweepSvg(*result);
    if (!out) {
      std::fprintf(stderr, "planner_sweep: cannot write %s\n", svg_path.c_str());
      return 1;
    }
  }
  return 0;
}
