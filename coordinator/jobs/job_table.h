// The job table: every job the coordinator holds, as a JobRecord, in
// submission order, under the one mutex that every part of the job manager
// shares (parts take it through mu() and keep their own per-job state under
// it). It keeps a job's invariants — a legal state machine, ranks and counts
// that match the placement, a record that never changes once it has ended —
// and the rule that makes "durable means durable" hold: a hard change (state,
// attempt, restart counters, history) takes a new version and is handed to
// the persister; what follows from it (messages to agents, watchers' events,
// dropping a namespace) is held until the store has that version, and readers
// (GetJob, ListJobs, a watch's snapshot) are shown the record the store last
// confirmed, with the live progress on top. A change a caller waits for
// (a cancel) is answered from the persister's completion; if the write fails
// it is put back and the caller hears UNAVAILABLE; any other change that
// failed is written again until it is stored. The messages that leave for the
// agents queue here (the outbox) for the scheduler thread to send.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job_persister.h"
#include "coordinator/jobs/job_record.h"
#include "coordinator/jobs/watch_hub.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::coordinator {

// One page of jobs, oldest first; next_page_token is empty on the last page.
struct JobPage {
  std::vector<loom::v1::Job> jobs;
  std::string next_page_token;
};

enum class Durability {
  kHard,  // acknowledged state: effects wait for it, a failed write is retried or put back
  kSoft,  // progress and accounting: written at the next occasion, waited for by nothing
};

struct JobTableOptions {
  // Job ids are job-<prefix>-<sequence>; empty prefix: job-<sequence>.
  std::string job_id_prefix;
  // Pages of ListJobs.
  int32_t default_page_size = 100;
  int32_t max_page_size = 1000;
};

class JobTable {
 public:
  JobTable(JobTableOptions options, JobPersister* persister, WatchHub* hub);
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // Records, in submission order.
  JobRecord* FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const JobRecord* FindLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRecord& AtLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return jobs_.at(id);
  }
  const JobRecord& AtLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return jobs_.at(id);
  }
  const std::vector<std::string>& OrderLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return order_;
  }
  // A new job id (its sequence number in *sequence); GiveBackIdLocked
  // returns the newest one taken, when it was not used.
  std::string NewIdLocked(int64_t* sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GiveBackIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { --next_sequence_; }
  void SetNextSequenceLocked(int64_t next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    next_sequence_ = next;
  }
  // Adds a job the store holds as record.job (admitted, or loaded at start).
  JobRecord& InsertLocked(JobRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets jobs (and their watchers and steps).
  void ForgetLocked(const std::vector<std::string>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Changes. The state machine (job_states.h): false, and nothing changes,
  // when the transition is not legal. A hard change, persisted here.
  bool TransitionLocked(JobRecord& record, loom::v1::JobState to, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A hard change that keeps the state (a new attempt placed in place): an
  // event in the job's history, persisted here.
  void RecordEventLocked(JobRecord& record, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the record for the store (nothing once the table stopped acting).
  void PersistLocked(JobRecord& record, Durability durability) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs effect (under mu) now when the store holds every hard change of the
  // record, else once it does, in the order they were given.
  void AfterStoredLocked(JobRecord& record, std::function<void()> effect)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record's newest hard change (not stored yet) is a caller's: done
  // runs (without mu) with OK and the stored record once the store has it;
  // if the write fails, the effects held for it are dropped, undo (under mu)
  // puts the record back, and done gets the failure.
  void AwaitStoredLocked(JobRecord& record,
                         std::function<void(absl::Status, std::shared_ptr<const loom::v1::Job>)> done,
                         std::function<void()> undo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the record has a hard change the store does not hold yet.
  static bool Unstored(const JobRecord& record) { return record.version > record.stored_version; }

  // What the persister reports after each write (its thread; takes mu).
  void OnWritten(std::vector<WriteResult> results) ABSL_LOCKS_EXCLUDED(mu_);

  // Messages to agents: now, or once the record's hard changes are stored.
  void SendLocked(const std::string& node_id, loom::v1::CoordinatorMessage message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendAfterStoredLocked(JobRecord& record, const std::string& node_id,
                             loom::v1::CoordinatorMessage message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> TakeOutboxLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OutboxEmptyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outbox_.empty(); }
  // Asks the scheduler for a placement pass; the request's number is returned.
  int64_t RequestScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pending request's number, 0 when none; taking it clears it.
  int64_t TakeScheduleRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ScheduleRequestedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return schedule_requested_ != 0;
  }

  // Whether this coordinator still acts on jobs: false once it stops (a
  // shutdown: what was decided is still stored and sent) or is fenced (it no
  // longer leads: nothing more is sent, and waiting callers hear UNAVAILABLE).
  bool ActingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return acting_; }
  // Returns the answers of the callers it let go (fenced), to run unlocked.
  [[nodiscard]] std::vector<std::function<void()>> StopActingLocked(bool fenced,
                                                                    const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets go of every caller still waiting for a change to be stored (its
  // change put back): a stop whose last writes failed. Returns their answers.
  [[nodiscard]] std::vector<std::function<void()>> AbandonWaitersLocked(const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE naming why this coordinator no longer acts.
  absl::Status NotActingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Readers: the stored record with the live progress on top, without the
  // store namespace; with the placement only for JOB_VIEW_FULL (copied
  // after unlocking).
  absl::StatusOr<loom::v1::Job> Get(const std::string& id,
                                    loom::v1::JobView view = loom::v1::JOB_VIEW_BASIC) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A page of jobs without their specs, placements and histories (GetJob
  // has them). visible, when given, filters the jobs.
  absl::StatusOr<JobPage> List(int32_t page_size, const std::string& page_token,
                               const std::function<bool(const loom::v1::Job&)>& visible) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // What readers are shown of a record (under mu: small, the placement is not in it).
  loom::v1::Job ShownLocked(const JobRecord& record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status NotFound(const std::string& id);

  // Every invariant above, checked (tests).
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void ReleaseLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobTableOptions options_;
  JobPersister* const persister_;
  WatchHub* const hub_;

  mutable absl::Mutex mu_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // by sequence
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> outbox_ ABSL_GUARDED_BY(mu_);
  int64_t schedule_requested_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t schedule_requests_ ABSL_GUARDED_BY(mu_) = 0;
  bool acting_ ABSL_GUARDED_BY(mu_) = true;
  bool fenced_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status not_acting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator
