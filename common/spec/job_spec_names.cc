// Names of the spec's enums as they are written in YAML.
#include "common/spec/job_spec.h"
#include "common/spec/precision_recipe.h"

namespace loom::spec {

const char* PrecisionName(Precision p) {
  return RecipeOf(p).name.data();  // a literal: NUL-terminated
}

const char* RouterScoreName(RouterScoreKind k) {
  return k == RouterScoreKind::kSoftmax ? "softmax" : "sigmoid";
}

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kAfab: return "afab";
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
  }
  return "?";
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

const char* StragglerActionName(StragglerAction a) {
  switch (a) {
    case StragglerAction::kReport: return "report";
    case StragglerAction::kReplace: return "replace";
  }
  return "?";
}

const char* LrScheduleName(LrSchedule s) {
  switch (s) {
    case LrSchedule::kCosine: return "cosine";
    case LrSchedule::kLinear: return "linear";
    case LrSchedule::kConstant: return "constant";
  }
  return "?";
}

const char* DataFormatName(DataFormat f) { return f == DataFormat::kText ? "text" : "bin"; }

const char* DeviceKindName(DeviceKind d) { return d == DeviceKind::kCpu ? "cpu" : "gpu"; }

}  // namespace loom::spec
