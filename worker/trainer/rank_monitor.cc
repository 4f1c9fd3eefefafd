#include "worker/trainer/rank_monitor.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"

namespace loom::trainer {

void PhaseBoard::Set(const std::string& phase, int micro_batch, int chunk) {
  absl::MutexLock lock(&mu_);
  if (current_.phase == phase && current_.micro_batch == micro_batch && current_.chunk == chunk) {
    return;
  }
  current_.phase = phase;
  current_.micro_batch = micro_batch;
  current_.chunk = chunk;
  current_.since = absl::Now();
}

void PhaseBoard::SetStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  current_.step = step;
}

PhaseBoard::Snapshot PhaseBoard::Get() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

RankMonitor::RankMonitor(RankMonitorOptions options, ProgressSink* reporter,
                         const PhaseBoard* board, std::vector<comm::Communicator*> groups)
    : options_(options),
      reporter_(reporter),
      board_(board),
      groups_(std::move(groups)),
      thread_([this] { Run(); }) {}

RankMonitor::~RankMonitor() {
  stop_.Notify();
  thread_.join();
}

void RankMonitor::Run() {
  while (!stop_.WaitForNotificationWithTimeout(options_.report_interval)) {
    const absl::Time now = absl::Now();
    const PhaseBoard::Snapshot phase = board_->Get();
    loom::v1::RankProgress report;
    report.set_phase(phase.phase);
    report.set_step(phase.step);
    report.set_micro_batch(phase.micro_batch);
    report.set_chunk(phase.chunk);
    report.set_phase_since_unix_ms(absl::ToUnixMillis(phase.since));
    for (comm::Communicator* group : groups_) {
      const comm::CommProgress progress = group->Progress();
      loom::v1::GroupProgress* g = report.add_groups();
      g->set_group(group->name());
      g->set_issued(progress.issued);
      g->set_completed(progress.completed);
      g->set_current_op(progress.current_op);
      if (!progress.current_op.empty()) {
        g->set_current_since_unix_ms(absl::ToUnixMillis(progress.current_since));
        // The communicator times its own operations out; this is the
        // backstop for one that does not come back (a wedged transport).
        if (now - progress.current_since > options_.collective_timeout + options_.watchdog_grace) {
          const std::string why =
              absl::StrCat("watchdog: ", progress.current_op, " on group ", group->name(),
                           " has run for ", absl::FormatDuration(now - progress.current_since),
                           ", past the collective timeout of ",
                           absl::FormatDuration(options_.collective_timeout));
          std::fprintf(stderr, "loom-trainer: %s; aborting\n", why.c_str());
          for (comm::Communicator* other : groups_) other->Abort(why);
          reporter_->Report(report);
          reporter_->Flush(absl::Seconds(2));
          std::fflush(stderr);
          _exit(kExitCollectiveTimeout);
        }
      }
    }
    reporter_->Report(std::move(report));
  }
}

}  // namespace loom::trainer
