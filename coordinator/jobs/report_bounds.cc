#include "coordinator/jobs/report_bounds.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_limits.h"

namespace loom::coordinator {
namespace {

absl::Status Beyond(const std::string& field, int64_t n, const std::string& rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("RankProgress.", field, " is ", n, "; ", rule));
}

absl::Status CheckString(const std::string& field, const std::string& value, int max_bytes) {
  if (static_cast<int64_t>(value.size()) > max_bytes) {
    return Beyond(absl::StrCat(field, " (bytes)"), static_cast<int64_t>(value.size()),
                  absl::StrCat("at most ", max_bytes));
  }
  // These strings reach logs, watchers and failure reasons.
  for (unsigned char c : value) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("RankProgress.", field, " must be printable ASCII"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const std::string& field, int64_t n, int64_t lo, int64_t hi,
                        const std::string& why) {
  if (n < lo || n > hi) {
    return Beyond(field, n, absl::StrCat("must be in [", lo, ", ", hi, "] (", why, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckMoe(const spec::JobSpec& spec, const loom::v1::MoeProgress& moe) {
  const int64_t experts = spec.model.moe.num_experts;
  if (moe.tokens_per_expert_size() > experts) {
    return Beyond("moe.tokens_per_expert (entries)", moe.tokens_per_expert_size(),
                  absl::StrCat("the job has model.moe.num_experts=", experts));
  }
  for (double v : moe.tokens_per_expert()) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          "RankProgress.moe.tokens_per_expert entries must be finite and not negative");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSnapshots(int64_t world, const loom::v1::SnapshotHoldings& s) {
  if (s.own_steps_size() > kMaxReportSnapshotSteps) {
    return Beyond("snapshots.own_steps (entries)", s.own_steps_size(),
                  absl::StrCat("at most ", kMaxReportSnapshotSteps));
  }
  if (s.ward_steps_size() > kMaxReportSnapshotSteps) {
    return Beyond("snapshots.ward_steps (entries)", s.ward_steps_size(),
                  absl::StrCat("at most ", kMaxReportSnapshotSteps));
  }
  return CheckRange("snapshots.ward_rank", s.ward_rank(), -1, world - 1, "a rank of the job or -1");
}

}  // namespace

absl::Status CheckReportTrace(const loom::v1::RankProgress& report) {
  const loom::v1::StepTrace& t = report.trace();
  if (t.step() != report.step()) {
    return Beyond("trace.step", t.step(), absl::StrCat("must be the report's step ", report.step()));
  }
  if (t.tracks_size() > kMaxReportTraceTracks) {
    return Beyond("trace.tracks (entries)", t.tracks_size(),
                  absl::StrCat("at most ", kMaxReportTraceTracks));
  }
  if (t.names_size() > kMaxReportTraceNames) {
    return Beyond("trace.names (entries)", t.names_size(),
                  absl::StrCat("at most ", kMaxReportTraceNames));
  }
  if (t.events_size() > kMaxReportTraceEvents) {
    return Beyond("trace.events (entries)", t.events_size(),
                  absl::StrCat("at most ", kMaxReportTraceEvents));
  }
  for (const std::string& track : t.tracks()) {
    if (absl::Status s = CheckString("trace.tracks", track, kMaxReportGroupNameBytes); !s.ok()) {
      return s;
    }
  }
  for (const std::string& name : t.names()) {
    if (absl::Status s = CheckString("trace.names", name, kMaxReportOpBytes); !s.ok()) return s;
  }
  if (t.start_unix_us() < 0 || t.end_us() < 0 || t.dropped_events() < 0) {
    return absl::InvalidArgumentError(
        "RankProgress.trace start_unix_us, end_us and dropped_events must not be negative");
  }
  for (const loom::v1::TraceEvent& e : t.events()) {
    if (absl::Status s = CheckRange("trace.events.track", e.track(), 0, t.tracks_size() - 1,
                                    "an index into trace.tracks");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckRange("trace.events.name", e.name(), 0, t.names_size() - 1,
                                    "an index into trace.names");
        !s.ok()) {
      return s;
    }
    if (e.start_us() < 0 || e.duration_us() < 0 || e.bytes() < 0 || e.blocked_us() < 0) {
      return absl::InvalidArgumentError(
          "RankProgress.trace.events start_us, duration_us, bytes and blocked_us must not be "
          "negative");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckReportBounds(const spec::JobSpec& spec, int64_t world,
                               const loom::v1::RankProgress& report) {
  // The size first: nothing below walks more than this many bytes.
  const size_t bytes = report.ByteSizeLong();
  if (bytes > static_cast<size_t>(kMaxReportBytes)) {
    return Beyond("(encoded bytes)", static_cast<int64_t>(bytes),
                  absl::StrCat("a report may be at most ", kMaxReportBytes, " bytes"));
  }
  if (absl::Status s = CheckString("phase", report.phase(), kMaxReportPhaseBytes); !s.ok()) {
    return s;
  }
  const int64_t steps = spec.train.steps;
  if (absl::Status s = CheckRange("step", report.step(), 0, steps, "train.steps"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("resumed_step", report.resumed_step(), 0, steps, "train.steps");
      !s.ok()) {
    return s;
  }
  // Micro-batches of one step on one DP replica: at most all of the step's.
  const int64_t micro_batches =
      spec.train.micro_batch_size > 0 ? spec.train.global_batch_size / spec.train.micro_batch_size
                                      : 0;
  if (absl::Status s = CheckRange("micro_batch", report.micro_batch(), -1, micro_batches,
                                  "the step's micro-batches");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("chunk", report.chunk(), -1,
                                  spec::JobSpecLimits{}.max_virtual_stages, "virtual stages");
      !s.ok()) {
    return s;
  }
  if (report.memory_bytes() < 0) return Beyond("memory_bytes", report.memory_bytes(), "not negative");
  if (report.groups_size() > kMaxReportGroups) {
    return Beyond("groups (entries)", report.groups_size(),
                  absl::StrCat("at most ", kMaxReportGroups));
  }
  for (const loom::v1::GroupProgress& g : report.groups()) {
    if (absl::Status s = CheckString("groups.group", g.group(), kMaxReportGroupNameBytes); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckString("groups.current_op", g.current_op(), kMaxReportOpBytes);
        !s.ok()) {
      return s;
    }
  }
  if (report.has_moe()) {
    if (absl::Status s = CheckMoe(spec, report.moe()); !s.ok()) return s;
  }
  if (report.has_snapshots()) {
    if (absl::Status s = CheckSnapshots(world, report.snapshots()); !s.ok()) return s;
  }
  if (report.has_trace()) {
    if (absl::Status s = CheckReportTrace(report); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom::coordinator
