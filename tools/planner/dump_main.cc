// planner_dump: one CSV line per measured run with the planner's predictions
// beside the measurement, for offline analysis (tools/planner/fit.py).
//   planner_dump [--data=DIR] [--set=NAME=VALUE ...] > predictions.csv
// Playbook runs use nanotron's profile (--set overrides it), vTrain's the
// Megatron profile built on it.
#include <cstdio>
#include <string>

#include "planner/constants.h"
#include "tools/planner/constant_table.h"
#include "tools/planner/measured_runs.h"

namespace lp = loom::planner;

int main(int argc, char** argv) {
  std::string dir = LOOM_MEASURED_RUNS_DIR;
  lp::PlannerConstants base = lp::NanotronConstants();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--data=", 0) == 0) {
      dir = arg.substr(7);
    } else if (arg.rfind("--set=", 0) == 0) {
      if (absl::Status s = lp::eval::SetConstant(arg.substr(6), &base); !s.ok()) {
        std::fprintf(stderr, "planner_dump: %s\n", std::string(s.message()).c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: planner_dump [--data=DIR] [--set=NAME=VALUE]\n");
      return 2;
    }
  }
  auto runs = lp::eval::LoadRuns(dir);
  if (!runs.ok()) {
    std::fprintf(stderr, "planner_dump: %s\n", std::string(runs.status().message()).c_str());
    return 1;
  }
  lp::PlannerConstants k = base;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::printf("set,model,nodes,dp,tp,pp,mbs,gas,zero,ok,measured_tok_s_gpu,measured_mem_gb,measured_s,"
              "pred_mem_gib,weights,gradients,optimizer,activations,logits,buffers,"
              "pred_s,compute,tp_comm,pp_comm,bubble,dp_comm,optimizer_s,pred_tok_s_gpu,pred_mem_stage0_gib\n");
  auto line = [&](const char* set, const std::string& model, int64_t nodes, const lp::Workload& w,
                  const lp::Layout& l, const lp::ClusterSpec& c, bool ok, double tok, double mem,
                  double secs) {
    const lp::MemoryBreakdown m = lp::EstimateMemory(w, l, k);
    const lp::StepTime t = lp::EstimateStepTime(w, l, c, k);
    const double first_stage = lp::EstimateStageMemory(w, l, k, 0).total();
    std::printf("%s,%s,%ld,%ld,%ld,%ld,%ld,%ld,%d,%d,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g,%g\n",
                set, model.c_str(), nodes, l.dp, l.tp, l.pp, l.micro_batch_size, l.grad_accum,
                l.zero_stage, ok ? 1 : 0, tok, mem, secs, m.total() / kGiB, m.weights / kGiB,
                m.gradients / kGiB, m.optimizer / kGiB, m.activations / kGiB, m.logits / kGiB,
                m.comm_buffers / kGiB, t.total, t.compute, t.tp_comm, t.pp_comm, t.bubble,
                t.dp_comm, t.optimizer, t.tokens_per_second_per_device, first_stage / kGiB);
  };
  for (const auto& r : runs->playbook) {
    const double secs = r.ok ? r.dp * r.mbs * r.gas * 4096.0 / (r.tok_s_gpu * r.nodes * 8) : 0;
    k = lp::eval::PlaybookConstants(base);
    line("playbook", r.model, r.nodes, lp::eval::PlaybookWorkload(r), lp::eval::PlaybookLayout(r),
         lp::eval::PlaybookCluster(r), r.ok, r.tok_s_gpu, r.mem_gb, secs);
  }
  for (const auto& r : runs->vtrain) {
    k = lp::MegatronConstants(base);
    const lp::ClusterSpec c = lp::eval::VtrainCluster(r);
    line(r.multi ? "vtrain-multi" : "vtrain-single", std::to_string(r.hidden), c.nodes,
         lp::eval::VtrainWorkload(r), lp::eval::VtrainLayout(r), c, true, 0, 0, r.iteration_ms / 1e3);
  }
  return 0;
}
