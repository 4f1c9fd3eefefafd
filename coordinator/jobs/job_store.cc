#include "coordinator/jobs/job_store.h"

#include <cstdlib>

#include "absl/strings/cord.h"

namespace loom::coordinator {
namespace {

constexpr char kFencedPayload[] = "type.loom.dev/coordinator.Fenced";

}  // namespace

absl::Status JobStore::PutAll(const std::vector<const loom::v1::Job*>& jobs) {
  JobWrite write;
  write.jobs = jobs;
  return Write(write);
}

absl::Status JobStore::Put(const loom::v1::Job& job) { return PutAll({&job}); }

int64_t JobIdSequence(const std::string& id) {
  return std::atoll(id.substr(id.find_last_of('-') + 1).c_str());
}

absl::Status FencedError(const std::string& message) {
  absl::Status status = absl::FailedPreconditionError(message);
  status.SetPayload(kFencedPayload, absl::Cord("fenced"));
  return status;
}

bool IsFenced(const absl::Status& status) {
  return status.GetPayload(kFencedPayload).has_value();
}

}  // namespace loom::coordinator
