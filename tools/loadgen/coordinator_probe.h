// What loom-loadgen measures on the coordinator's side while the simulated
// cluster runs: GetJob latency and job state (admin channel), `loomctl list`
// wall time (the real client, as a user would run it), and the coordinator's
// CPU time and resident memory from /proc/PID.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/job.grpc.pb.h"
#include "tools/loadgen/latency.h"

namespace loom::loadgen {

struct ProcSample {
  double cpu_seconds = 0;  // user + system since the process started
  int64_t rss_bytes = 0;
  // Time its threads spent runnable but waiting for a CPU, summed over the
  // threads alive now (/proc/PID/task/*/schedstat): how much the machine's
  // other load held the process back.
  double run_delay_seconds = 0;
};

// Reads /proc/PID/stat and /proc/PID/status.
absl::StatusOr<ProcSample> SampleProcess(int pid);

// The separate process of ProbeOptions::poll_command (loom-loadgen
// --poll_job=ID): GetJob every 250 ms, each latency in ms (or "fail") on a
// line of stdout, until stdin closes. Returns the exit code.
int PollJobOnly(std::shared_ptr<grpc::Channel> admin, const std::string& job_id);

struct ProbeOptions {
  std::shared_ptr<grpc::Channel> admin;  // admin identity's channel
  std::string loomctl;                   // path of loomctl; empty: not measured
  std::vector<std::string> loomctl_flags;  // --coordinator, --tls_dir / --insecure
  int coordinator_pid = 0;                 // 0: CPU and memory not measured
  absl::Duration get_job_interval = absl::Milliseconds(250);
  absl::Duration list_interval = absl::Seconds(2);
  // argv of a separate process that polls GetJob (loom-loadgen --poll_job=ID
  // is appended) and prints each latency; empty: none. This process runs
  // loadgen's 2,048 node sessions and their traffic on the same Debian gRPC:
  // its own threads are busy, and a GetJob timed here waits for them too. The separate process's
  // latency is the coordinator's, as a user's client sees it.
  std::vector<std::string> poll_command;
};

class CoordinatorProbe {
 public:
  explicit CoordinatorProbe(ProbeOptions options);
  ~CoordinatorProbe();

  // Starts polling job_id with GetJob and running `loomctl list`.
  void Watch(const std::string& job_id);
  // The newest GetJob answer (empty Job before the first).
  loom::v1::Job LastJob() const;
  int64_t max_rss_bytes() const { return max_rss_.load(); }

  // Latencies are kept apart by phase: the start (submit, placement, launch,
  // rendezvous), the steady state, and the end (a hang, the kills, exits).
  enum Phase { kStart = 0, kSteady = 1, kEnd = 2 };
  void SetPhase(Phase phase) { phase_ = phase; }
  LatencyRecorder& get_job_latency(Phase phase) { return get_job_[phase]; }
  // GetJob timed by the separate process (ProbeOptions::poll_command).
  LatencyRecorder& own_process_get_job_latency(Phase phase) { return own_get_job_[phase]; }
  LatencyRecorder& list_latency(Phase phase) { return list_[phase]; }
  // How much later than asked the probe's thread woke from its sleep between
  // two GetJob calls: this machine's scheduling delay as loadgen sees it. A
  // GetJob tail that this matches is the machine's, not the coordinator's.
  LatencyRecorder& wake_delay(Phase phase) { return wake_[phase]; }
  // The 1-minute load average (/proc/loadavg) during the run: its mean and max.
  double mean_load() const;
  double max_load() const;
  // The coordinator's CPU seconds spent between two times, from its samples
  // (one per GetJob poll, 250 ms apart), interpolated linearly; -1 without
  // samples around both (no --coordinator_pid, or outside the run).
  double CpuSecondsBetween(absl::Time from, absl::Time to) const;

 private:
  void PollJobs();
  void RunLists();
  void StartPollProcess(const std::string& job_id);
  void ReadPollProcess(int fd);

  const ProbeOptions options_;
  std::unique_ptr<loom::v1::JobService::Stub> stub_;
  LatencyRecorder get_job_[3];
  LatencyRecorder own_get_job_[3];
  int poll_pid_ = 0;
  int poll_stdin_ = -1;  // closing it ends the poll process
  std::thread poll_reader_;
  LatencyRecorder list_[3];
  LatencyRecorder wake_[3];
  std::atomic<Phase> phase_{kStart};
  std::atomic<int64_t> max_rss_{0};
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  double load_sum_ ABSL_GUARDED_BY(mu_) = 0;
  double load_max_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t load_samples_ ABSL_GUARDED_BY(mu_) = 0;
  loom::v1::Job last_ ABSL_GUARDED_BY(mu_);
  // (when, the coordinator's CPU seconds then), in time order.
  std::vector<std::pair<absl::Time, double>> cpu_samples_ ABSL_GUARDED_BY(mu_);
  std::thread poller_;
  std::thread lister_;
};

}  // namespace loom::loadgen
