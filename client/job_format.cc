#include "client/job_format.h"

#include <cmath>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rank_list.h"
#include "common/topology/node_labels.h"
#include "nlohmann/json.hpp"

namespace loom::client {

std::string StateName(loom::v1::JobState state) { return loom::v1::JobState_Name(state); }

namespace {

std::string Duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string Rate(double tokens_per_second) {
  if (tokens_per_second >= 1e6) return absl::StrFormat("%.2fM", tokens_per_second / 1e6);
  if (tokens_per_second >= 1e3) return absl::StrFormat("%.1fk", tokens_per_second / 1e3);
  return absl::StrFormat("%.0f", tokens_per_second);
}

std::string Time(int64_t unix_ms) {
  const std::time_t t = unix_ms / 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d %H:%M:%S", &tm);
  return buffer;
}

std::string LayoutText(const loom::v1::Layout& l) {
  return absl::StrFormat("dp=%d tp=%d pp=%d cp=%d ep=%d zero=%d mbs=%d gas=%d %s%s recompute=%s",
                         l.dp(), l.tp(), l.pp(), l.cp(), l.ep(), l.zero_stage(),
                         l.micro_batch_size(), l.grad_accum_steps(), l.schedule(),
                         l.sequence_parallel() ? " sp" : "", l.recompute());
}

// How an incident recovered: "in place, relaunched rank 2, 1 step
// recomputed" or "whole job, 7 steps recomputed (rank 5 and its buddy ...)".
// The steps recomputed are known once the next attempt stepped (in place:
// once the restore step was chosen).
std::string PathSummary(const loom::v1::RecoveryIncident& in) {
  const bool in_place = in.path() == "in_place";
  std::string text = in_place ? "in place" : "whole job";
  if (in_place && in.relaunched_ranks_size() > 0) {
    absl::StrAppend(&text, ", relaunched rank", in.relaunched_ranks_size() > 1 ? "s " : " ",
                    RankList(std::vector<int64_t>(in.relaunched_ranks().begin(),
                                                 in.relaunched_ranks().end())));
  }
  if (in.complete() || in.steps_recomputed() > 0) {
    absl::StrAppend(&text, ", ", in.steps_recomputed(),
                    in.steps_recomputed() == 1 ? " step" : " steps", " recomputed");
  }
  if (!in.fallback_reason().empty()) absl::StrAppend(&text, " (", in.fallback_reason(), ")");
  return text;
}

// One line per recovery: what failed where, each phase of its path's seconds
// ("-" for a phase not reached), the total, then how it recovered.
std::string IncidentLine(const loom::v1::RecoveryIncident& in) {
  std::string line = in.kind();
  if (in.rank() >= 0) absl::StrAppend(&line, " rank ", in.rank());
  if (!in.node_id().empty()) absl::StrAppend(&line, " node ", in.node_id());
  absl::StrAppend(&line, " (attempt ", in.failed_attempt(), "):");
  struct Phase {
    const char* name;
    int64_t from;
    int64_t to;
    double seconds;
  };
  const bool in_place = in.path() == "in_place";
  const Phase second = in_place ? Phase{"abort", in.declared_unix_us(), in.aborted_unix_us(),
                                        in.abort_seconds()}
                                : Phase{"stop", in.declared_unix_us(), in.stopped_unix_us(),
                                        in.stopping_seconds()};
  const int64_t before_placed = in_place ? in.aborted_unix_us() : in.stopped_unix_us();
  const Phase phases[] = {
      {"detect", in.cause_unix_us(), in.declared_unix_us(), in.detection_seconds()},
      second,
      {in_place ? "relaunch" : "place", before_placed, in.placed_unix_us(), in.placement_seconds()},
      {"rendezvous", in.placed_unix_us(), in.ready_unix_us(), in.rendezvous_seconds()},
      {in_place ? "restore" : "load", in.ready_unix_us(), in.resumed_unix_us(),
       in.checkpoint_load_seconds()},
      {"first-step", in.resumed_unix_us(), in.first_step_unix_us(), in.first_step_seconds()},
  };
  for (const auto& p : phases) {
    absl::StrAppend(&line, " ", p.name, " ",
                    p.from != 0 && p.to != 0 ? absl::StrFormat("%.2fs", p.seconds) : "-");
  }
  absl::StrAppend(&line, absl::StrFormat(" total %.2fs", in.total_seconds()));
  if (!in.complete()) absl::StrAppend(&line, in.closed() ? " (cut short)" : " (in progress)");
  // Incidents kept from before paths were recorded say nothing of theirs.
  if (!in.path().empty()) absl::StrAppend(&line, "; ", PathSummary(in));
  return line;
}

}  // namespace

std::string FormatJobTable(const std::vector<loom::v1::Job>& jobs) {
  std::string out = absl::StrFormat("%-12s %-20s %-11s %7s %11s %9s\n", "ID", "NAME", "STATE",
                                    "ATTEMPT", "STEP", "LOSS");
  for (const auto& job : jobs) {
    const auto& p = job.last_progress();
    absl::StrAppend(&out, absl::StrFormat("%-12s %-20s %-11s %7d %11s %9s\n", job.id(), job.name(),
                                          StateName(job.state()), job.attempt(),
                                          absl::StrCat(p.step(), "/", p.total_steps()),
                                          p.step() > 0 ? absl::StrFormat("%.4f", p.loss()) : "-"));
  }
  return out;
}

std::string FormatJobStatus(const loom::v1::Job& job) {
  std::string out;
  absl::StrAppend(&out, "job:       ", job.id(), " (", job.name(), ")\n");
  absl::StrAppend(&out, "state:     ", StateName(job.state()), "\n");
  if (!job.owner().empty()) absl::StrAppend(&out, "owner:     ", job.owner(), "\n");
  absl::StrAppend(&out, "attempt:   ", job.attempt(), " (restarts ", job.restarts(), ": crash ",
                  job.crash_restarts(), ", hang ", job.hang_restarts(), ", lost node ",
                  job.node_restarts(), ")\n");
  if (job.preemptions() > 0) {
    absl::StrAppend(&out, "preempted: ", job.preemptions(),
                    " times (stopped gracefully, resumed from the saved step)\n");
  }
  if (job.has_stop()) absl::StrAppend(&out, "stopping:  ", job.stop().reason(), "\n");
  absl::StrAppend(&out, "layout:    ", LayoutText(job.layout()), "\n");
  if (!job.checkpoint_dir().empty()) {
    absl::StrAppend(&out, "checkpoints: ", job.checkpoint_dir(), "\n");
  }
  const auto& p = job.last_progress();
  if (p.step() > 0) absl::StrAppend(&out, "progress:  ", FormatProgressLine(p), "\n");
  if (!job.failure_reason().empty()) absl::StrAppend(&out, "failure:   ", job.failure_reason(), "\n");
  if (!job.last_diagnosis().empty() && job.last_diagnosis() != job.failure_reason()) {
    absl::StrAppend(&out, "diagnosis: ", job.last_diagnosis(), "\n");
  }
  if (job.first_running_unix_ms() > 0) {
    absl::StrAppend(&out, absl::StrFormat("goodput:   %.3f (%s of steps that counted)\n",
                                          job.goodput(), Duration(job.counted_step_seconds())));
  }
  // Slow ranks the coordinator flags now (docs/observability.md).
  for (const auto& s : job.stragglers()) {
    absl::StrAppend(&out, absl::StrFormat(
        "straggler: rank %d %s on node %s: compute %.2fx its peers' (%.2fx its own earlier), "
        "score %.1f, slows the job %.0f%%, since step %d\n",
        s.rank(), s.place(), s.node_id(), s.peer_ratio(), s.self_ratio(), s.score(),
        100 * s.job_slowdown(), s.since_step()));
  }
  if (job.incidents_size() > 0) {
    absl::StrAppend(&out, "recoveries:\n");
    for (const auto& in : job.incidents()) absl::StrAppend(&out, "  ", IncidentLine(in), "\n");
  }
  if (job.placement_size() > 0) {
    absl::StrAppend(&out, "placement:\n");
    for (const auto& r : job.placement()) {
      absl::StrAppend(&out, absl::StrFormat("  rank %-4d %-28s node %s device %d\n", r.rank(),
                                            r.place(), r.node_id(), r.local_device()));
    }
  }
  if (job.spare_devices_size() > 0) {  // its own hot spares, held idle
    absl::StrAppend(&out, "spares:\n");
    for (const auto& s : job.spare_devices()) {
      absl::StrAppend(&out, absl::StrFormat("  node %s device %d\n", s.node_id(), s.local_device()));
    }
  }
  absl::StrAppend(&out, "history:\n");
  for (const auto& e : job.history()) absl::StrAppend(&out, "  ", FormatEvent(e), "\n");
  return out;
}

namespace {

// The table's last column: a cluster spare, a cordon and its reason.
std::string NodeNote(const loom::v1::Node& n) {
  std::string note = n.spare() ? "spare" : "";
  if (n.cordoned()) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", n.draining() ? "drained: " : "cordoned: ",
                    n.cordon_reason());
  }
  return note.empty() ? "-" : note;
}

}  // namespace

std::string FormatNodeTable(const std::vector<loom::v1::Node>& nodes) {
  std::string out = absl::StrFormat("%-20s %-16s %-5s %-8s %9s %12s  %-24s %s\n", "NODE", "ADDRESS",
                                    "LIVE", "DEVICES", "IN USE", "PEAK/DEV", "LABELS",
                                    "SPARE/CORDON");
  for (const auto& n : nodes) {
    const std::string labels = topology::FormatNodeLabels({n.labels().begin(), n.labels().end()});
    absl::StrAppend(&out, absl::StrFormat("%-20s %-16s %-5s %-8s %9d %9.1f TF  %-24s %s\n",
                                          n.node_id(), n.address(), n.live() ? "yes" : "LOST",
                                          absl::StrCat(n.device_count(), "x", n.device_kind()),
                                          n.devices_in_use(), n.peak_flops_per_device() / 1e12,
                                          labels.empty() ? "-" : labels, NodeNote(n)));
  }
  return out;
}

std::string FormatEvent(const loom::v1::JobEvent& event) {
  return absl::StrCat(Time(event.time_unix_ms()), "  ", StateName(event.state()), "  ",
                      event.message());
}

std::string FormatProgressLine(const loom::v1::JobProgress& p) {
  std::string line = absl::StrFormat("step %d/%d  loss %.4f", p.step(), p.total_steps(), p.loss());
  if (p.has_val_loss()) absl::StrAppend(&line, absl::StrFormat("  val %.4f", p.val_loss()));
  absl::StrAppend(&line, absl::StrFormat("  %s tok/s  MFU %.1f%%  ETA %s  (attempt %d)",
                                         Rate(p.tokens_per_second()), 100.0 * p.mfu(),
                                         Duration(p.eta_seconds()), p.attempt()));
  if (p.skipped_steps() > 0) {
    absl::StrAppend(&line, absl::StrFormat("  skipped %d (last: %s)", p.skipped_steps(),
                                           p.last_bad_step()));
  }
  return line;
}

std::string FormatProgressJson(const loom::v1::JobProgress& p) {
  nlohmann::json j = {{"step", p.step()},
                      {"total_steps", p.total_steps()},
                      {"loss", p.loss()},
                      {"tokens", p.tokens()},
                      {"step_seconds", p.step_seconds()},
                      {"tokens_per_second", p.tokens_per_second()},
                      {"mfu", p.mfu()},
                      {"attempt", p.attempt()},
                      {"lr", p.lr()},
                      {"grad_norm", p.grad_norm()},
                      {"max_memory_bytes", p.max_memory_bytes()},
                      {"time_unix_ms", p.time_unix_ms()}};
  if (p.has_val_loss()) j["val_loss"] = p.val_loss();
  if (p.skipped_steps() > 0) {
    j["skipped_steps"] = p.skipped_steps();
    j["last_bad_step"] = p.last_bad_step();
  }
  return j.dump();
}

}  // namespace loom::client
