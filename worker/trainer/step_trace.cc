#include "worker/trainer/step_trace.h"

#include <algorithm>

namespace loom::trainer {
namespace {

int64_t MicrosBetween(absl::Time from, absl::Time to) {
  return std::max<int64_t>(0, absl::ToInt64Microseconds(to - from));
}

// What a string adds to the encoded trace: its tag, length and bytes.
int64_t StringBytes(const std::string& s) { return static_cast<int64_t>(s.size()) + 3; }

}  // namespace

void StepTraceRecorder::BeginStep(int64_t step, bool record, absl::Time now) {
  absl::MutexLock lock(&mu_);
  trace_.Clear();
  tracks_.clear();
  names_.clear();
  open_ = OpenPhase{};
  bytes_ = 0;
  start_ = now;
  if (record) {
    trace_.set_step(step);
    trace_.set_start_unix_us(absl::ToUnixMicros(now));
    // The compute track first, whatever the step does.
    IndexLocked(tracks_, kComputeTrack, trace_.mutable_tracks(), kMaxTraceTracks);
  }
  recording_.store(record, std::memory_order_release);
}

int StepTraceRecorder::IndexLocked(std::map<std::string, int>& index, const std::string& value,
                                   google::protobuf::RepeatedPtrField<std::string>* values,
                                   int max) {
  auto it = index.find(value);
  if (it != index.end()) return it->second;
  if (static_cast<int>(index.size()) >= max || bytes_ + StringBytes(value) > kMaxTraceBytes) {
    return -1;
  }
  const int i = values->size();
  *values->Add() = value;
  bytes_ += StringBytes(value);
  index.emplace(value, i);
  return i;
}

void StepTraceRecorder::AddLocked(int track, int name, absl::Time start, absl::Time end,
                                  int64_t bytes, absl::Duration blocked, int64_t micro_batch,
                                  int64_t chunk) {
  if (track < 0 || name < 0 || trace_.events_size() >= kMaxTraceEvents) {
    trace_.set_dropped_events(trace_.dropped_events() + 1);
    return;
  }
  loom::v1::TraceEvent event;
  event.set_track(track);
  event.set_name(name);
  event.set_start_us(MicrosBetween(start_, start));
  event.set_duration_us(MicrosBetween(start, end));
  event.set_bytes(bytes);
  event.set_blocked_us(std::max<int64_t>(0, absl::ToInt64Microseconds(blocked)));
  event.set_micro_batch(static_cast<int32_t>(micro_batch));
  event.set_chunk(static_cast<int32_t>(chunk));
  const int64_t size = static_cast<int64_t>(event.ByteSizeLong()) + 3;
  if (bytes_ + size > kMaxTraceBytes) {
    trace_.set_dropped_events(trace_.dropped_events() + 1);
    return;
  }
  bytes_ += size;
  *trace_.add_events() = std::move(event);
}

void StepTraceRecorder::ClosePhaseLocked(absl::Time now) {
  if (open_.name < 0) return;
  AddLocked(0, open_.name, open_.since, now, 0, absl::ZeroDuration(), open_.micro_batch,
            open_.chunk);
  open_ = OpenPhase{};
}

void StepTraceRecorder::Phase(const char* phase, int64_t micro_batch, int64_t chunk,
                              absl::Time now) {
  if (!recording_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&mu_);
  ClosePhaseLocked(now);
  const int name = IndexLocked(names_, phase, trace_.mutable_names(), kMaxTraceNames);
  if (name < 0) {
    trace_.set_dropped_events(trace_.dropped_events() + 1);
    return;
  }
  open_ = OpenPhase{name, micro_batch, chunk, now};
}

void StepTraceRecorder::Collective(const std::string& group, const char* op, absl::Time entered,
                                   absl::Duration blocked, int64_t bytes, absl::Time now) {
  if (!recording_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&mu_);
  const int track = IndexLocked(tracks_, group, trace_.mutable_tracks(), kMaxTraceTracks);
  const int name = IndexLocked(names_, op, trace_.mutable_names(), kMaxTraceNames);
  AddLocked(track, name, std::max(entered, start_), now, bytes, blocked, -1, 0);
}

std::optional<loom::v1::StepTrace> StepTraceRecorder::Finish(int64_t step, absl::Time now) {
  if (!recording_.exchange(false, std::memory_order_acq_rel)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (trace_.step() != step) return std::nullopt;  // a step that was not the one begun
  ClosePhaseLocked(now);
  trace_.set_end_us(MicrosBetween(start_, now));
  loom::v1::StepTrace out = std::move(trace_);
  trace_.Clear();
  return out;
}

}  // namespace loom::trainer
