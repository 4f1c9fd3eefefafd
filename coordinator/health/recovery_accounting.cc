#include "coordinator/health/recovery_accounting.h"

#include <algorithm>

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::RecoveryIncident;

namespace {

// Boundary i (0 = cause ... 6 = first step) of an incident.
constexpr int kBoundaries = kRecoveryPhaseCount + 1;
constexpr size_t kMaxReasonBytes = 512;

int64_t Boundary(const RecoveryIncident& in, int i) {
  switch (i) {
    case 0: return in.cause_unix_us();
    case 1: return in.declared_unix_us();
    case 2: return in.stopped_unix_us();
    case 3: return in.placed_unix_us();
    case 4: return in.ready_unix_us();
    case 5: return in.resumed_unix_us();
    default: return in.first_step_unix_us();
  }
}

void SetBoundary(RecoveryIncident& in, int i, int64_t us) {
  switch (i) {
    case 0: in.set_cause_unix_us(us); break;
    case 1: in.set_declared_unix_us(us); break;
    case 2: in.set_stopped_unix_us(us); break;
    case 3: in.set_placed_unix_us(us); break;
    case 4: in.set_ready_unix_us(us); break;
    case 5: in.set_resumed_unix_us(us); break;
    default: in.set_first_step_unix_us(us); break;
  }
}

void SetPhase(RecoveryIncident& in, int phase, double seconds) {
  switch (phase) {
    case 0: in.set_detection_seconds(seconds); break;
    case 1: in.set_stopping_seconds(seconds); break;
    case 2: in.set_placement_seconds(seconds); break;
    case 3: in.set_rendezvous_seconds(seconds); break;
    case 4: in.set_checkpoint_load_seconds(seconds); break;
    default: in.set_first_step_seconds(seconds); break;
  }
}

// Fills the *_seconds fields of the phases whose two boundaries are set, and
// the total from the cause to the last boundary set.
void Recompute(RecoveryIncident& in) {
  int64_t last = in.cause_unix_us();
  for (int p = 0; p < kRecoveryPhaseCount; ++p) {
    const int64_t from = Boundary(in, p);
    const int64_t to = Boundary(in, p + 1);
    if (from != 0 && to != 0) SetPhase(in, p, static_cast<double>(to - from) / 1e6);
    if (to != 0) last = to;
  }
  in.set_total_seconds(static_cast<double>(last - in.cause_unix_us()) / 1e6);
}

RecoveryIncident* OpenOne(Job& job) {
  if (job.incidents_size() == 0) return nullptr;
  RecoveryIncident* last = job.mutable_incidents(job.incidents_size() - 1);
  return last->closed() ? nullptr : last;
}

bool AllSet(const RecoveryIncident& in) {
  for (int b = 0; b < kBoundaries; ++b) {
    if (Boundary(in, b) == 0) return false;
  }
  return true;
}

// Sets boundary i once. The boundaries set stay in order: this one is at
// least every earlier one set, and later ones set already are at least it.
std::optional<RecoveryIncident> Mark(Job& job, int i, absl::Time at) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr || Boundary(*in, i) != 0) return std::nullopt;
  int64_t value = absl::ToUnixMicros(at);
  for (int b = 0; b < i; ++b) value = std::max(value, Boundary(*in, b));
  SetBoundary(*in, i, value);
  for (int b = i + 1; b < kBoundaries; ++b) {
    if (Boundary(*in, b) != 0 && Boundary(*in, b) < value) SetBoundary(*in, b, value);
  }
  Recompute(*in);
  if (!AllSet(*in)) return std::nullopt;
  in->set_complete(true);
  in->set_closed(true);
  return *in;
}

}  // namespace

std::optional<RecoveryIncident> CloseIncident(Job& job, absl::Time at) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return std::nullopt;
  in->set_closed(true);
  Recompute(*in);
  // Cut short: the time until now still counts in the total.
  int64_t last = in->cause_unix_us();
  for (int b = 1; b < kBoundaries; ++b) last = std::max(last, Boundary(*in, b));
  in->set_total_seconds(
      static_cast<double>(std::max(last, absl::ToUnixMicros(at)) - in->cause_unix_us()) / 1e6);
  return *in;
}

std::optional<RecoveryIncident> OpenIncident(Job& job, const std::string& kind, int32_t rank,
                                             const std::string& node_id, const std::string& reason,
                                             absl::Time cause, absl::Time declared) {
  std::optional<RecoveryIncident> cut = CloseIncident(job, declared);
  RecoveryIncident& in = *job.add_incidents();
  in.set_kind(kind);
  in.set_rank(rank);
  in.set_node_id(node_id);
  in.set_failed_attempt(job.attempt());
  // The first line, bounded: the full reason is in the job's history.
  in.set_reason(reason.substr(0, std::min<size_t>(reason.find('\n'), kMaxReasonBytes)));
  const int64_t declared_us = absl::ToUnixMicros(declared);
  in.set_cause_unix_us(std::min(absl::ToUnixMicros(cause), declared_us));
  in.set_declared_unix_us(declared_us);
  Recompute(in);
  if (job.incidents_size() > kMaxIncidents) {
    job.mutable_incidents()->DeleteSubrange(0, job.incidents_size() - kMaxIncidents);
  }
  return cut;
}

std::optional<RecoveryIncident> MarkStopped(Job& job, absl::Time at) { return Mark(job, 2, at); }
std::optional<RecoveryIncident> MarkPlaced(Job& job, absl::Time at) { return Mark(job, 3, at); }
std::optional<RecoveryIncident> MarkReady(Job& job, absl::Time at) { return Mark(job, 4, at); }
std::optional<RecoveryIncident> MarkResumed(Job& job, absl::Time at) { return Mark(job, 5, at); }

std::optional<RecoveryIncident> MarkFirstStep(Job& job, absl::Time at, int64_t resumed_step) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return std::nullopt;
  in->set_resumed_step(resumed_step);
  return Mark(job, 6, at);
}

std::vector<std::pair<int, double>> MeasuredPhases(const RecoveryIncident& in) {
  std::vector<std::pair<int, double>> phases;
  for (int p = 0; p < kRecoveryPhaseCount; ++p) {
    if (Boundary(in, p) == 0 || Boundary(in, p + 1) == 0) continue;
    phases.emplace_back(p, static_cast<double>(Boundary(in, p + 1) - Boundary(in, p)) / 1e6);
  }
  return phases;
}

void GoodputTracker::Started(Job& job, absl::Time at) {
  if (job.first_running_unix_ms() == 0) job.set_first_running_unix_ms(absl::ToUnixMillis(at));
}

void GoodputTracker::OnStep(Job& job, int64_t step, double seconds) {
  double counted = job.counted_step_seconds();
  // A step number seen before means the attempt resumed from an older
  // checkpoint: what was done from there on is wasted.
  while (!steps_.empty() && steps_.back().first >= step) {
    counted -= steps_.back().second;
    steps_.pop_back();
  }
  steps_.emplace_back(step, seconds);
  if (steps_.size() > max_steps_) steps_.pop_front();
  job.set_counted_step_seconds(std::max(0.0, counted + seconds));
}

double GoodputTracker::Update(Job& job, absl::Time now) {
  if (job.first_running_unix_ms() == 0) return 0;
  const double wall =
      static_cast<double>(absl::ToUnixMillis(now) - job.first_running_unix_ms()) / 1e3;
  const double goodput = wall > 0 ? std::clamp(job.counted_step_seconds() / wall, 0.0, 1.0) : 0;
  job.set_goodput(goodput);
  return goodput;
}

}  // namespace loom::coordinator
