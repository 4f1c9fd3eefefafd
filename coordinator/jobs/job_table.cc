#include "coordinator/jobs/job_table.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text/safe_text.h"
#include "coordinator/auth/policy.h"
#include "coordinator/jobs/job_states.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

namespace {

// What ListJobs shows of a job: everything but the parts that grow with the
// spec and the restarts (GetJob has those; the placement is never in the
// record's Job).
Job Summary(Job job) {
  job.clear_spec_yaml();
  job.clear_resolved_spec_yaml();
  job.clear_incidents();
  job.clear_store_namespace();
  if (job.history_size() > 1) job.mutable_history()->DeleteSubrange(0, job.history_size() - 1);
  return job;
}

}  // namespace

JobTable::JobTable(JobTableOptions options, JobPersister* persister, WatchHub* hub)
    : options_(std::move(options)), persister_(persister), hub_(hub) {}

absl::Status JobTable::NotFound(const std::string& id) {
  return auth::JobNotFound(id);  // the same answer as for another owner's job
}

JobRecord* JobTable::FindLocked(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobRecord* JobTable::FindLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::string JobTable::NewIdLocked(int64_t* sequence) {
  *sequence = next_sequence_++;
  if (options_.job_id_prefix.empty()) return absl::StrFormat("job-%06d", *sequence);
  return absl::StrFormat("job-%s-%06d", options_.job_id_prefix, *sequence);
}

JobRecord& JobTable::InsertLocked(JobRecord record) {
  const std::string id = record.job.id();
  record.stored = std::make_shared<const Job>(record.job);
  record.stored_placement = record.placement;
  record.version = record.stored_version = 0;
  // Jobs arrive in sequence order (admission takes ids in order, the store
  // loads them in order); anything else still lands in its place.
  const int64_t sequence = record.sequence;
  auto at = std::upper_bound(order_.begin(), order_.end(), sequence,
                             [this](int64_t value, const std::string& other)
                                 ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return value < jobs_.at(other).sequence;
                                 });
  order_.insert(at, id);
  return jobs_.insert_or_assign(id, std::move(record)).first->second;
}

void JobTable::ForgetLocked(const std::vector<std::string>& ids) {
  if (ids.empty()) return;
  const std::set<std::string> gone(ids.begin(), ids.end());
  for (const std::string& id : ids) {
    jobs_.erase(id);
    hub_->Forget(id);
  }
  // One pass, however many go.
  order_.erase(std::remove_if(order_.begin(), order_.end(),
                              [&gone](const std::string& id) { return gone.count(id) > 0; }),
               order_.end());
}

bool JobTable::TransitionLocked(JobRecord& record, JobState to, const std::string& message) {
  Job& job = record.job;
  if (!CanTransition(job.state(), to)) return false;
  job.set_state(to);
  if (to == JobState::FAILED) job.set_failure_reason(message);
  RecordEventLocked(record, message);
  return true;
}

void JobTable::RecordEventLocked(JobRecord& record, const std::string& message) {
  Job& job = record.job;
  job.set_updated_unix_ms(absl::ToUnixMillis(absl::Now()));
  loom::v1::JobEvent* event = job.add_history();
  event->set_time_unix_ms(job.updated_unix_ms());
  event->set_state(job.state());
  event->set_attempt(job.attempt());
  event->set_message(message);
  std::fprintf(stderr, "job %s: %s (attempt %d): %s\n", job.id().c_str(),
               loom::v1::JobState_Name(job.state()).c_str(), job.attempt(),
               SafeText(message, 1024).c_str());  // may quote a rank's log: escaped
  PersistLocked(record, Durability::kHard);
}

void JobTable::PersistLocked(JobRecord& record, Durability durability) {
  if (!acting_) return;
  if (durability == Durability::kHard) ++record.version;
  record.last_persist = absl::Now();
  PersistRequest request;
  request.job = record.job;  // small: the placement is not in it
  request.placement = record.placement;
  request.version = record.version;
  request.steps = hub_->Unstored(record.job.id());
  persister_->Put(std::move(request));
}

void JobTable::AfterStoredLocked(JobRecord& record, std::function<void()> effect) {
  if (!Unstored(record) && record.held.empty()) {
    effect();
    return;
  }
  record.held.emplace_back(record.version, std::move(effect));
}

void JobTable::AwaitStoredLocked(
    JobRecord& record, std::function<void(absl::Status, std::shared_ptr<const Job>)> done,
    std::function<void()> undo) {
  record.waiters.push_back({record.version, std::move(done), std::move(undo)});
}

void JobTable::ReleaseLocked(JobRecord& record) {
  while (!record.held.empty() && record.held.front().first <= record.stored_version) {
    std::function<void()> effect = std::move(record.held.front().second);
    record.held.pop_front();
    effect();
  }
}

void JobTable::OnWritten(std::vector<WriteResult> results) {
  std::vector<std::function<void()>> answers;  // run after unlocking: they complete RPCs
  {
    absl::MutexLock lock(&mu_);
    for (WriteResult& result : results) {
      JobRecord* record = FindLocked(result.job_id);
      if (record == nullptr) continue;  // forgotten meanwhile
      if (result.status.ok()) {
        if (result.version < record->stored_version) continue;  // an older write
        record->stored = std::move(result.job);
        record->stored_placement = std::move(result.placement);
        record->stored_version = result.version;
        hub_->StepsStored(result.job_id, result.steps_through);
        if (!fenced_) ReleaseLocked(*record);
        std::vector<ChangeWaiter> waiting;
        waiting.swap(record->waiters);
        for (ChangeWaiter& w : waiting) {
          if (w.version > record->stored_version) {
            record->waiters.push_back(std::move(w));
            continue;
          }
          answers.push_back([done = std::move(w.done), stored = record->stored] {
            done(absl::OkStatus(), stored);
          });
        }
        continue;
      }
      // The write failed: a caller's change is put back (newest first), and
      // the caller hears why.
      std::vector<ChangeWaiter> waiting;
      waiting.swap(record->waiters);
      for (auto w = waiting.rbegin(); w != waiting.rend(); ++w) {
        if (w->version > result.version) {
          record->waiters.push_back(std::move(*w));
          continue;
        }
        while (!record->held.empty() && record->held.back().first >= w->version) {
          record->held.pop_back();
        }
        if (w->undo) w->undo();
        answers.push_back([done = std::move(w->done), status = result.status] {
          done(status, nullptr);
        });
      }
      std::reverse(record->waiters.begin(), record->waiters.end());
      // Anything else that is not stored (and the record put back) is
      // written again, after the persister's backoff; steps and progress
      // with it. Soft: the record's newest version is what is written.
      PersistLocked(*record, Durability::kSoft);
    }
  }
  for (std::function<void()>& answer : answers) answer();
}

void JobTable::SendLocked(const std::string& node_id, loom::v1::CoordinatorMessage message) {
  if (fenced_) return;
  outbox_.emplace_back(node_id, std::move(message));
}

void JobTable::SendAfterStoredLocked(JobRecord& record, const std::string& node_id,
                                     loom::v1::CoordinatorMessage message) {
  // Run once: the message moves on to the outbox (a launch is kilobytes, and
  // a large job's launches are released together under the lock).
  AfterStoredLocked(record, [this, node_id, message = std::move(message)]() mutable
                                ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  SendLocked(node_id, std::move(message));
                                });
}

std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> JobTable::TakeOutboxLocked() {
  std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> out;
  out.swap(outbox_);
  return out;
}

int64_t JobTable::RequestScheduleLocked() {
  schedule_requested_ = ++schedule_requests_;
  return schedule_requested_;
}

int64_t JobTable::TakeScheduleRequestLocked() {
  const int64_t request = schedule_requested_;
  schedule_requested_ = 0;
  return request;
}

std::vector<std::function<void()>> JobTable::StopActingLocked(bool fenced,
                                                              const absl::Status& why) {
  std::vector<std::function<void()>> answers;
  if (!acting_ && (fenced_ || !fenced)) return answers;
  acting_ = false;
  not_acting_ = why;
  if (!fenced) return answers;
  // It no longer leads: nothing it decided may reach an agent now, and no
  // caller may be told a change it could not store.
  fenced_ = true;
  outbox_.clear();
  for (auto& [id, record] : jobs_) record.held.clear();
  return AbandonWaitersLocked(why);
}

std::vector<std::function<void()>> JobTable::AbandonWaitersLocked(const absl::Status& why) {
  std::vector<std::function<void()>> answers;
  for (auto& [id, record] : jobs_) {
    for (auto w = record.waiters.rbegin(); w != record.waiters.rend(); ++w) {
      if (w->undo) w->undo();
      answers.push_back([done = std::move(w->done), why] { done(why, nullptr); });
    }
    record.waiters.clear();
  }
  return answers;
}

absl::Status JobTable::NotActingLocked() const {
  if (!not_acting_.ok()) return not_acting_;
  return absl::UnavailableError("this coordinator is stopping; retry");
}

Job JobTable::ShownLocked(const JobRecord& record) const {
  Job shown = *record.stored;
  // Progress is live: it is soft state, rebuilt from the ranks' reports.
  *shown.mutable_last_progress() = record.job.last_progress();
  shown.set_first_running_unix_ms(
      std::max(shown.first_running_unix_ms(), record.job.first_running_unix_ms()));
  shown.set_counted_step_seconds(record.job.counted_step_seconds());
  shown.set_goodput(record.job.goodput());
  shown.clear_store_namespace();  // only the attempt's ranks are told it
  return shown;
}

absl::StatusOr<Job> JobTable::Get(const std::string& id, loom::v1::JobView view) const {
  Job job;
  std::shared_ptr<const Placement> placement;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound(id);
    job = ShownLocked(it->second);
    if (view == loom::v1::JOB_VIEW_FULL) placement = it->second.stored_placement;
  }
  // The placement is immutable: copied without the lock, on the caller's thread.
  if (placement != nullptr) *job.mutable_placement() = *placement;
  return job;
}

absl::StatusOr<JobPage> JobTable::List(int32_t page_size, const std::string& page_token,
                                       const std::function<bool(const Job&)>& visible) const {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size=", page_size, " must not be negative"));
  }
  const int32_t size = page_size == 0 ? options_.default_page_size
                                      : std::min(page_size, options_.max_page_size);
  int64_t after = 0;  // the sequence of the last job of the previous page
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 0)) {
    return absl::InvalidArgumentError(
        "page_token is not one this coordinator gave (use next_page_token of the previous page)");
  }
  absl::MutexLock lock(&mu_);
  JobPage page;
  // order_ is sorted by sequence: start after the token by binary search.
  auto it = std::upper_bound(order_.begin(), order_.end(), after,
                             [this](int64_t value, const std::string& id)
                                 ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return value < jobs_.at(id).sequence;
                                 });
  for (; it != order_.end() && static_cast<int32_t>(page.jobs.size()) < size; ++it) {
    const JobRecord& record = jobs_.at(*it);
    if (visible && !visible(*record.stored)) continue;
    page.jobs.push_back(Summary(ShownLocked(record)));
  }
  if (it != order_.end() && !page.jobs.empty()) {
    page.next_page_token = absl::StrCat(jobs_.at(*std::prev(it)).sequence);
  }
  return page;
}

absl::Status JobTable::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  if (order_.size() != jobs_.size()) {
    return absl::InternalError(absl::StrCat(order_.size(), " ids in order, ", jobs_.size(), " jobs"));
  }
  int64_t previous = 0;
  for (const std::string& id : order_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return absl::InternalError(absl::StrCat(id, " is in order only"));
    const JobRecord& r = it->second;
    const std::string who = absl::StrCat("job ", id, ": ");
    if (r.sequence <= previous) return absl::InternalError(who + "out of sequence order");
    previous = r.sequence;
    if (r.stored == nullptr || r.stored->id() != id) return absl::InternalError(who + "no stored record");
    if (r.stored_version > r.version) return absl::InternalError(who + "stored ahead of its changes");
    if (!Unstored(r) && !r.held.empty()) return absl::InternalError(who + "effects held for nothing");
    if (IsTerminal(r.stored->state()) && r.stored->state() != r.job.state()) {
      return absl::InternalError(who + "changed after it ended");
    }
    if (r.job.attempt() > 0 && HoldsDevices(r.job.state())) {
      if (static_cast<int>(r.ranks.size()) != r.placement->size()) {
        return absl::InternalError(who + "ranks do not match the placement");
      }
    }
    size_t ready = 0, resumed = 0, exited = 0;
    for (const RankState& rank : r.ranks) {
      ready += rank.ready;
      resumed += rank.resumed;
      exited += rank.exited;
    }
    if (ready != r.ranks_ready || resumed != r.ranks_resumed || exited != r.ranks_exited) {
      return absl::InternalError(who + "rank counts do not match the ranks");
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::coordinator
