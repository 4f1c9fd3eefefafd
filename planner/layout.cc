// Labels of layouts, the workload constructor and its snapshot copies.
#include "planner/layout.h"

#include "absl/strings/str_cat.h"
#include "common/snapshot_generations.h"

namespace loom::planner {

const char* ScheduleLabel(spec::Schedule schedule) {
  switch (schedule) {
    case spec::Schedule::kAfab:
      return "afab";
    case spec::Schedule::k1F1B:
      return "1f1b";
    case spec::Schedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

const char* RecomputeLabel(spec::Recompute recompute) {
  switch (recompute) {
    case spec::Recompute::kNone:
      return "none";
    case spec::Recompute::kSelective:
      return "selective";
    case spec::Recompute::kFull:
      return "full";
  }
  return "?";
}

std::string LayoutToString(const Layout& l) {
  std::string s = absl::StrCat("dp=", l.dp, " tp=", l.tp, " pp=", l.pp, " cp=", l.cp, " ep=", l.ep,
                               " zero=", l.zero_stage, " mbs=", l.micro_batch_size,
                               " gas=", l.grad_accum, " ", ScheduleLabel(l.schedule));
  if (l.schedule == spec::Schedule::kInterleaved) absl::StrAppend(&s, "x", l.virtual_stages);
  if (l.sequence_parallel) absl::StrAppend(&s, " sp");
  absl::StrAppend(&s, " recompute=", RecomputeLabel(l.recompute));
  return s;
}

Workload MakeWorkload(const ModelShape& model, int64_t seq_len, int64_t global_batch,
                      RecipeKind recipe) {
  Workload w;
  w.model = model;
  w.params = CountParams(model);
  w.seq_len = seq_len;
  w.global_batch = global_batch;
  w.recipe = recipe;
  return w;
}

int64_t SnapshotCopies(int64_t snapshot_interval) {
  // Its own generations and its ward's (common/snapshot_generations.h).
  constexpr int64_t kCopies = kOwnSnapshotGenerations + kWardSnapshotGenerations;
  return snapshot_interval > 0 ? kCopies : 0;
}

}  // namespace loom::planner
