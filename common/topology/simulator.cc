#include "common/topology/simulator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::topology {
namespace {

using Key = std::pair<int64_t, int64_t>;  // (micro-batch, chunk)

struct InFlight {
  Instruction send;
  double arrival = 0;
};

struct Stage {
  size_t pc = 0;
  double t = 0;
  double busy = 0;
  int64_t live = 0;
  int64_t peak = 0;
  std::set<Key> forwarded, backwarded;
  std::set<std::tuple<bool, int64_t, int64_t>> inbox;  // (gradient, mb, chunk)
  bool reduced = false;
  bool stepped = false;
};

class Simulator {
 public:
  Simulator(const std::vector<std::vector<Instruction>>& lists, int64_t v, int64_t m,
            const SimOptions& options)
      : lists_(lists), p_(static_cast<int64_t>(lists.size())), v_(v), m_(m), opt_(options),
        st_(lists.size()) {}

  absl::StatusOr<SimReport> Run() {
    if (p_ < 1) return absl::InvalidArgumentError("no stages to simulate");
    if (v_ < 1 || m_ < 1) {
      return absl::InvalidArgumentError(absl::StrCat("virtual_stages=", v_, " and microbatches=",
                                                     m_, " must be >= 1"));
    }
    bool progress = true;
    while (progress) {
      progress = false;
      for (int64_t s = 0; s < p_; ++s) {
        while (st_[s].pc < lists_[s].size()) {
          absl::StatusOr<bool> advanced = Step(s);
          if (!advanced.ok()) return advanced.status();
          if (!*advanced) break;
          progress = true;
        }
      }
    }
    SimReport report;
    for (int64_t s = 0; s < p_; ++s) {
      if (st_[s].pc < lists_[s].size()) {
        report.deadlocked = true;
        absl::StrAppend(&report.deadlock, report.deadlock.empty() ? "" : "; ", "stage ", s,
                        " blocked at #", st_[s].pc, " ",
                        FormatInstruction(lists_[s][st_[s].pc]));
      }
    }
    double max_busy = 0;
    for (int64_t s = 0; s < p_; ++s) {
      const Stage& a = st_[s];
      report.stages.push_back({a.busy, a.t, a.peak});
      report.makespan = std::max(report.makespan, a.t);
      max_busy = std::max(max_busy, a.busy);
      if (report.deadlocked) continue;
      const int64_t expected = m_ * v_;
      if (static_cast<int64_t>(a.forwarded.size()) != expected ||
          static_cast<int64_t>(a.backwarded.size()) != expected) {
        return absl::FailedPreconditionError(absl::StrCat(
            "stage ", s, " ran ", a.forwarded.size(), " forwards and ", a.backwarded.size(),
            " backwards; every (micro-batch, chunk) needs one of each: ", expected));
      }
    }
    report.bubble_fraction = max_busy > 0 ? (report.makespan - max_busy) / max_busy : 0.0;
    return report;
  }

 private:
  int64_t Vs(int64_t stage, int64_t chunk) const { return chunk * p_ + stage; }
  int64_t Owner(int64_t vs) const { return vs % p_; }
  int64_t ChunkOf(int64_t vs) const { return vs / p_; }

  absl::Status Bad(int64_t s, const std::string& why) const {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", s, " instruction #", st_[s].pc, " ", FormatInstruction(lists_[s][st_[s].pc]),
        ": ", why));
  }

  // Whether the input of a forward (gradient=false) or backward is present.
  bool HasInput(int64_t s, bool gradient, int64_t mb, int64_t chunk) const {
    const int64_t vs = Vs(s, chunk);
    const int64_t src = gradient ? vs + 1 : vs - 1;
    if (src < 0 || src >= p_ * v_) return true;  // model's ends
    if (Owner(src) == s) {                        // pp = 1: same stage, in memory
      const Key k{mb, ChunkOf(src)};
      return gradient ? st_[s].backwarded.count(k) > 0 : st_[s].forwarded.count(k) > 0;
    }
    return st_[s].inbox.count({gradient, mb, chunk}) > 0;
  }

  absl::Status CheckSend(int64_t s, const Instruction& in) const {
    const bool grad = in.op == OpKind::kSendGradient;
    const Key k{in.microbatch, in.chunk};
    if (!(grad ? st_[s].backwarded.count(k) : st_[s].forwarded.count(k))) {
      return Bad(s, grad ? "sends a gradient before its backward ran"
                         : "sends an activation before its forward ran");
    }
    const int64_t target = Vs(s, in.chunk) + (grad ? -1 : 1);
    if (target < 0 || target >= p_ * v_) return Bad(s, "there is no next chunk to send to");
    if (Owner(target) != in.peer) {
      return Bad(s, absl::StrCat("the next chunk lives on stage ", Owner(target)));
    }
    return absl::OkStatus();
  }

  bool Matches(int64_t s, const Instruction& send, int64_t d, const Instruction& recv) const {
    const bool grad = send.op == OpKind::kSendGradient;
    return (grad ? recv.op == OpKind::kRecvGradient : recv.op == OpKind::kRecvActivation) &&
           recv.microbatch == send.microbatch &&
           Vs(d, recv.chunk) == Vs(s, send.chunk) + (grad ? -1 : 1);
  }

  void Deliver(int64_t d, const Instruction& recv, double at) {
    st_[d].inbox.insert({recv.op == OpKind::kRecvGradient, recv.microbatch, recv.chunk});
    st_[d].t = std::max(st_[d].t, at);
    ++st_[d].pc;
  }

  // Executes stage s's current instruction if it can; false when blocked.
  absl::StatusOr<bool> Step(int64_t s) {
    Stage& a = st_[s];
    const Instruction& in = lists_[s][a.pc];
    if (in.op != OpKind::kReduceGradients && in.op != OpKind::kOptimizerStep) {
      if (in.microbatch < 0 || in.microbatch >= m_) return Bad(s, "micro-batch out of range");
      if (in.chunk < 0 || in.chunk >= v_) return Bad(s, "chunk out of range");
    }
    if (in.IsTransfer() && (in.peer < 0 || in.peer >= p_ || in.peer == s)) {
      return Bad(s, absl::StrCat("peer must be another stage in [0, ", p_, ")"));
    }
    const Key key{in.microbatch, in.chunk};
    double cost = 0;
    switch (in.op) {
      case OpKind::kForward:
        if (a.forwarded.count(key)) return Bad(s, "repeats a forward");
        if (!HasInput(s, false, in.microbatch, in.chunk)) return Bad(s, "runs before its input arrived");
        a.forwarded.insert(key);
        a.peak = std::max(a.peak, ++a.live);
        cost = opt_.costs.forward;
        break;
      case OpKind::kBackward:
        if (!a.forwarded.count(key)) return Bad(s, "runs before its forward");
        if (a.backwarded.count(key)) return Bad(s, "repeats a backward");
        if (!HasInput(s, true, in.microbatch, in.chunk)) return Bad(s, "runs before its gradient arrived");
        a.backwarded.insert(key);
        --a.live;
        cost = opt_.costs.backward;
        break;
      case OpKind::kReduceGradients:
        if (static_cast<int64_t>(a.backwarded.size()) != m_ * v_) {
          return Bad(s, "reduces gradients before every backward ran");
        }
        a.reduced = true;
        cost = opt_.costs.reduce_gradients;
        break;
      case OpKind::kOptimizerStep:
        if (!a.reduced || a.stepped) return Bad(s, "steps without exactly one ReduceGradients first");
        a.stepped = true;
        cost = opt_.costs.optimizer_step;
        break;
      case OpKind::kSendActivation:
      case OpKind::kSendGradient: {
        if (absl::Status c = CheckSend(s, in); !c.ok()) return c;
        const int64_t d = in.peer;
        if (opt_.send_mode == SendMode::kBuffered) {
          channels_[{s, d}].push_back({in, a.t + opt_.costs.transfer});
          ++a.pc;
          return true;
        }
        Stage& b = st_[d];
        if (b.pc >= lists_[d].size()) return false;
        const Instruction& r = lists_[d][b.pc];
        if (!r.IsRecv() || r.peer != s) return false;
        if (!Matches(s, in, d, r)) {
          return Bad(s, absl::StrCat("stage ", d, " is at ", FormatInstruction(r),
                                     " instead; sends and receives must match one to one, in order"));
        }
        const double end = std::max(a.t, b.t) + opt_.costs.transfer;
        a.t = end;
        ++a.pc;
        Deliver(d, r, end);
        return true;
      }
      case OpKind::kRecvActivation:
      case OpKind::kRecvGradient: {
        if (opt_.send_mode == SendMode::kRendezvous) return false;  // the sender drives
        std::deque<InFlight>& q = channels_[{in.peer, s}];
        if (q.empty()) return false;
        const InFlight msg = q.front();
        if (!Matches(in.peer, msg.send, s, in)) {
          return Bad(s, absl::StrCat("the next message from stage ", in.peer, " is ",
                                     FormatInstruction(msg.send),
                                     "; sends and receives must match one to one, in order"));
        }
        q.pop_front();
        Deliver(s, in, msg.arrival);
        return true;
      }
    }
    a.t += cost;
    a.busy += cost;
    ++a.pc;
    return true;
  }

  const std::vector<std::vector<Instruction>>& lists_;
  const int64_t p_, v_, m_;
  const SimOptions opt_;
  std::vector<Stage> st_;
  std::map<std::pair<int64_t, int64_t>, std::deque<InFlight>> channels_;
};

}  // namespace

absl::StatusOr<SimReport> SimulateStages(const std::vector<std::vector<Instruction>>& stages,
                                         int64_t virtual_stages, int64_t microbatches,
                                         const SimOptions& options) {
  return Simulator(stages, virtual_stages, microbatches, options).Run();
}

absl::StatusOr<SimReport> Simulate(const PipelineSchedule& schedule, const SimOptions& options) {
  return SimulateStages(schedule.stages, schedule.virtual_stages, schedule.microbatches, options);
}

}  // namespace loom::topology
