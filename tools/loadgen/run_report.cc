#include "tools/loadgen/run_report.h"

#include <cstdio>

namespace loom::loadgen {

void PrintRunReport(const RunSummary& run, CoordinatorProbe& probe, const ClusterStats& stats) {
  std::printf("--- loom-loadgen: %d ranks (%d nodes x %d) ---\n", run.ranks, run.nodes, run.gpus);
  std::printf("submit to RUNNING:   %.2f s (coordinator CPU %.2f s)\n", run.to_running_s,
              run.launch_cpu_s);
  using Probe = CoordinatorProbe;
  std::printf("GetJob, start:       %s\n", probe.get_job_latency(Probe::kStart).Summary().c_str());
  std::printf("GetJob, steady:      %s\n", probe.get_job_latency(Probe::kSteady).Summary().c_str());
  std::printf("GetJob, end:         %s\n", probe.get_job_latency(Probe::kEnd).Summary().c_str());
  std::printf("GetJob from its own process, start:  %s\n",
              probe.own_process_get_job_latency(Probe::kStart).Summary().c_str());
  std::printf("GetJob from its own process, steady: %s\n",
              probe.own_process_get_job_latency(Probe::kSteady).Summary().c_str());
  std::printf("GetJob from its own process, end:    %s\n",
              probe.own_process_get_job_latency(Probe::kEnd).Summary().c_str());
  std::printf("loomctl list, start: %s\n", probe.list_latency(Probe::kStart).Summary().c_str());
  std::printf("loomctl list, steady:%s\n", probe.list_latency(Probe::kSteady).Summary().c_str());
  std::printf("loomctl list, end:   %s\n", probe.list_latency(Probe::kEnd).Summary().c_str());
  std::printf("loadgen wake-up delay, steady: %s\n",
              probe.wake_delay(Probe::kSteady).Summary().c_str());
  std::printf("load average (1 min) during the run: mean %.1f, max %.1f\n", probe.mean_load(),
              probe.max_load());
  std::printf("store calls (start): %s\n", stats.store_latency.Summary().c_str());
  std::printf("store batches: %lld (their sets and adds, per op above)\n",
              static_cast<long long>(stats.store_batches.load()));
  std::printf("heartbeat send delay:%s\n", stats.heartbeat_delay.Summary().c_str());
  std::printf("heartbeat schedule late by: %s\n", stats.heartbeat_tick_lateness.Summary().c_str());
  std::printf(
      "reports:             %.0f /s in %.0f batches /s, steady (skipped while the node's "
      "previous batch was queued: %lld reports in %lld batches, whole run)\n",
      run.reports_per_s, run.batches_per_s, static_cast<long long>(stats.reports_skipped.load()),
      static_cast<long long>(stats.batches_skipped.load()));
  std::printf("loadgen CPU:         %.1f%% of a core (steady)\n", run.loadgen_cpu_fraction * 100);
  if (run.coordinator_measured) {
    std::printf("coordinator CPU:     %.1f%% of a core, %.1f us per rank report\n",
                run.cpu_fraction * 100, run.cpu_per_report_us);
    std::printf("coordinator waited for a CPU: %.0f ms per second, its threads together (steady)\n",
                run.run_delay_fraction * 1000);
    std::printf("coordinator RSS:     %.1f MiB max (%.1f KiB per rank)\n",
                static_cast<double>(probe.max_rss_bytes()) / (1 << 20),
                static_cast<double>(probe.max_rss_bytes()) / 1024 / run.ranks);
  }
  std::printf("lost nodes:          %d (events %d), sessions ended %lld\n", run.lost_nodes,
              run.lost_events, static_cast<long long>(stats.sessions_ended.load()));
  if (run.stop_rank >= 0) {
    std::printf("hang of rank %d:     declared after %.2f s (timeout %.1f s), named rank %d\n",
                run.stop_rank, run.hang_after_s, run.hang_timeout_s, run.named);
  }
  std::printf("heartbeat acked after: %s\n", stats.ack_delay.Summary().c_str());
  std::printf("lease:               %lld run-outs, %lld ranks paused, %lld resumed\n",
              static_cast<long long>(stats.lease_expiries.load()),
              static_cast<long long>(stats.ranks_paused.load()),
              static_cast<long long>(stats.ranks_resumed.load()));
  if (run.fault != nullptr) PrintFault(*run.fault, *run.recovery, run.cpu_fraction);
  // One line for scripts (tests/bench/scale).
  std::printf(
      "RESULT ranks=%d running_s=%.2f launch_cpu_s=%.2f getjob_p99_ms=%.1f "
      "getjob_steady_p50_ms=%.1f "
      "getjob_steady_p90_ms=%.1f getjob_steady_p99_ms=%.1f own_getjob_steady_p50_ms=%.1f "
      "own_getjob_steady_p90_ms=%.1f own_getjob_steady_p99_ms=%.1f wake_steady_p99_ms=%.1f "
      "list_p99_ms=%.1f list_steady_p99_ms=%.1f store_p99_ms=%.1f "
      "cpu_frac=%.3f us_per_report=%.1f rss_mib=%.1f lost_nodes=%d hang_s=%.2f "
      "hang_timeout_s=%.1f named=%d load_mean=%.1f load_max=%.1f run_delay_ms_per_s=%.0f "
      "heartbeat_send_delay_max_ms=%.0f heartbeat_tick_late_max_ms=%.0f reports_per_s=%.0f "
      "batches_per_s=%.0f reports_skipped=%lld loadgen_cpu_frac=%.3f ack_max_ms=%.0f "
      "lease_expiries=%lld "
      "%scorrect=%d\n",
      run.ranks, run.to_running_s, run.launch_cpu_s,
      probe.get_job_latency(Probe::kStart).PercentileMs(0.99),
      probe.get_job_latency(Probe::kSteady).PercentileMs(0.5),
      probe.get_job_latency(Probe::kSteady).PercentileMs(0.9),
      probe.get_job_latency(Probe::kSteady).PercentileMs(0.99),
      probe.own_process_get_job_latency(Probe::kSteady).PercentileMs(0.5),
      probe.own_process_get_job_latency(Probe::kSteady).PercentileMs(0.9),
      probe.own_process_get_job_latency(Probe::kSteady).PercentileMs(0.99),
      probe.wake_delay(Probe::kSteady).PercentileMs(0.99),
      probe.list_latency(Probe::kStart).PercentileMs(0.99),
      probe.list_latency(Probe::kSteady).PercentileMs(0.99), stats.store_latency.PercentileMs(0.99),
      run.cpu_fraction, run.cpu_per_report_us,
      static_cast<double>(probe.max_rss_bytes()) / (1 << 20), run.lost_nodes, run.hang_after_s,
      run.hang_timeout_s, run.named, probe.mean_load(), probe.max_load(),
      run.run_delay_fraction * 1000, stats.heartbeat_delay.PercentileMs(1.0),
      stats.heartbeat_tick_lateness.PercentileMs(1.0), run.reports_per_s, run.batches_per_s,
      static_cast<long long>(stats.reports_skipped.load()), run.loadgen_cpu_fraction,
      stats.ack_delay.PercentileMs(1.0), static_cast<long long>(stats.lease_expiries.load()),
      run.fault != nullptr ? (FaultResultFields(*run.fault, *run.recovery) + " ").c_str() : "",
      run.correct ? 1 : 0);
}

}  // namespace loom::loadgen
