#include "coordinator/health/recovery_accounting.h"

#include <algorithm>

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::RecoveryIncident;

namespace {

constexpr size_t kMaxReasonBytes = 512;

// Every boundary an incident can have; each path's timeline is seven of them.
enum Boundary { kCause, kDeclared, kStopped, kAborted, kPlaced, kReady, kResumed, kFirstStep };
constexpr int kTimelineLength = kRecoveryPhaseCount + 1;
using Timeline = std::array<Boundary, kTimelineLength>;
constexpr Timeline kWholeJobTimeline = {kCause,  kDeclared, kStopped,  kPlaced,
                                        kReady,  kResumed,  kFirstStep};
constexpr Timeline kInPlaceTimeline = {kCause,  kDeclared, kAborted,  kPlaced,
                                       kReady,  kResumed,  kFirstStep};
// Each path's phases as indices into kRecoveryPhaseNames.
constexpr std::array<int, kRecoveryPhaseCount> kWholeJobLabels = {0, 1, 2, 3, 4, 5};
constexpr std::array<int, kRecoveryPhaseCount> kInPlaceLabels = {0, 6, 7, 3, 8, 5};

bool InPlace(const RecoveryIncident& in) { return in.path() == kPathInPlace; }
const Timeline& TimelineOf(const RecoveryIncident& in) {
  return InPlace(in) ? kInPlaceTimeline : kWholeJobTimeline;
}

int64_t Get(const RecoveryIncident& in, Boundary b) {
  switch (b) {
    case kCause: return in.cause_unix_us();
    case kDeclared: return in.declared_unix_us();
    case kStopped: return in.stopped_unix_us();
    case kAborted: return in.aborted_unix_us();
    case kPlaced: return in.placed_unix_us();
    case kReady: return in.ready_unix_us();
    case kResumed: return in.resumed_unix_us();
    case kFirstStep: return in.first_step_unix_us();
  }
  return 0;
}

void Set(RecoveryIncident& in, Boundary b, int64_t us) {
  switch (b) {
    case kCause: in.set_cause_unix_us(us); break;
    case kDeclared: in.set_declared_unix_us(us); break;
    case kStopped: in.set_stopped_unix_us(us); break;
    case kAborted: in.set_aborted_unix_us(us); break;
    case kPlaced: in.set_placed_unix_us(us); break;
    case kReady: in.set_ready_unix_us(us); break;
    case kResumed: in.set_resumed_unix_us(us); break;
    case kFirstStep: in.set_first_step_unix_us(us); break;
  }
}

// Phase p of the incident's path (0 = detection ... 5 = first step).
void SetPhase(RecoveryIncident& in, int phase, double seconds) {
  switch (phase) {
    case 0: in.set_detection_seconds(seconds); break;
    case 1:
      if (InPlace(in)) {
        in.set_abort_seconds(seconds);
      } else {
        in.set_stopping_seconds(seconds);
      }
      break;
    case 2: in.set_placement_seconds(seconds); break;
    case 3: in.set_rendezvous_seconds(seconds); break;
    case 4: in.set_checkpoint_load_seconds(seconds); break;
    default: in.set_first_step_seconds(seconds); break;
  }
}

// Fills the *_seconds fields of the path's phases whose two boundaries are
// set (the other path's own phase is not measured: 0), and the total from
// the cause to the last boundary set.
void Recompute(RecoveryIncident& in) {
  if (InPlace(in)) {
    in.set_stopping_seconds(0);
  } else {
    in.set_abort_seconds(0);
  }
  const Timeline& timeline = TimelineOf(in);
  int64_t last = in.cause_unix_us();
  for (int p = 0; p < kRecoveryPhaseCount; ++p) {
    const int64_t from = Get(in, timeline[p]);
    const int64_t to = Get(in, timeline[p + 1]);
    SetPhase(in, p, from != 0 && to != 0 ? static_cast<double>(to - from) / 1e6 : 0);
    if (to != 0) last = to;
  }
  in.set_total_seconds(static_cast<double>(last - in.cause_unix_us()) / 1e6);
}

// The open incident, if any, its newest step brought up to date: reports of
// the failed attempt can still arrive after the declaration (a rank's last
// step travels ahead of its exit, not of another rank's), and every event up
// to the new attempt's first step sees them.
RecoveryIncident* OpenOne(Job& job) {
  if (job.incidents_size() == 0) return nullptr;
  RecoveryIncident* last = job.mutable_incidents(job.incidents_size() - 1);
  if (last->closed()) return nullptr;
  if (job.last_progress().attempt() == last->failed_attempt()) {
    last->set_last_step(std::max(last->last_step(), job.last_progress().step()));
  }
  return last;
}

// Completes the incident when its path's every boundary is set.
std::optional<RecoveryIncident> Settle(RecoveryIncident& in) {
  for (Boundary b : TimelineOf(in)) {
    if (Get(in, b) == 0) return std::nullopt;
  }
  in.set_complete(true);
  in.set_closed(true);
  return in;
}

// Sets boundary b once. The path's boundaries set stay in order: this one is
// at least every earlier one set, and later ones set already are at least it.
// A boundary of the other path (a kill's end on the in-place path) is only
// noted.
std::optional<RecoveryIncident> Mark(Job& job, Boundary b, absl::Time at) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr || Get(*in, b) != 0) return std::nullopt;
  const Timeline& timeline = TimelineOf(*in);
  const int i = static_cast<int>(std::find(timeline.begin(), timeline.end(), b) - timeline.begin());
  int64_t value = std::max(absl::ToUnixMicros(at), in->declared_unix_us());
  if (i == kTimelineLength) {
    Set(*in, b, value);
    return std::nullopt;
  }
  for (int k = 0; k < i; ++k) value = std::max(value, Get(*in, timeline[k]));
  Set(*in, b, value);
  for (int k = i + 1; k < kTimelineLength; ++k) {
    if (Get(*in, timeline[k]) != 0 && Get(*in, timeline[k]) < value) Set(*in, timeline[k], value);
  }
  Recompute(*in);
  return Settle(*in);
}

void SetStepsRecomputed(RecoveryIncident& in) {
  in.set_steps_recomputed(std::max<int64_t>(0, in.last_step() - in.resumed_step()));
}

std::string FirstLine(const std::string& text) {
  return text.substr(0, std::min<size_t>(text.find('\n'), kMaxReasonBytes));
}

}  // namespace

std::optional<RecoveryIncident> CloseIncident(Job& job, absl::Time at) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return std::nullopt;
  in->set_closed(true);
  Recompute(*in);
  // Cut short: the time until now still counts in the total.
  int64_t last = in->cause_unix_us();
  for (Boundary b : TimelineOf(*in)) last = std::max(last, Get(*in, b));
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
  in.set_reason(FirstLine(reason));
  in.set_path(kPathWholeJob);
  in.set_last_step(job.last_progress().step());
  const int64_t declared_us = absl::ToUnixMicros(declared);
  in.set_cause_unix_us(std::min(absl::ToUnixMicros(cause), declared_us));
  in.set_declared_unix_us(declared_us);
  Recompute(in);
  if (job.incidents_size() > kMaxIncidents) {
    job.mutable_incidents()->DeleteSubrange(0, job.incidents_size() - kMaxIncidents);
  }
  return cut;
}

std::optional<RecoveryIncident> MarkInPlace(Job& job, const std::vector<int64_t>& relaunched) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return std::nullopt;
  in->set_path(kPathInPlace);
  in->clear_fallback_reason();
  in->clear_relaunched_ranks();
  for (int64_t rank : relaunched) {
    if (in->relaunched_ranks_size() == kMaxRelaunchedRanksKept) break;
    in->add_relaunched_ranks(static_cast<int32_t>(rank));
  }
  // Nothing was stopped on this path.
  in->set_stopped_unix_us(0);
  Recompute(*in);
  return Settle(*in);
}

std::optional<RecoveryIncident> MarkWholeJob(Job& job, const std::string& fallback_reason) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return std::nullopt;
  in->set_path(kPathWholeJob);
  in->set_fallback_reason(FirstLine(fallback_reason));
  in->clear_relaunched_ranks();
  // The abort that was tried counts in stopping: declared -> every rank exited.
  in->set_aborted_unix_us(0);
  Recompute(*in);
  return Settle(*in);
}

void MarkRestoreStep(Job& job, int64_t restore_step, int64_t newest_step) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return;
  in->set_resumed_step(restore_step);
  in->set_last_step(std::max(in->last_step(), newest_step));
  SetStepsRecomputed(*in);
}

std::optional<RecoveryIncident> MarkAborted(Job& job, absl::Time at) {
  return Mark(job, kAborted, at);
}
std::optional<RecoveryIncident> MarkStopped(Job& job, absl::Time at) {
  return Mark(job, kStopped, at);
}
std::optional<RecoveryIncident> MarkPlaced(Job& job, absl::Time at) {
  return Mark(job, kPlaced, at);
}
std::optional<RecoveryIncident> MarkReady(Job& job, absl::Time at) { return Mark(job, kReady, at); }
std::optional<RecoveryIncident> MarkResumed(Job& job, absl::Time at) {
  return Mark(job, kResumed, at);
}

std::optional<RecoveryIncident> MarkFirstStep(Job& job, absl::Time at, int64_t resumed_step) {
  RecoveryIncident* in = OpenOne(job);
  if (in == nullptr) return std::nullopt;
  in->set_resumed_step(resumed_step);
  SetStepsRecomputed(*in);
  return Mark(job, kFirstStep, at);
}

std::vector<std::pair<int, double>> MeasuredPhases(const RecoveryIncident& in) {
  const Timeline& timeline = TimelineOf(in);
  const auto& labels = InPlace(in) ? kInPlaceLabels : kWholeJobLabels;
  std::vector<std::pair<int, double>> phases;
  for (int p = 0; p < kRecoveryPhaseCount; ++p) {
    const int64_t from = Get(in, timeline[p]);
    const int64_t to = Get(in, timeline[p + 1]);
    if (from == 0 || to == 0) continue;
    phases.emplace_back(labels[p], static_cast<double>(to - from) / 1e6);
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
