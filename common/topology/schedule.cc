#include "common/topology/schedule.h"

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::topology {
namespace {

std::vector<Instruction> AfabOrder(int64_t m) {
  std::vector<Instruction> out;
  for (int64_t mb = 0; mb < m; ++mb) out.push_back(Instruction::Forward(mb, 0));
  for (int64_t mb = 0; mb < m; ++mb) out.push_back(Instruction::Backward(mb, 0));
  return out;
}

std::vector<Instruction> OneFOneBOrder(int64_t p, int64_t s, int64_t m) {
  const int64_t warmup = std::min(p - s - 1, m);
  std::vector<Instruction> out;
  for (int64_t mb = 0; mb < warmup; ++mb) out.push_back(Instruction::Forward(mb, 0));
  for (int64_t i = 0; i < m - warmup; ++i) {
    out.push_back(Instruction::Forward(warmup + i, 0));
    out.push_back(Instruction::Backward(i, 0));
  }
  for (int64_t mb = m - warmup; mb < m; ++mb) out.push_back(Instruction::Backward(mb, 0));
  return out;
}

// Megatron's interleaved order. Virtual micro-batch k (0 <= k < m*v) walks
// groups of pp micro-batches through the chunks: forward chunks ascend within
// a group of pp*v, backward chunks descend.
std::vector<Instruction> InterleavedOrder(int64_t p, int64_t v, int64_t s, int64_t m) {
  const int64_t total = m * v;
  auto mb_of = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  auto fwd_chunk = [&](int64_t k) { return (k % (p * v)) / p; };
  auto bwd_chunk = [&](int64_t k) { return v - 1 - fwd_chunk(k); };
  const int64_t warmup = m == p ? total : std::min((p - s - 1) * 2 + (v - 1) * p, total);
  const int64_t steady = total - warmup;
  std::vector<Instruction> out;
  for (int64_t k = 0; k < warmup; ++k) out.push_back(Instruction::Forward(mb_of(k), fwd_chunk(k)));
  for (int64_t i = 0; i < steady; ++i) {
    const int64_t kf = warmup + i;
    out.push_back(Instruction::Forward(mb_of(kf), fwd_chunk(kf)));
    out.push_back(Instruction::Backward(mb_of(i), bwd_chunk(i)));
  }
  for (int64_t k = steady; k < total; ++k) out.push_back(Instruction::Backward(mb_of(k), bwd_chunk(k)));
  return out;
}

// A message between stages, labelled with the receiver's chunk.
struct Message {
  bool gradient = false;
  int64_t mb = 0;
  int64_t sender_chunk = 0;
  int64_t to = 0;
  int64_t receiver_chunk = 0;
};

struct StageRun {
  std::vector<Instruction> compute;
  size_t next = 0;
  bool computing = false;
  double busy_until = 0;
  std::optional<Message> pending;                      // produced, not yet delivered
  std::set<std::tuple<bool, int64_t, int64_t>> inbox;  // (gradient, mb, chunk) available
  std::vector<Instruction> out;
};

// Places transfers into per-stage compute orders by running them in time; see
// the header for why the result cannot deadlock.
absl::StatusOr<std::vector<std::vector<Instruction>>> PlaceTransfers(
    const std::vector<std::vector<Instruction>>& compute, int64_t p, int64_t v) {
  const int64_t k_last = p * v - 1;
  std::vector<StageRun> st(p);
  for (int64_t s = 0; s < p; ++s) st[s].compute = compute[s];

  // The message a finished compute produces, or nullopt at the model's ends;
  // a message to the same stage (pp = 1) is delivered in place.
  auto output_of = [&](int64_t s, const Instruction& in) -> std::optional<Message> {
    const int64_t vs = in.chunk * p + s;
    const bool fwd = in.op == OpKind::kForward;
    if ((fwd && vs == k_last) || (!fwd && vs == 0)) return std::nullopt;
    const int64_t target = fwd ? vs + 1 : vs - 1;
    return Message{!fwd, in.microbatch, in.chunk, target % p, target / p};
  };
  auto input_ready = [&](int64_t s, const Instruction& in) {
    const int64_t vs = in.chunk * p + s;
    const bool fwd = in.op == OpKind::kForward;
    if ((fwd && vs == 0) || (!fwd && vs == k_last)) return true;
    return st[s].inbox.count({!fwd, in.microbatch, in.chunk}) > 0;
  };

  double now = 0;
  while (true) {
    bool changed = true;
    while (changed) {
      changed = false;
      for (int64_t s = 0; s < p; ++s) {
        StageRun& a = st[s];
        if (a.computing || !a.pending) continue;
        StageRun& b = st[a.pending->to];
        if (b.computing) continue;
        const Message& msg = *a.pending;
        if (msg.gradient) {
          a.out.push_back(Instruction::SendGradient(msg.to, msg.mb, msg.sender_chunk));
          b.out.push_back(Instruction::RecvGradient(s, msg.mb, msg.receiver_chunk));
        } else {
          a.out.push_back(Instruction::SendActivation(msg.to, msg.mb, msg.sender_chunk));
          b.out.push_back(Instruction::RecvActivation(s, msg.mb, msg.receiver_chunk));
        }
        b.inbox.insert({msg.gradient, msg.mb, msg.receiver_chunk});
        a.pending.reset();
        changed = true;
      }
      for (int64_t s = 0; s < p; ++s) {
        StageRun& a = st[s];
        if (a.computing || a.pending || a.next >= a.compute.size()) continue;
        const Instruction& in = a.compute[a.next];
        if (!input_ready(s, in)) continue;
        a.out.push_back(in);
        a.computing = true;
        a.busy_until = now + (in.op == OpKind::kForward ? 1.0 : 2.0);
        changed = true;
      }
    }
    double earliest = -1;
    bool unfinished = false;
    for (const StageRun& a : st) {
      if (a.computing && (earliest < 0 || a.busy_until < earliest)) earliest = a.busy_until;
      if (a.computing || a.pending || a.next < a.compute.size()) unfinished = true;
    }
    if (!unfinished) break;
    if (earliest < 0) {
      return absl::InternalError("pipeline schedule: compute order cannot complete");
    }
    now = earliest;
    for (int64_t s = 0; s < p; ++s) {
      StageRun& a = st[s];
      if (!a.computing || a.busy_until != now) continue;
      a.computing = false;
      const Instruction& done = a.compute[a.next++];
      std::optional<Message> msg = output_of(s, done);
      if (msg && msg->to == s) {
        a.inbox.insert({msg->gradient, msg->mb, msg->receiver_chunk});
      } else {
        a.pending = msg;
      }
    }
  }
  std::vector<std::vector<Instruction>> out;
  for (StageRun& a : st) out.push_back(std::move(a.out));
  return out;
}

}  // namespace

absl::Status ValidateScheduleRequest(const ScheduleRequest& r) {
  if (r.pp < 1) return absl::InvalidArgumentError(absl::StrCat("pp=", r.pp, " must be >= 1"));
  if (r.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatches=", r.microbatches, " must be >= 1"));
  }
  if (r.virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual_stages=", r.virtual_stages, " must be >= 1"));
  }
  if (r.virtual_stages > 1 && r.kind != ScheduleKind::kInterleaved) {
    return absl::InvalidArgumentError(absl::StrCat(
        "virtual_stages=", r.virtual_stages, " needs schedule interleaved, not ",
        spec::ScheduleName(r.kind)));
  }
  if (r.kind == ScheduleKind::kInterleaved && r.virtual_stages > 1 && r.microbatches % r.pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule interleaved needs microbatches (", r.microbatches,
        ") to be a multiple of pp=", r.pp,
        "; micro-batches go through the chunks in groups of pp"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<Instruction>>> ComputeOrder(const ScheduleRequest& r) {
  if (absl::Status s = ValidateScheduleRequest(r); !s.ok()) return s;
  std::vector<std::vector<Instruction>> out;
  for (int64_t s = 0; s < r.pp; ++s) {
    switch (r.kind) {
      case ScheduleKind::kAfab:
        out.push_back(AfabOrder(r.microbatches));
        break;
      case ScheduleKind::k1F1B:
        out.push_back(OneFOneBOrder(r.pp, s, r.microbatches));
        break;
      case ScheduleKind::kInterleaved:
        out.push_back(r.virtual_stages == 1
                          ? OneFOneBOrder(r.pp, s, r.microbatches)
                          : InterleavedOrder(r.pp, r.virtual_stages, s, r.microbatches));
        break;
    }
  }
  return out;
}

absl::StatusOr<PipelineSchedule> BuildSchedule(const ScheduleRequest& r) {
  absl::StatusOr<std::vector<std::vector<Instruction>>> compute = ComputeOrder(r);
  if (!compute.ok()) return compute.status();
  absl::StatusOr<std::vector<std::vector<Instruction>>> lists =
      PlaceTransfers(*compute, r.pp, r.virtual_stages);
  if (!lists.ok()) return lists.status();
  PipelineSchedule out;
  out.kind = r.kind;
  out.pp = r.pp;
  out.virtual_stages = r.virtual_stages;
  out.microbatches = r.microbatches;
  out.stages = std::move(*lists);
  for (std::vector<Instruction>& list : out.stages) {
    list.push_back(Instruction::ReduceGradients());
    list.push_back(Instruction::OptimizerStep());
  }
  return out;
}

double AnalyticBubbleFraction(const ScheduleRequest& r) {
  const double p = static_cast<double>(r.pp);
  const double m = static_cast<double>(r.microbatches);
  const double v = r.kind == ScheduleKind::kInterleaved ? static_cast<double>(r.virtual_stages) : 1;
  return (p - 1) / (v * m);
}

int64_t PeakActivations(const std::vector<Instruction>& instructions) {
  int64_t live = 0, peak = 0;
  for (const Instruction& in : instructions) {
    if (in.op == OpKind::kForward) peak = std::max(peak, ++live);
    if (in.op == OpKind::kBackward) --live;
  }
  return peak;
}

}  // namespace loom::topology
