// loom-loadgen: plays a cluster of fake node agents and their ranks against a
// real coordinator (tools/loadgen/fake_cluster.h), submits one data-parallel
// job over all of them, and reports what the coordinator did under that load:
// submit to RUNNING, GetJob and `loomctl list` latency, rendezvous call
// latency, the coordinator's CPU and memory, false hangs or lost nodes, and,
// with --stop_rank, how soon the hang of a silent rank is declared and
// whether the rank named is the right one; with --fail_rank, how the job
// recovers from a crashed rank or a lost node (fault_run.h).
// With --jobs=N it instead runs the scheduling policies at scale: N jobs of
// mixed sizes and priorities from --users users, under quotas, on --nodes
// labelled fake nodes, every decision checked (sched_run.h).
// docs/scale.md has the measurements.
//
// Exit code: 0 when the run was correct (RUNNING reached, no false hang, node
// loss or lease run-out, the stopped rank named, the failure recovered), 1
// when not, 2 for usage errors.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_settings.h"
#include "common/rpc/tls.h"
#include "loom/v1/job.grpc.pb.h"
#include "tools/loadgen/coordinator_probe.h"
#include "tools/loadgen/fake_cluster.h"
#include "tools/loadgen/fault_run.h"
#include "tools/loadgen/node_certs.h"
#include "tools/loadgen/run_report.h"
#include "tools/loadgen/sched_run.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "HOST:PORT of loom-coordinator");
ABSL_FLAG(std::string, ca_dir, "",
          "make_certs.sh's OUT_DIR/ca (ca.crt and ca.key): node certificates are issued from it");
ABSL_FLAG(std::string, admin_tls_dir, "",
          "certificates of an admin identity (default: <ca_dir>/../admin); submits and watches "
          "the job and runs loomctl");
ABSL_FLAG(bool, insecure, false, "plaintext, for a coordinator started with --insecure");
ABSL_FLAG(int32_t, nodes, 8, "fake node agents the job runs on");
ABSL_FLAG(int32_t, spare_nodes, 0,
          "more fake node agents, registered but not asked for by the job (where a lost "
          "node's ranks can be relaunched)");
ABSL_FLAG(int32_t, gpus_per_node, 8, "devices (and ranks) per node");
ABSL_FLAG(std::string, node_prefix, "lg", "node ids are PREFIX-00000, PREFIX-00001, ...");
ABSL_FLAG(double, rank_start_spread_s, 0,
          "ranks start their rendezvous at random within this many seconds of their launch, as "
          "real trainers take a while to start (0: all at once)");
ABSL_FLAG(double, run_s, 30, "seconds of steady reporting after the job is RUNNING");
ABSL_FLAG(int32_t, stop_rank, -1, "after run_s, this rank stops reporting (-1: none)");
ABSL_FLAG(int32_t, fail_rank, -1,
          "at --fail_at_s, this rank fails as --fail says (-1: none); then how the job recovers "
          "is measured");
ABSL_FLAG(std::string, fail, "crash",
          "crash: the rank's process dies (its node reports RankExited, signal 9); node: its "
          "node's agent dies with all its ranks (the session ends)");
ABSL_FLAG(double, fail_at_s, -1,
          "seconds after RUNNING the failure happens (default: after the steady window, run_s)");
ABSL_FLAG(double, recovery_wait_s, 120,
          "how long to wait for every rank to be past its next step after the failure");
ABSL_FLAG(bool, expect_in_place, false,
          "the run is wrong unless the job recovers in place (the incident's path)");
ABSL_FLAG(std::string, perf_recovery, "",
          "record `perf record -g` of the coordinator (--coordinator_pid) from the failure until "
          "every rank is past its next step, into this file");
ABSL_FLAG(double, step_s, 1, "the simulated job's step time in seconds");
ABSL_FLAG(double, hang_wait_s, 60, "how long to wait for the hang of --stop_rank");
ABSL_FLAG(double, running_timeout_s, 300, "how long the job may take to reach RUNNING");
ABSL_FLAG(int32_t, coordinator_pid, 0, "PID of the coordinator, for its CPU and memory");
ABSL_FLAG(std::string, poll_job, "",
          "internal: only poll this job with GetJob every 250 ms and print each latency in ms "
          "(or 'fail') on stdout until stdin closes; loadgen runs itself so to time GetJob from "
          "a process of its own");
ABSL_FLAG(int32_t, jobs, 0,
          "N > 0: the scheduling run (sched_run.h): N jobs of mixed sizes and priorities from "
          "--users users (two under GPU quotas) on --nodes fake nodes, each running 10-40 fake "
          "steps of --job_step_s; every decision is checked. 0: the one-job run");
ABSL_FLAG(int32_t, users, 10, "the scheduling run's users (each submits with its own certificate)");
ABSL_FLAG(double, job_step_s, 0.1, "the scheduling run's fake step time in seconds");
ABSL_FLAG(int32_t, seed, 7, "the scheduling run's workload seed");
ABSL_FLAG(double, schedule_timeout_s, 600, "how long the scheduling run waits for every job to end");
ABSL_FLAG(std::string, loomctl, "", "loomctl to time `loomctl list` with (default: next to this binary)");

namespace loom::loadgen {
namespace {

// max_restarts: 0 for a steady run or a hang (it ends the job), more with
// --fail_rank (the job recovers in place, or restarts whole).
std::string JobSpec(int nodes, int gpus, int max_restarts) {
  const int ranks = nodes * gpus;
  return absl::StrFormat(R"(name: loadgen-%d
model: {vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 128, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}
train: {steps: 1000000, global_batch_size: %d, micro_batch_size: 1, seq_len: 32, lr: 3.0e-3,
        warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0, seed: 3,
        precision: bf16, eval_interval: 0, eval_windows: 4}
data: {train_path: data/train.txt, format: text}
parallelism: {dp: %d, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0}
resources: {device: gpu, gpu: h200, nodes: %d, gpus_per_node: %d}
fault_tolerance: {max_restarts: %d, hang_timeout_s: 0, in_place: true, snapshot_interval: 1}
)",
                         ranks, ranks, ranks, nodes, gpus, max_restarts);
}

// The rank a hang diagnosis names ("...: rank 17 TP(0)-... holds the job up ...").
int NamedRank(const std::string& diagnosis) {
  const size_t at = diagnosis.find("): rank ");
  if (at == std::string::npos) return -1;
  const size_t start = at + 8;
  const size_t end = diagnosis.find(' ', start);
  int rank = -1;
  if (!absl::SimpleAtoi(diagnosis.substr(start, end - start), &rank)) return -1;
  return rank;
}

// The time of the first event at or after since_ms in one of the given states.
int64_t EventTime(const loom::v1::Job& job, int64_t since_ms,
                  std::initializer_list<loom::v1::JobState> states) {
  for (const auto& e : job.history()) {
    if (e.time_unix_ms() < since_ms) continue;
    for (auto s : states) {
      if (e.state() == s) return e.time_unix_ms();
    }
  }
  return 0;
}

bool Ended(loom::v1::JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

int Run() {
  const std::string ca_dir = absl::GetFlag(FLAGS_ca_dir);
  const bool insecure = absl::GetFlag(FLAGS_insecure);
  if (ca_dir.empty() && !insecure) {
    std::fprintf(stderr, "loom-loadgen: --ca_dir=DIR (make_certs.sh's OUT_DIR/ca) or --insecure is required\n");
    return 2;
  }
  const int nodes = absl::GetFlag(FLAGS_nodes);
  const int gpus = absl::GetFlag(FLAGS_gpus_per_node);
  const int ranks = nodes * gpus;
  const int stop_rank = absl::GetFlag(FLAGS_stop_rank);
  const int fail_rank = absl::GetFlag(FLAGS_fail_rank);
  const int spare_nodes = absl::GetFlag(FLAGS_spare_nodes);
  if (nodes <= 0 || gpus <= 0 || spare_nodes < 0 || stop_rank >= ranks || fail_rank >= ranks) {
    std::fprintf(stderr, "loom-loadgen: --nodes and --gpus_per_node must be > 0, --spare_nodes "
                         "not negative, and --stop_rank and --fail_rank below nodes x gpus\n");
    return 2;
  }
  if (stop_rank >= 0 && fail_rank >= 0) {
    std::fprintf(stderr, "loom-loadgen: --stop_rank and --fail_rank are one failure each; give one\n");
    return 2;
  }
  FaultPlan fault;
  if (const std::string kind = absl::GetFlag(FLAGS_fail); kind == "node") {
    fault.kind = FaultPlan::kNode;
  } else if (kind != "crash") {
    std::fprintf(stderr, "loom-loadgen: --fail=%s: must be crash or node\n", kind.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_step_s) <= 0) {
    std::fprintf(stderr, "loom-loadgen: --step_s must be > 0\n");
    return 2;
  }
  const std::string address = absl::GetFlag(FLAGS_coordinator);

  // The admin identity: submits, watches, cancels; loomctl runs with it too.
  rpc::TlsFlagValues admin_flags;
  admin_flags.insecure = insecure;
  if (!insecure) {
    admin_flags.tls_dir = absl::GetFlag(FLAGS_admin_tls_dir).empty()
                              ? ca_dir + "/../admin"
                              : absl::GetFlag(FLAGS_admin_tls_dir);
  }
  absl::StatusOr<rpc::TlsSettings> admin_tls = rpc::ResolveTls(admin_flags);
  if (!admin_tls.ok()) {
    std::fprintf(stderr, "loom-loadgen: %s\n", admin_tls.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> admin_credentials =
      rpc::ChannelCredentials(*admin_tls);
  if (!admin_credentials.ok()) {
    std::fprintf(stderr, "loom-loadgen: %s\n", admin_credentials.status().ToString().c_str());
    return 2;
  }
  std::shared_ptr<grpc::Channel> admin = rpc::MakeChannel(address, *admin_credentials);
  if (const std::string job = absl::GetFlag(FLAGS_poll_job); !job.empty()) {
    return PollJobOnly(admin, job);
  }

  std::unique_ptr<NodeCertFactory> certs;
  if (!insecure) {
    absl::StatusOr<NodeCertFactory> loaded = NodeCertFactory::Load(ca_dir);
    if (!loaded.ok()) {
      std::fprintf(stderr, "loom-loadgen: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    certs = std::make_unique<NodeCertFactory>(*std::move(loaded));
  }
  if (const int jobs = absl::GetFlag(FLAGS_jobs); jobs > 0) {
    const int users = absl::GetFlag(FLAGS_users);
    const double step_s = absl::GetFlag(FLAGS_job_step_s);
    if (insecure || users <= 0 || !(step_s > 0) || gpus != 8) {
      std::fprintf(stderr, "loom-loadgen: --jobs needs TLS (--ca_dir: each user submits with its "
                           "own certificate), --users > 0, --job_step_s > 0 and --gpus_per_node=8 "
                           "(job specs ask for whole nodes of 8)\n");
      return 2;
    }
    SchedRunOptions options;
    options.coordinator = address;
    options.nodes = nodes;
    options.gpus_per_node = gpus;
    options.node_prefix = absl::GetFlag(FLAGS_node_prefix);
    options.workload.jobs = jobs;
    options.workload.users = users;
    options.workload.seed = static_cast<uint32_t>(absl::GetFlag(FLAGS_seed));
    options.workload.step_s = step_s;
    options.timeout = absl::Seconds(absl::GetFlag(FLAGS_schedule_timeout_s));
    return RunScheduling(options, *certs, admin);
  }

  ProbeOptions probe_options;
  probe_options.admin = admin;
  probe_options.coordinator_pid = absl::GetFlag(FLAGS_coordinator_pid);
  probe_options.loomctl = absl::GetFlag(FLAGS_loomctl);
  if (probe_options.loomctl.empty()) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
      std::string dir(self, static_cast<size_t>(n));
      probe_options.loomctl = dir.substr(0, dir.rfind('/')) + "/loomctl";
    }
  }
  {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
      probe_options.poll_command = {std::string(self, static_cast<size_t>(n)),
                                    absl::StrCat("--coordinator=", address)};
      if (insecure) {
        probe_options.poll_command.push_back("--insecure");
      } else {
        probe_options.poll_command.push_back(absl::StrCat("--ca_dir=", ca_dir));
        probe_options.poll_command.push_back(absl::StrCat("--admin_tls_dir=", admin_flags.tls_dir));
      }
    }
  }
  probe_options.loomctl_flags = {absl::StrCat("--coordinator=", address)};
  probe_options.loomctl_flags.push_back(insecure ? std::string("--insecure")
                                                 : absl::StrCat("--tls_dir=", admin_flags.tls_dir));

  ClusterOptions cluster_options{.coordinator = address,
                                 .nodes = nodes + spare_nodes,
                                 .gpus_per_node = gpus,
                                 .node_prefix = absl::GetFlag(FLAGS_node_prefix),
                                 .insecure = insecure,
                                 .rank_start_spread_s = absl::GetFlag(FLAGS_rank_start_spread_s),
                                 .step = absl::Seconds(absl::GetFlag(FLAGS_step_s))};
  FakeCluster cluster(cluster_options, certs.get());
  std::printf("loom-loadgen: %d nodes x %d devices = %d ranks (and %d spare nodes) against %s\n",
              nodes, gpus, ranks, spare_nodes, address.c_str());
  std::fflush(stdout);
  const absl::Time start = absl::Now();
  if (absl::Status s = cluster.Create(); !s.ok()) {
    std::fprintf(stderr, "loom-loadgen: %s\n", s.ToString().c_str());
    return 1;
  }
  // The 1 Hz schedule, in 20 slices of 50 ms; it runs from the first
  // registration on, as each real agent heartbeats once registered.
  std::atomic<bool> ticking{true};
  constexpr int kSlices = 20;
  std::thread heartbeats([&] {
    absl::Time next = absl::Now();
    for (int slice = 0; ticking; slice = (slice + 1) % kSlices) {
      cluster.stats().heartbeat_tick_lateness.Record(
          std::max(absl::ZeroDuration(), absl::Now() - next));
      cluster.TickHeartbeats(slice, kSlices);
      next += absl::Milliseconds(1000 / kSlices);
      absl::SleepFor(next - absl::Now());
    }
  });
  std::thread reports([&] {
    absl::Time next = absl::Now();
    for (int slice = 0; ticking; slice = (slice + 1) % kSlices) {
      cluster.TickReports(slice, kSlices);
      next += absl::Milliseconds(1000 / kSlices);
      absl::SleepFor(next - absl::Now());
    }
  });
  if (absl::Status s = cluster.Connect(absl::Seconds(180)); !s.ok()) {
    std::fprintf(stderr, "loom-loadgen: %s\n", s.ToString().c_str());
    cluster.Shutdown();
    std::fflush(stdout);
    std::_Exit(1);
  }
  std::printf("registered: %d nodes in %.1f s\n", nodes + spare_nodes,
              absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);

  CoordinatorProbe probe(probe_options);
  auto job_stub = loom::v1::JobService::NewStub(admin);
  loom::v1::SubmitJobRequest submit;
  submit.set_spec_yaml(JobSpec(nodes, gpus, fail_rank >= 0 ? 2 : 0));
  submit.set_source_name("loadgen.yaml");
  loom::v1::SubmitJobResponse submitted;
  const absl::Time submit_at = absl::Now();
  const int64_t submit_ms = absl::ToUnixMillis(submit_at);
  {
    auto context = rpc::UnaryContext(std::chrono::seconds(60));
    grpc::Status status = job_stub->SubmitJob(context.get(), submit, &submitted);
    if (!status.ok()) {
      std::fprintf(stderr, "loom-loadgen: SubmitJob: %s\n", status.error_message().c_str());
      ticking = false;
      heartbeats.join();
      reports.join();
      cluster.Shutdown();
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
  const std::string job_id = submitted.job().id();
  std::printf("submitted: job %s in %d ms\n", job_id.c_str(),
              static_cast<int>(absl::ToUnixMillis(absl::Now()) - submit_ms));
  std::fflush(stdout);
  probe.Watch(job_id);

  bool correct = true;
  std::string verdicts;
  auto fail = [&](const std::string& why) {
    correct = false;
    absl::StrAppend(&verdicts, "FAIL: ", why, "\n");
  };

  // Submit to RUNNING.
  double to_running_s = -1;
  const absl::Time running_deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_running_timeout_s));
  while (absl::Now() < running_deadline) {
    const loom::v1::Job job = probe.LastJob();
    if (const int64_t at = EventTime(job, submit_ms, {loom::v1::RUNNING}); at > 0) {
      to_running_s = static_cast<double>(at - submit_ms) / 1000.0;
      break;
    }
    if (Ended(job.state()) || job.state() == loom::v1::RESTARTING) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (to_running_s < 0) {
    const loom::v1::Job job = probe.LastJob();
    fail(absl::StrCat("the job did not reach RUNNING (state ", loom::v1::JobState_Name(job.state()),
                      ", ranks ready ", cluster.stats().ranks_ready.load(), " of ", ranks, "; ",
                      job.last_diagnosis(), ")"));
  } else {
    std::printf("running: %.2f s after submit\n", to_running_s);
    std::fflush(stdout);
  }
  // What the launch cost the coordinator (placement, 16,384 launches, the
  // rendezvous, the ready reports): what a recovery's cost is compared with.
  double launch_cpu_s = -1;
  if (to_running_s >= 0) {
    absl::SleepFor(absl::Milliseconds(300));  // a CPU sample after RUNNING
    launch_cpu_s =
        probe.CpuSecondsBetween(submit_at, submit_at + absl::Seconds(to_running_s));
  }

  // Steady state: every rank reports once a second, through its node.
  double cpu_per_report_us = 0, cpu_fraction = 0, reports_per_s = 0, batches_per_s = 0,
         run_delay_fraction = 0, loadgen_cpu_fraction = 0;
  if (correct) {
    // Let the first step reports settle; a failure at --fail_at_s cuts the
    // steady window short.
    double settle_s = 3, run_s = absl::GetFlag(FLAGS_run_s);
    if (const double at = absl::GetFlag(FLAGS_fail_at_s); fail_rank >= 0 && at >= 0) {
      settle_s = std::min(settle_s, at);
      run_s = at - settle_s;
    }
    absl::SleepFor(absl::Seconds(settle_s));
    probe.SetPhase(CoordinatorProbe::kSteady);
    const int pid = probe_options.coordinator_pid;
    absl::StatusOr<ProcSample> before = pid > 0 ? SampleProcess(pid) : absl::StatusOr<ProcSample>();
    // Loadgen's own CPU: it shares the machine with the coordinator.
    absl::StatusOr<ProcSample> self_before = SampleProcess(getpid());
    const int64_t reports_before = cluster.stats().reports_sent.load();
    const int64_t batches_before = cluster.stats().batches_sent.load();
    const absl::Time window_start = absl::Now();
    const absl::Time window_end = window_start + absl::Seconds(run_s);
    while (absl::Now() < window_end) {
      const loom::v1::Job job = probe.LastJob();
      if (job.state() != loom::v1::RUNNING) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    probe.SetPhase(CoordinatorProbe::kEnd);
    const double window_s = absl::ToDoubleSeconds(absl::Now() - window_start);
    const int64_t reports = cluster.stats().reports_sent.load() - reports_before;
    reports_per_s = static_cast<double>(reports) / window_s;
    batches_per_s =
        static_cast<double>(cluster.stats().batches_sent.load() - batches_before) / window_s;
    if (absl::StatusOr<ProcSample> self_after = SampleProcess(getpid());
        self_before.ok() && self_after.ok()) {
      loadgen_cpu_fraction = (self_after->cpu_seconds - self_before->cpu_seconds) / window_s;
    }
    if (pid > 0 && before.ok()) {
      if (absl::StatusOr<ProcSample> after = SampleProcess(pid); after.ok()) {
        const double cpu = after->cpu_seconds - before->cpu_seconds;
        cpu_fraction = cpu / window_s;
        run_delay_fraction = (after->run_delay_seconds - before->run_delay_seconds) / window_s;
        if (reports > 0) cpu_per_report_us = cpu / static_cast<double>(reports) * 1e6;
      }
    }
    const loom::v1::Job job = probe.LastJob();
    if (job.state() != loom::v1::RUNNING) {
      fail(absl::StrCat("false failure: the job left RUNNING during steady reporting (",
                        loom::v1::JobState_Name(job.state()), ": ", job.last_diagnosis(), ")"));
    }
  }

  // One rank stops; its hang must be declared, naming it.
  double hang_after_s = -1;
  int named = -1;
  double hang_timeout_s = 0;
  if (correct && stop_rank >= 0) {
    const int64_t stop_ms = absl::ToUnixMillis(absl::Now());
    if (absl::Status stopped = cluster.StopRank(stop_rank); !stopped.ok()) {
      fail(std::string(stopped.message()));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_hang_wait_s));
    while (absl::Now() < deadline) {
      const loom::v1::Job job = probe.LastJob();
      // Declared: the job leaves RUNNING (to recover in place or whole, or to fail).
      if (const int64_t at = EventTime(
              job, stop_ms, {loom::v1::RECOVERING, loom::v1::RESTARTING, loom::v1::FAILED});
          at > 0) {
        hang_after_s = static_cast<double>(at - stop_ms) / 1000.0;
        named = NamedRank(job.last_diagnosis());
        std::printf("hang: declared %.2f s after rank %d stopped: %s\n", hang_after_s, stop_rank,
                    job.last_diagnosis().c_str());
        // "(timeout 10s)" in the diagnosis: the timeout in force.
        const std::string& d = job.last_diagnosis();
        if (size_t t = d.find("(timeout "); t != std::string::npos) {
          absl::Duration timeout;
          const size_t end = d.find(')', t);
          if (absl::ParseDuration(d.substr(t + 9, end - t - 9), &timeout)) {
            hang_timeout_s = absl::ToDoubleSeconds(timeout);
          }
        }
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (hang_after_s < 0) {
      fail(absl::StrCat("no hang declared within ", absl::GetFlag(FLAGS_hang_wait_s),
                        " s of rank ", stop_rank, " stopping"));
    } else if (named != stop_rank) {
      fail(absl::StrCat("the hang named rank ", named, ", not the stopped rank ", stop_rank));
    }
  }

  // One rank crashes, or one node is lost; the job must recover.
  FaultOutcome recovery;
  const bool faulted = correct && fail_rank >= 0;
  if (faulted) {
    fault.rank = fail_rank;
    fault.job_id = job_id;
    fault.wait = absl::Seconds(absl::GetFlag(FLAGS_recovery_wait_s));
    fault.expect_in_place = absl::GetFlag(FLAGS_expect_in_place);
    fault.perf_out = absl::GetFlag(FLAGS_perf_recovery);
    fault.coordinator_pid = probe_options.coordinator_pid;
    recovery = RunFault(cluster, probe, fault);
    for (const std::string& why : recovery.failures) fail(why);
  }

  // Lost nodes, from the coordinator's own view (the one loadgen lost on
  // purpose excepted).
  int lost_nodes = 0;
  {
    auto context = rpc::UnaryContext(std::chrono::seconds(30));
    loom::v1::ListNodesResponse listed;
    if (job_stub->ListNodes(context.get(), loom::v1::ListNodesRequest(), &listed).ok()) {
      for (const auto& n : listed.nodes()) {
        if (!n.live() && n.node_id() != recovery.lost_node) ++lost_nodes;
      }
    }
  }
  const loom::v1::Job final_job = probe.LastJob();
  int lost_events = 0;
  for (const auto& e : final_job.history()) {
    if (e.message().find("lost") != std::string::npos &&
        (recovery.lost_node.empty() || e.message().find(recovery.lost_node) == std::string::npos)) {
      ++lost_events;
    }
  }
  if (lost_nodes > 0 || lost_events > 0) {
    fail(absl::StrCat(lost_nodes, " nodes not live, ", lost_events, " node-lost events"));
  }
  ClusterStats& stats = cluster.stats();
  if (stats.sessions_ended > 0 || stats.rendezvous_failed > 0) {
    fail(absl::StrCat(stats.sessions_ended.load(), " sessions ended, ",
                      stats.rendezvous_failed.load(), " rendezvous calls failed"));
  }
  if (stats.lease_expiries > 0) {
    fail(absl::StrCat("the agents' lease ran out ", stats.lease_expiries.load(), " times (",
                      stats.ranks_paused.load(), " ranks paused, ", stats.ranks_resumed.load(),
                      " resumed): heartbeats were acknowledged later than the node timeout"));
  }

  {
    auto context = rpc::UnaryContext(std::chrono::seconds(30));
    loom::v1::CancelJobRequest cancel;
    cancel.set_id(job_id);
    loom::v1::Job cancelled;
    job_stub->CancelJob(context.get(), cancel, &cancelled);
  }
  absl::SleepFor(absl::Seconds(1));  // the kills and exits

  RunSummary summary{.ranks = ranks,
                     .nodes = nodes,
                     .gpus = gpus,
                     .to_running_s = to_running_s,
                     .launch_cpu_s = launch_cpu_s,
                     .reports_per_s = reports_per_s,
                     .batches_per_s = batches_per_s,
                     .loadgen_cpu_fraction = loadgen_cpu_fraction,
                     .coordinator_measured = probe_options.coordinator_pid > 0,
                     .cpu_fraction = cpu_fraction,
                     .cpu_per_report_us = cpu_per_report_us,
                     .run_delay_fraction = run_delay_fraction,
                     .lost_nodes = lost_nodes,
                     .lost_events = lost_events,
                     .stop_rank = stop_rank,
                     .hang_after_s = hang_after_s,
                     .hang_timeout_s = hang_timeout_s,
                     .named = named,
                     .fault = faulted ? &fault : nullptr,
                     .recovery = faulted ? &recovery : nullptr,
                     .correct = correct};
  PrintRunReport(summary, probe, stats);
  std::printf("%s", verdicts.empty() ? "OK\n" : verdicts.c_str());
  std::fflush(stdout);
  // Sessions end before heartbeats stop, so the coordinator sees agents
  // leave rather than falling silent.
  cluster.Shutdown();
  ticking = false;
  heartbeats.join();
  reports.join();
  // gRPC may still hold callbacks into the cluster; the process ends here.
  std::_Exit(correct ? 0 : 1);
}

}  // namespace
}  // namespace loom::loadgen

int main(int argc, char** argv) {
  // Debian's libabsl is built without NDEBUG: every Mutex lock (gRPC's
  // included) fed a deadlock-detection graph, 10% of loadgen's CPU at 16,384
  // ranks; the coordinator turns it off the same way.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::ParseCommandLine(argc, argv);
  return loom::loadgen::Run();
}
