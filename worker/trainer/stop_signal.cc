#include "worker/trainer/stop_signal.h"

#include <signal.h>

#include <atomic>

namespace loom::trainer {
namespace {

// Lock-free, so the handler may set it.
std::atomic<bool> g_stop_signalled{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void OnStopSignal(int) { g_stop_signalled.store(true, std::memory_order_relaxed); }

}  // namespace

void InstallStopSignal() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
}

bool StopSignalled() { return g_stop_signalled.load(std::memory_order_relaxed); }

}  // namespace loom::trainer
