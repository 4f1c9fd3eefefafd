#include "coordinator/jobs/watch_hub.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::coordinator {

loom::v1::Job WatchHub::WatchView(const loom::v1::Job& job) {
  loom::v1::Job view = job;
  view.clear_spec_yaml();
  view.clear_resolved_spec_yaml();
  view.clear_store_namespace();
  view.clear_placement();
  return view;
}

absl::StatusOr<int64_t> WatchHub::Subscribe(const std::string& job_id,
                                            loom::v1::WatchJobResponse snapshot, bool ended,
                                            std::shared_ptr<WatchSink> sink) {
  Entry& entry = jobs_[job_id];
  if (!ended && static_cast<int64_t>(entry.watchers.size()) >= max_watchers_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id, " already has ", entry.watchers.size(), " watchers (at most ",
        max_watchers_, ", --max_watchers_per_job)"));
  }
  for (const loom::v1::JobProgress& step : entry.steps) *snapshot.add_backlog() = step;
  sink->Push(snapshot, ended);
  if (ended) return int64_t{0};
  const int64_t handle = next_handle_++;
  entry.watchers[handle] = std::move(sink);
  return handle;
}

void WatchHub::Unsubscribe(const std::string& job_id, int64_t handle) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second.watchers.erase(handle);
}

void WatchHub::Push(const std::string& job_id, const loom::v1::WatchJobResponse& update,
                    bool last) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  for (auto& [handle, sink] : it->second.watchers) sink->Push(update, last);
  if (last) it->second.watchers.clear();
}

size_t WatchHub::Watchers(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.watchers.size();
}

void WatchHub::AddStep(const std::string& job_id, const loom::v1::JobProgress& step) {
  Entry& entry = jobs_[job_id];
  entry.steps.push_back(step);
  while (entry.steps.size() > backlog_steps_) {
    entry.steps.pop_front();
    ++entry.first;
  }
}

const std::deque<loom::v1::JobProgress>* WatchHub::Steps(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second.steps;
}

UnstoredSteps WatchHub::Unstored(const std::string& job_id) const {
  UnstoredSteps unstored;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return unstored;
  const Entry& entry = it->second;
  const int64_t end = entry.first + static_cast<int64_t>(entry.steps.size());
  unstored.through = end;
  unstored.keep_chunks_from = entry.first / kStepsPerChunk;
  if (entry.stored >= end) return unstored;
  // Whole chunks from the one holding the first unstored step; a chunk's
  // steps that fell out of the bound are no longer there to write.
  for (int64_t chunk = std::max(entry.stored, entry.first) / kStepsPerChunk;
       chunk * kStepsPerChunk < end; ++chunk) {
    StepChunk& out = unstored.chunks.emplace_back();
    out.job_id = job_id;
    out.index = chunk;
    const int64_t from = std::max(chunk * kStepsPerChunk, entry.first);
    const int64_t to = std::min((chunk + 1) * kStepsPerChunk, end);
    for (int64_t n = from; n < to; ++n) *out.steps.add_steps() = entry.steps[n - entry.first];
  }
  return unstored;
}

void WatchHub::StepsStored(const std::string& job_id, int64_t through) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second.stored = std::max(it->second.stored, through);
}

void WatchHub::Restore(const std::string& job_id, StoredSteps stored) {
  Entry& entry = jobs_[job_id];
  // The store keeps whole chunks, a little more than the bound; the series'
  // numbering goes on where it left off, so new steps land in the right chunk.
  const int64_t count = static_cast<int64_t>(stored.steps.size());
  const int64_t dropped = std::max<int64_t>(0, count - static_cast<int64_t>(backlog_steps_));
  entry.steps.assign(std::make_move_iterator(stored.steps.begin() + dropped),
                     std::make_move_iterator(stored.steps.end()));
  entry.first = stored.first + dropped;
  entry.stored = stored.first + count;
}

void WatchHub::Forget(const std::string& job_id) { jobs_.erase(job_id); }

}  // namespace loom::coordinator
