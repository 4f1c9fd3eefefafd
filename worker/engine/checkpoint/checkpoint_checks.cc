#include "worker/engine/checkpoint/checkpoint_checks.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_rules.h"

namespace loom::engine {

absl::StatusOr<int64_t> CheckedElementCount(const std::vector<int64_t>& shape,
                                            const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::DataLossError(absl::StrCat(what, ": negative dimension ", d));
    }
    if (d != 0 && n > kMaxCheckpointElements / d) {
      return absl::DataLossError(absl::StrCat(what, ": shape [", absl::StrJoin(shape, ", "),
                                              "] has more than 2^40 elements"));
    }
    n *= d;
  }
  return n;
}

absl::Status CheckCheckpointModel(const spec::ModelSpec& model, const std::string& source) {
  // The spec's rules, applied to the model alone: the rest of the probe spec
  // takes defaults whose rules are not the checkpoint's business.
  spec::JobSpec probe;
  probe.model = model;
  // 0 means "as many as num_heads", as in a spec (the writer stores what the
  // job resolved, but older checkpoints and tests keep the 0).
  if (probe.model.num_kv_heads == 0) probe.model.num_kv_heads = probe.model.num_heads;
  probe.data.format = spec::DataFormat::kBin;  // no text-vocabulary rule
  std::vector<std::string> broken;
  for (std::string& rule : spec::CheckJobSpec(probe)) {
    if (rule.rfind("model.", 0) == 0) broken.push_back(std::move(rule));
  }
  if (broken.empty()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(source, ": corrupt model fields: ", absl::StrJoin(broken, "; ")));
}

bool FitsWithin(int64_t offset, int64_t size, int64_t limit) {
  return offset >= 0 && size >= 0 && offset <= limit && size <= limit - offset;
}

}  // namespace loom::engine
