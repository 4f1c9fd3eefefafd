#include "worker/comm/background_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loom::comm {

bool LowerThisThreadToBackground() {
  // PRIO_PROCESS with a thread id sets that thread alone on Linux.
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  return ::setpriority(PRIO_PROCESS, tid, kBackgroundNice) == 0;
}

}  // namespace loom::comm
