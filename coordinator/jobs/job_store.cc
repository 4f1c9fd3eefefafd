#include "coordinator/jobs/job_store.h"

#include <cstdlib>

namespace loom::coordinator {

int64_t JobIdSequence(const std::string& id) {
  return std::atoll(id.substr(id.find_last_of('-') + 1).c_str());
}

}  // namespace loom::coordinator
