#include "coordinator/service/trace_relay.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/report_bounds.h"

namespace loom::coordinator {

absl::StatusOr<TraceSpec> TraceSpecFor(const loom::v1::Job& job,
                                       const loom::v1::TraceJobRequest& request) {
  if (job.state() != loom::v1::RUNNING || job.placement_size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.id(), " is not running: only a running job's steps can be traced"));
  }
  TraceSpec spec;
  spec.job_id = job.id();
  spec.attempt = job.attempt();
  const int64_t newest = job.last_progress().step();
  const int64_t total = job.last_progress().total_steps();
  // The step after the newest reported one may have begun on some rank.
  int64_t ahead = kTraceStepsAhead;
  if (const double seconds = job.last_progress().step_seconds(); seconds > 0) {
    ahead = std::max<int64_t>(ahead, static_cast<int64_t>(std::ceil(kTraceLeadSeconds / seconds)));
  }
  spec.step = request.step() > 0 ? request.step() : newest + ahead;
  if (request.step() <= 0 && total > 0) spec.step = std::min(spec.step, total);
  if (spec.step <= newest + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", spec.step, " may have begun already (the newest step reported is ",
                     newest, "): ask for step ", newest + 2, " or later, or leave --step out"));
  }
  if (total > 0 && spec.step > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", spec.step, " is past the job's last step ", total));
  }
  if (request.wait_seconds() < 0 || request.wait_seconds() > kMaxTraceWaitSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait_seconds must be in [0, ", kMaxTraceWaitSeconds, "]"));
  }
  if (request.wait_seconds() > 0) spec.wait = absl::Seconds(request.wait_seconds());
  std::set<int> ranks(request.ranks().begin(), request.ranks().end());
  if (ranks.empty()) {
    for (const loom::v1::RankPlacement& p : job.placement()) ranks.insert(p.rank());
  }
  if (static_cast<int>(ranks.size()) > kMaxTraceRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks: ", ranks.size(), " asked, at most ", kMaxTraceRanks,
                     " ranks per trace (list them with --ranks)"));
  }
  for (int rank : ranks) {
    const loom::v1::RankPlacement* found = nullptr;
    for (const loom::v1::RankPlacement& p : job.placement()) {
      if (p.rank() == rank) found = &p;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("ranks: ", rank, " is not a rank of job ",
                                                     job.id(), " (it has ", job.placement_size(),
                                                     ")"));
    }
    spec.ranks.push_back({rank, found->node_id(), found->place()});
  }
  return spec;
}

TraceRelay::TraceRelay(Send send, TraceRelayOptions options)
    : send_(std::move(send)), options_(options), thread_([this] { Run(); }) {}

TraceRelay::~TraceRelay() {
  std::map<int64_t, Request> left;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    left.swap(requests_);
  }
  wake_.notify_all();
  thread_.join();
  for (auto& [id, request] : left) {
    request.done(absl::UnavailableError("the coordinator is shutting down"));
  }
}

absl::Status TraceRelay::Start(TraceSpec spec, Done done) {
  std::map<std::string, loom::v1::CoordinatorMessage> messages;  // by node
  for (const TraceTarget& t : spec.ranks) {
    loom::v1::CoordinatorMessage& m = messages[t.node_id];
    loom::v1::TraceStep* trace = m.mutable_trace();
    trace->set_job_id(spec.job_id);
    trace->set_attempt(spec.attempt);
    trace->set_step(spec.step);
    trace->add_ranks(t.rank);
  }
  {
    std::lock_guard lock(mu_);
    int of_job = 0;
    for (const auto& [id, r] : requests_) of_job += r.spec.job_id == spec.job_id ? 1 : 0;
    if (of_job >= options_.max_per_job) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", spec.job_id, " has ", of_job, " traces under way; wait for them to end"));
    }
    if (static_cast<int>(requests_.size()) >= options_.max_requests) {
      return absl::ResourceExhaustedError(
          absl::StrCat(requests_.size(), " traces are under way; try again later"));
    }
    Request& r = requests_[next_id_++];
    r.deadline = absl::Now() + spec.wait;
    r.spec = std::move(spec);
    r.done = std::move(done);
  }
  wake_.notify_all();
  // A node that cannot be reached now leaves its ranks missing at the deadline.
  for (const auto& [node, message] : messages) send_(node, message);
  return absl::OkStatus();
}

void TraceRelay::Deliver(const std::string& node_id, const loom::v1::RankProgress& report) {
  if (!report.has_trace()) return;
  if (!CheckReportTrace(report).ok()) return;
  bool complete = false;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, r] : requests_) {
      if (r.spec.job_id != report.job_id() || r.spec.attempt != report.attempt() ||
          r.spec.step != report.trace().step() || r.received.contains(report.rank())) {
        continue;
      }
      for (const TraceTarget& t : r.spec.ranks) {
        if (t.rank != report.rank() || t.node_id != node_id) continue;
        r.received[t.rank] = RankTrace{t.rank, t.place, t.node_id, report.trace(), report.timing()};
        complete = complete || r.received.size() == r.spec.ranks.size();
      }
    }
  }
  if (complete) wake_.notify_all();
}

size_t TraceRelay::pending() const {
  std::lock_guard lock(mu_);
  return requests_.size();
}

loom::v1::TraceJobResponse TraceRelay::Answer(const Request& request) {
  loom::v1::TraceJobResponse response;
  response.set_step(request.spec.step);
  TraceFileInfo info{request.spec.job_id, request.spec.step, {}};
  std::vector<RankTrace> traces;
  for (const TraceTarget& t : request.spec.ranks) {
    auto it = request.received.find(t.rank);
    if (it == request.received.end()) {
      info.missing_ranks.push_back(t.rank);
      response.add_missing_ranks(t.rank);
      continue;
    }
    response.add_ranks(t.rank);
    response.set_dropped_events(response.dropped_events() + it->second.trace.dropped_events());
    traces.push_back(it->second);
  }
  response.set_trace_json(ChromeTraceJson(info, traces));
  return response;
}

void TraceRelay::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<Request> ready;
    for (auto it = requests_.begin(); it != requests_.end();) {
      Request& r = it->second;
      if (r.received.size() == r.spec.ranks.size() || r.deadline <= now) {
        ready.push_back(std::move(r));
        it = requests_.erase(it);
      } else {
        next = std::min(next, r.deadline);
        ++it;
      }
    }
    if (!ready.empty()) {
      // Assembled and answered outside the lock: Deliver never waits on it.
      lock.unlock();
      for (Request& r : ready) r.done(Answer(r));
      lock.lock();
      continue;
    }
    if (next == absl::InfiniteFuture()) {
      wake_.wait(lock);
    } else {
      wake_.wait_until(lock, absl::ToChronoTime(next));
    }
  }
}

}  // namespace loom::coordinator
