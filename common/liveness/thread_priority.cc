#include "common/liveness/thread_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loom::liveness {

bool RaiseThisThread() {
  // On Linux, PRIO_PROCESS with a thread id sets that thread alone.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  return setpriority(PRIO_PROCESS, tid, kLivenessNice) == 0;
}

}  // namespace loom::liveness
