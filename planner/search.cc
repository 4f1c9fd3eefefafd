// Enumeration, validation and ranking of layouts.
#include "planner/search.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/snapshot_generations.h"
#include "common/spec/job_spec_rules.h"

namespace loom::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

std::vector<int64_t> Choices(const std::optional<int64_t>& fixed, int64_t n) {
  if (fixed) return {*fixed};
  return Divisors(n);
}

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// The rules of one axis, independent of the others: the rulebook's
// (common/spec/job_spec_rules.h, the same at submission and in the engine),
// plus what this search chooses not to try (TP across nodes, uneven stages).
spec::AxisShape ShapeOf(const Workload& w) {
  const ModelShape& m = w.model;
  return {m.num_heads,  m.num_kv_heads, m.ffn_hidden_size, m.vocab_size,
          m.num_layers, w.seq_len,    m.num_experts};
}

absl::Status FirstBroken(const std::vector<std::string>& broken) {
  return broken.empty() ? absl::OkStatus() : Invalid(broken.front());
}

absl::Status CheckTp(const Workload& w, const ClusterSpec& c, int64_t tp, const SearchSpace& s) {
  if (absl::Status st = FirstBroken(spec::CheckTpSplit(ShapeOf(w), tp)); !st.ok()) return st;
  if (s.tp_within_node && tp > c.devices_per_node) {
    return Invalid(absl::StrCat("parallelism.tp=", tp, " must fit inside a node of ",
                                c.devices_per_node, " devices"));
  }
  return absl::OkStatus();
}

absl::Status CheckCp(const Workload& w, int64_t cp) {
  return FirstBroken(spec::CheckCpSplit(ShapeOf(w), cp));
}

absl::Status CheckPp(const Workload& w, int64_t pp, const SearchSpace& s) {
  const bool interleaved = s.schedule == spec::Schedule::kInterleaved && pp > 1;
  const int64_t virtual_stages = interleaved ? s.virtual_stages : 1;
  if (absl::Status st = FirstBroken(spec::CheckPpSplit(ShapeOf(w), pp, virtual_stages)); !st.ok()) {
    return st;
  }
  const int64_t layers = w.model.num_layers, chunks = pp * virtual_stages;
  if (!s.allow_uneven_stages && layers % chunks != 0) {
    return Invalid(absl::StrCat("parallelism.pp=", pp,
                                interleaved ? absl::StrCat(" x virtual_stages=", s.virtual_stages) : "",
                                " must divide model.num_layers=", layers));
  }
  return absl::OkStatus();
}

absl::Status CheckEp(const Workload& w, int64_t ep) {
  return FirstBroken(spec::CheckEpSplit(ShapeOf(w), ep));
}

// The rulebook's rules on the layout's own numbers (the batch split, the ZeRO
// stage, the schedule), and grad_accum as the batch split defines it.
absl::Status CheckLayoutRules(const Workload& w, const Layout& l) {
  if (absl::Status st = FirstBroken(spec::CheckBatchSplit(w.global_batch, l)); !st.ok()) return st;
  const int64_t per_step = l.micro_batch_size * l.data_replicas();
  if (l.grad_accum * per_step != w.global_batch) {
    return Invalid(absl::StrCat("train.global_batch_size=", w.global_batch,
                                " must equal micro_batch_size*grad_accum*dp", l.ep > 1 ? "*ep" : "",
                                "=", l.micro_batch_size, "*", l.grad_accum, "*", l.dp,
                                l.ep > 1 ? absl::StrCat("*", l.ep) : ""));
  }
  if (absl::Status st = FirstBroken(spec::CheckZeroStage(l.zero_stage)); !st.ok()) return st;
  return FirstBroken(spec::CheckSchedule(l));
}

}  // namespace

std::string Rejection::Reason() const {
  const MemoryBreakdown& m = memory;
  if (m.total() <= capacity_bytes && host_capacity_bytes > 0 &&
      host_bytes_per_node > host_capacity_bytes) {
    return absl::StrFormat(
        "out of host memory: a node's ranks hold %.1f GiB of in-place recovery snapshots (%.1f "
        "GiB per rank: %d generations of its state and %d of its ward's) of the node's %.1f "
        "GiB (resources.host_memory_mb; fault_tolerance.snapshot_interval: 0 keeps none)",
        host_bytes_per_node / kGiB, m.host_bytes() / kGiB,
        static_cast<int>(kOwnSnapshotGenerations), static_cast<int>(kWardSnapshotGenerations),
        host_capacity_bytes / kGiB);
  }
  return absl::StrFormat(
      "out of memory: needs %.1f GiB on pipeline stage %d of a %.1f GiB device (weights %.1f, "
      "gradients %.1f, optimizer %.1f, activations %.1f for %d micro-batches, logits %.1f, "
      "zero3 %.1f, buffers %.1f, overhead %.1f%s GiB)",
      m.total() / kGiB, m.stage, capacity_bytes / kGiB, m.weights / kGiB, m.gradients / kGiB,
      m.optimizer / kGiB, m.activations / kGiB, m.micro_batches_in_flight, m.logits / kGiB,
      m.zero3_gathered / kGiB, m.comm_buffers / kGiB, m.overhead / kGiB,
      m.snapshots_on_device && m.snapshots > 0
          ? absl::StrFormat(", snapshots %.1f", m.snapshots / kGiB)
          : "");
}

absl::Status ValidateLayout(const Workload& w, const ClusterSpec& c, const Layout& l,
                            const SearchSpace& s) {
  if (absl::Status st = CheckTp(w, c, l.tp, s); !st.ok()) return st;
  if (absl::Status st = CheckCp(w, l.cp); !st.ok()) return st;
  SearchSpace schedule = s;
  schedule.schedule = l.schedule;
  schedule.virtual_stages = l.virtual_stages;
  if (absl::Status st = CheckPp(w, l.pp, schedule); !st.ok()) return st;
  if (absl::Status st = CheckEp(w, l.ep); !st.ok()) return st;
  if (l.dp < 1) return Invalid(absl::StrCat("parallelism.dp=", l.dp, " must be at least 1"));
  if (l.world() != c.world_size()) {
    return Invalid(absl::StrCat("parallelism: dp*tp*pp*cp*ep=", l.world(), " must equal the ",
                                c.world_size(), " ranks of resources"));
  }
  return CheckLayoutRules(w, l);
}

std::vector<Layout> EnumerateLayouts(const Workload& w, const ClusterSpec& c,
                                     const SearchSpace& s) {
  std::vector<Layout> out;
  const int64_t world = c.world_size();
  std::vector<spec::Recompute> recomputes =
      s.recompute ? std::vector<spec::Recompute>{*s.recompute}
                  : std::vector<spec::Recompute>{spec::Recompute::kNone,
                                                 spec::Recompute::kSelective,
                                                 spec::Recompute::kFull};
  // The axes are cut with the rulebook's per-axis rules as they are chosen;
  // each layout then keeps only if the rules on its own numbers hold (the
  // batch split, the ZeRO stage, the schedule: CheckLayoutRules).
  for (int64_t tp : Choices(s.tp, world)) {
    if (world % tp != 0 || !CheckTp(w, c, tp, s).ok()) continue;
    for (int64_t cp : Choices(s.cp, world / tp)) {
      if ((world / tp) % cp != 0 || !CheckCp(w, cp).ok()) continue;
      for (int64_t pp : Choices(s.pp, world / (tp * cp))) {
        if ((world / (tp * cp)) % pp != 0 || !CheckPp(w, pp, s).ok()) continue;
        // [moe] ep: the divisors of what is left (CheckEp keeps those dividing the experts).
        for (int64_t ep : Choices(s.ep, w.model.num_experts > 0 ? world / (tp * cp * pp) : 1)) {
          if (!CheckEp(w, ep).ok() || (world / (tp * cp * pp)) % ep != 0) continue;
          const int64_t dp = world / (tp * cp * pp * ep);
          if (s.dp && *s.dp != dp) continue;
          // Sequences per step on each of the dp x ep ranks with their own
          // data; the micro-batch sizes tried divide it.
          const int64_t per_dp = w.global_batch / (dp * ep);
          const int max_zero = (dp * cp == 1) ? 0 : s.max_zero_stage;  // nothing to shard
          // (schedule, virtual stages) pairs: the space's, or every schedule.
          std::vector<std::pair<spec::Schedule, int64_t>> schedules = {
              {s.schedule, s.virtual_stages}};
          if (s.search_schedules && pp > 1) {
            schedules = {{spec::Schedule::k1F1B, 1}, {spec::Schedule::kAfab, 1}};
            if (s.allow_interleaved) schedules.push_back({spec::Schedule::kInterleaved, 2});
          }
          std::vector<bool> sps = {s.sequence_parallel ? *s.sequence_parallel : tp > 1};
          if (s.search_schedules && !s.sequence_parallel && tp > 1) sps = {true, false};
          for (const auto& [schedule, virtual_stages] : schedules) {
            const bool interleaved = schedule == spec::Schedule::kInterleaved && pp > 1;
            SearchSpace chunks = s;  // the stage split of this schedule's chunks
            chunks.schedule = schedule;
            chunks.virtual_stages = virtual_stages;
            if (interleaved && !CheckPp(w, pp, chunks).ok()) continue;
            for (bool sp : sps)
            for (int64_t mbs : Choices(s.micro_batch_size, per_dp)) {
              for (int zero = 0; zero <= 3; ++zero) {
                if (s.zero_stage ? zero != *s.zero_stage : zero > max_zero) continue;
                for (spec::Recompute rc : recomputes) {
                  Layout l;
                  l.dp = dp;
                  l.tp = tp;
                  l.pp = pp;
                  l.cp = cp;
                  l.ep = ep;
                  l.zero_stage = zero;
                  l.micro_batch_size = mbs;
                  l.grad_accum = mbs > 0 ? per_dp / mbs : 0;
                  l.schedule = pp > 1 ? schedule : spec::Schedule::k1F1B;
                  l.virtual_stages = interleaved ? virtual_stages : 1;
                  l.sequence_parallel = sp;
                  l.recompute = rc;
                  if (!CheckLayoutRules(w, l).ok()) continue;
                  if (s.accept && !s.accept(l)) continue;
                  out.push_back(l);
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

Candidate EvaluateLayout(const Workload& w, const ClusterSpec& c, const PlannerConstants& k,
                         const Layout& l) {
  Candidate cand;
  cand.layout = l;
  cand.memory = EstimateMemory(w, l, k);
  cand.host_bytes_per_node = HostBytesPerNode(c, cand.memory);
  cand.time = EstimateStepTime(w, l, c, k);
  return cand;
}

double HostBytesPerNode(const ClusterSpec& c, const MemoryBreakdown& m) {
  return m.host_bytes() * static_cast<double>(c.devices_per_node);
}

std::optional<Rejection> CheckFits(const ClusterSpec& c, const Layout& l,
                                   const MemoryBreakdown& m) {
  const Rejection rejection{l, m, c.memory_bytes, HostBytesPerNode(c, m), c.host_memory_bytes};
  if (m.total() > c.memory_bytes) return rejection;
  if (c.host_memory_bytes > 0 && rejection.host_bytes_per_node > c.host_memory_bytes) {
    return rejection;
  }
  return std::nullopt;
}

absl::StatusOr<PlanResult> PlanLayouts(const PlanRequest& req) {
  const Workload& w = req.workload;
  const ClusterSpec& c = req.cluster;
  const SearchSpace& s = req.space;
  if (w.global_batch < 1) return Invalid("train.global_batch_size must be at least 1");
  if (w.seq_len < 1) return Invalid("train.seq_len must be at least 1");
  std::vector<Layout> layouts = EnumerateLayouts(w, c, s);
  if (layouts.empty()) {
    // Name the first fixed axis that breaks a rule on its own, else say why.
    if (s.tp) {
      if (absl::Status st = CheckTp(w, c, *s.tp, s); !st.ok()) return st;
    }
    if (s.cp) {
      if (absl::Status st = CheckCp(w, *s.cp); !st.ok()) return st;
    }
    if (s.pp) {
      if (absl::Status st = CheckPp(w, *s.pp, s); !st.ok()) return st;
    }
    if (s.ep) {
      if (absl::Status st = CheckEp(w, *s.ep); !st.ok()) return st;
    }
    return Invalid(absl::StrCat(
        "no layout of ", c.world_size(), " ranks satisfies the rules: dp*tp*pp*cp*ep must equal the ",
        "ranks, train.global_batch_size=", w.global_batch,
        " must be divisible by dp*micro_batch_size, tp must divide the heads and fit in a node, pp ",
        "must divide the layers; fixed axes and micro_batch_size must agree with these",
        s.accept ? ", and the engine must run the layout" : ""));
  }
  PlanResult result;
  result.layouts_considered = static_cast<int64_t>(layouts.size());
  result.ranked.reserve(layouts.size());
  for (const Layout& l : layouts) {
    Candidate cand;
    cand.layout = l;
    cand.memory = EstimateMemory(w, l, req.constants);
    if (std::optional<Rejection> rejected = CheckFits(c, l, cand.memory)) {
      result.rejected.push_back(*std::move(rejected));
      continue;
    }
    cand.host_bytes_per_node = HostBytesPerNode(c, cand.memory);
    cand.tight = cand.memory.total() > (1.0 - req.space.memory_headroom) * c.memory_bytes;
    cand.time = EstimateStepTime(w, l, c, req.constants);
    result.ranked.push_back(std::move(cand));
  }
  // Layouts with headroom first; ties (equal predicted time) go to the
  // smaller memory footprint, then to enumeration order, so the answer is
  // deterministic.
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.tight != b.tight) return !a.tight;
                     if (a.time.total != b.time.total) return a.time.total < b.time.total;
                     return a.memory.total() < b.memory.total();
                   });
  return result;
}

}  // namespace loom::planner
