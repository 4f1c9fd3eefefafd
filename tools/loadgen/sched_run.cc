#include "tools/loadgen/sched_run.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_settings.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/quota.grpc.pb.h"
#include "tools/loadgen/sched_checks.h"
#include "tools/loadgen/sched_ledger.h"
#include "tools/loadgen/sched_node.h"

namespace loom::loadgen {
namespace {

using loom::v1::JobState;

absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelAs(const std::string& address,
                                                         NodeCertFactory& certs,
                                                         const std::string& name,
                                                         const std::string& role) {
  absl::StatusOr<PemIdentity> identity = certs.Issue(name, role);
  if (!identity.ok()) return identity.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = identity->ca_pem;
  ssl.pem_cert_chain = identity->cert_pem;
  ssl.pem_private_key = identity->key_pem;
  return rpc::MakeChannel(address, grpc::SslCredentials(ssl));
}

bool Ended(JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

// Counts the jobs of `ids` that ended, from ListJobs pages.
absl::StatusOr<int> CountEnded(loom::v1::JobService::Stub& stub,
                               const std::map<std::string, size_t>& ids) {
  int ended = 0;
  std::string token;
  do {
    loom::v1::ListJobsRequest request;
    request.set_page_size(1000);
    request.set_page_token(token);
    loom::v1::ListJobsResponse response;
    auto context = rpc::UnaryContext(std::chrono::seconds(30));
    grpc::Status status = stub.ListJobs(context.get(), request, &response);
    if (!status.ok())
      return absl::UnavailableError(absl::StrCat("ListJobs: ", status.error_message()));
    for (const loom::v1::Job& job : response.jobs()) {
      if (ids.count(job.id()) > 0 && Ended(job.state())) ++ended;
    }
    token = response.next_page_token();
  } while (!token.empty());
  return ended;
}

SchedJobOutcome OutcomeOf(const loom::v1::Job& job, const SchedJobPlan& plan, absl::Time origin) {
  SchedJobOutcome o;
  o.id = job.id();
  o.user = plan.user;
  o.priority = plan.priority;
  o.devices = plan.devices;
  auto seconds = [origin](int64_t unix_ms) {
    return absl::ToDoubleSeconds(absl::FromUnixMillis(unix_ms) - origin);
  };
  o.submit_s = seconds(job.created_unix_ms());
  for (const loom::v1::JobEvent& e : job.history()) {
    if (e.state() == loom::v1::STARTING) {
      ++o.attempts;
      if (o.start_s < 0) o.start_s = seconds(e.time_unix_ms());
    }
    if (Ended(e.state())) o.end_s = seconds(e.time_unix_ms());
  }
  o.succeeded = job.state() == loom::v1::SUCCEEDED;
  return o;
}

void PrintPercentiles(const char* what, const Percentiles& p) {
  std::printf("%s: n=%lld p50=%.3f s p90=%.3f s p99=%.3f s max=%.3f s\n", what,
              static_cast<long long>(p.count), p.p50, p.p90, p.p99, p.max);
}

}  // namespace

int RunScheduling(SchedRunOptions options, NodeCertFactory& certs,
                  std::shared_ptr<grpc::Channel> admin) {
  const int64_t capacity = int64_t{options.nodes} * options.gpus_per_node;
  options.workload.devices = capacity;
  const SchedWorkload workload = MakeSchedWorkload(options.workload);
  const absl::Time origin = absl::Now();
  SchedLedger ledger(origin);
  SchedShared shared;
  shared.step = absl::Seconds(options.workload.step_s);
  shared.ledger = &ledger;

  // The nodes, labelled as a real cluster's agents would be.
  std::vector<std::unique_ptr<SchedNode>> nodes;
  for (int i = 0; i < options.nodes; ++i) {
    const std::string id = absl::StrFormat("%s-%05d", options.node_prefix, i);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        ChannelAs(options.coordinator, certs, id, "node");
    if (!channel.ok()) {
      std::fprintf(stderr, "loom-loadgen: %s\n", channel.status().ToString().c_str());
      return 2;
    }
    std::map<std::string, std::string> labels = {
        {"rack", absl::StrCat("r", i / std::max(1, options.nodes_per_rack))},
        {"nvlink_domain", absl::StrCat("d", i / std::max(1, options.nodes_per_nvlink_domain))}};
    nodes.push_back(std::make_unique<SchedNode>(id, options.gpus_per_node, std::move(labels),
                                                *std::move(channel), &shared));
  }
  for (auto& node : nodes) node->Start();
  const absl::Time register_deadline = absl::Now() + absl::Seconds(120);
  while (shared.registered.load() < options.nodes) {
    if (absl::Now() > register_deadline) {
      std::fprintf(stderr, "loom-loadgen: %d of %d nodes registered within 120 s\n",
                   shared.registered.load(), options.nodes);
      for (auto& node : nodes) node->Cancel();
      std::fflush(stdout);
      std::_Exit(2);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("registered: %d nodes x %d GPUs in %.1f s\n", options.nodes, options.gpus_per_node,
              absl::ToDoubleSeconds(absl::Now() - origin));
  std::fflush(stdout);

  // Heartbeats once a second (spread over the second), ends every 5 ms.
  std::atomic<bool> running{true};
  std::thread heartbeats([&] {
    constexpr int kSlices = 20;
    absl::Time next = absl::Now();
    for (int slice = 0; running; slice = (slice + 1) % kSlices) {
      for (size_t i = static_cast<size_t>(slice); i < nodes.size(); i += kSlices)
        nodes[i]->Heartbeat();
      next += absl::Milliseconds(1000 / kSlices);
      absl::SleepFor(next - absl::Now());
    }
  });
  std::thread ender([&] {
    while (running) {
      const absl::Time now = absl::Now();
      for (auto& node : nodes) node->EndDue(now);
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  auto finish = [&](int code) {
    running = false;
    heartbeats.join();
    ender.join();
    shared.shutting_down = true;
    for (auto& node : nodes) node->Cancel();
    absl::SleepFor(absl::Milliseconds(300));
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);  // gRPC may still hold the nodes; the process ends here
    return code;
  };

  // Quotas, as an admin sets them (loomctl quota set).
  auto quotas = loom::v1::QuotaService::NewStub(admin);
  for (const auto& [user, devices] : workload.gpu_quota) {
    loom::v1::SetQuotaRequest request;
    request.set_user(user);
    request.set_set_devices(true);
    request.set_device_kind("gpu");
    request.set_devices(devices);
    loom::v1::Quota quota;
    auto context = rpc::UnaryContext(std::chrono::seconds(30));
    if (grpc::Status s = quotas->SetQuota(context.get(), request, &quota); !s.ok()) {
      std::fprintf(stderr, "loom-loadgen: SetQuota %s: %s\n", user.c_str(),
                   s.error_message().c_str());
      return finish(2);
    }
    std::printf("quota: %s may hold %lld gpu\n", user.c_str(), static_cast<long long>(devices));
  }

  // Each user submits with a certificate of its own.
  std::map<std::string, std::unique_ptr<loom::v1::JobService::Stub>> users;
  for (const SchedJobPlan& job : workload.jobs) {
    if (users.count(job.user) > 0) continue;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        ChannelAs(options.coordinator, certs, job.user, "user");
    if (!channel.ok()) {
      std::fprintf(stderr, "loom-loadgen: %s\n", channel.status().ToString().c_str());
      return finish(2);
    }
    users[job.user] = loom::v1::JobService::NewStub(*channel);
  }
  std::map<std::string, size_t> index_of;  // job id -> workload index
  const absl::Time submit_start = absl::Now();
  for (size_t i = 0; i < workload.jobs.size(); ++i) {
    const SchedJobPlan& job = workload.jobs[i];
    loom::v1::SubmitJobRequest request;
    request.set_spec_yaml(SchedJobSpec(job));
    request.set_source_name(job.name + ".yaml");
    loom::v1::SubmitJobResponse response;
    auto context = rpc::UnaryContext(std::chrono::seconds(60));
    if (grpc::Status s = users[job.user]->SubmitJob(context.get(), request, &response); !s.ok()) {
      std::fprintf(stderr, "loom-loadgen: SubmitJob %s as %s: %s\n", job.name.c_str(),
                   job.user.c_str(), s.error_message().c_str());
      return finish(1);
    }
    index_of[response.job().id()] = i;
  }
  std::printf("submitted: %zu jobs from %zu users in %.1f s\n", workload.jobs.size(), users.size(),
              absl::ToDoubleSeconds(absl::Now() - submit_start));
  std::fflush(stdout);

  auto jobs = loom::v1::JobService::NewStub(admin);
  const absl::Time deadline = absl::Now() + options.timeout;
  int ended = 0;
  while (true) {
    absl::StatusOr<int> count = CountEnded(*jobs, index_of);
    if (!count.ok()) {
      std::fprintf(stderr, "loom-loadgen: %s\n", count.status().ToString().c_str());
      return finish(1);
    }
    if (*count != ended) {
      ended = *count;
      std::printf("ended: %d of %zu jobs at %.1f s\n", ended, index_of.size(),
                  absl::ToDoubleSeconds(absl::Now() - origin));
      std::fflush(stdout);
    }
    if (ended == static_cast<int>(index_of.size())) break;
    if (absl::Now() > deadline) {
      std::fprintf(stderr, "loom-loadgen: only %d of %zu jobs ended within %s\n", ended,
                   index_of.size(), absl::FormatDuration(options.timeout).c_str());
      break;
    }
    absl::SleepFor(absl::Seconds(1));
  }

  SchedCheckInput input;
  input.capacity = capacity;
  input.gpu_quota = workload.gpu_quota;
  for (const auto& [id, i] : index_of) {
    loom::v1::GetJobRequest request;
    request.set_id(id);
    loom::v1::Job job;
    auto context = rpc::UnaryContext(std::chrono::seconds(30));
    if (grpc::Status s = jobs->GetJob(context.get(), request, &job); !s.ok()) {
      std::fprintf(stderr, "loom-loadgen: GetJob %s: %s\n", id.c_str(), s.error_message().c_str());
      return finish(1);
    }
    input.jobs.push_back(OutcomeOf(job, workload.jobs[i], origin));
  }
  input.events = ledger.Events();
  const SchedCheckResult result = CheckSchedulingRun(input);

  std::printf("makespan: %.1f s, utilization %.1f%% of %lld GPUs\n", result.makespan_s,
              100 * result.utilization, static_cast<long long>(capacity));
  std::printf("first wave: %lld jobs started at %.0f starts/s\n",
              static_cast<long long>(result.first_wave_starts), result.first_wave_rate);
  PrintPercentiles("job end -> next start, while jobs waited", result.reaction_s);
  PrintPercentiles("device free -> its next rank, while jobs waited", result.device_idle_s);
  PrintPercentiles("wait (submitted -> STARTING)", result.wait_s);
  for (const auto& [priority, wait] : result.mean_wait_by_priority) {
    std::printf("mean wait at priority %lld: %.2f s\n", static_cast<long long>(priority), wait);
  }
  std::printf("worst wait / fair-share bound: %.2f\n", result.worst_bound_ratio);
  constexpr size_t kShown = 20;
  for (size_t i = 0; i < result.violations.size() && i < kShown; ++i) {
    std::printf("VIOLATION %s\n", result.violations[i].c_str());
  }
  if (result.violations.size() > kShown) {
    std::printf("... and %zu more violations\n", result.violations.size() - kShown);
  }
  const bool correct = result.violations.empty() && ended == static_cast<int>(index_of.size()) &&
                       shared.sessions_ended.load() == 0;
  std::printf(
      "RESULT mode=schedule nodes=%d gpus=%lld jobs=%zu ended=%d violations=%zu "
      "sessions_ended=%lld makespan_s=%.2f utilization=%.3f first_wave_starts=%lld "
      "starts_per_s=%.1f reaction_p50_s=%.4f reaction_p90_s=%.4f reaction_max_s=%.4f "
      "idle_p50_s=%.4f idle_p90_s=%.4f wait_max_s=%.2f bound_ratio=%.3f correct=%d\n",
      options.nodes, static_cast<long long>(capacity), index_of.size(), ended,
      result.violations.size(), static_cast<long long>(shared.sessions_ended.load()),
      result.makespan_s, result.utilization, static_cast<long long>(result.first_wave_starts),
      result.first_wave_rate, result.reaction_s.p50, result.reaction_s.p90, result.reaction_s.max,
      result.device_idle_s.p50, result.device_idle_s.p90, result.wait_s.max,
      result.worst_bound_ratio, correct ? 1 : 0);
  return finish(correct ? 0 : 1);
}

}  // namespace loom::loadgen
