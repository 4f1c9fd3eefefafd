// Text and JSON forms of a plan.
#include "planner/render.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/snapshot_generations.h"
#include "planner/memory_model.h"

namespace loom::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string Si(double v) {
  if (v >= 1e12) return absl::StrFormat("%.2f T", v / 1e12);
  if (v >= 1e9) return absl::StrFormat("%.2f B", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.2f M", v / 1e6);
  if (v >= 1e3) return absl::StrFormat("%.1f k", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.2f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.1f ms", s * 1e3);
  return absl::StrFormat("%.0f us", s * 1e6);
}

// In-place recovery's snapshots where they live: in the rank's memory on a
// CPU rank (its line above), in the node's host memory on a GPU node.
std::string DescribeHostMemory(const Candidate& c, const ClusterSpec& cluster) {
  if (c.host_bytes_per_node <= 0) return "";
  return absl::StrFormat(
      "  host memory per node: %.1f GiB%s of in-place recovery snapshots (%.1f GiB per rank: %d "
      "generations of its state, %d of its ward's)\n",
      c.host_bytes_per_node / kGiB,
      cluster.host_memory_bytes > 0 ? absl::StrFormat(" of %.1f", cluster.host_memory_bytes / kGiB)
                                    : "",
      c.memory.host_bytes() / kGiB, static_cast<int>(kOwnSnapshotGenerations),
      static_cast<int>(kWardSnapshotGenerations));
}

std::string DescribeCandidate(const Candidate& c, const ClusterSpec& cluster) {
  const StepTime& t = c.time;
  const MemoryBreakdown& m = c.memory;
  const double capacity = cluster.memory_bytes;
  return absl::StrCat(
      "  ", LayoutToString(c.layout), "\n",
      absl::StrFormat("  step %s, %s tokens/s (%s per device), MFU %.1f%%, HFU %.1f%%, bubble %.1f%%\n",
                      Seconds(t.total), Si(t.tokens_per_second), Si(t.tokens_per_second_per_device),
                      100 * t.mfu, 100 * t.hfu, 100 * t.bubble_fraction),
      absl::StrFormat("  time: compute %s, tp %s, cp %s, pp %s, bubble %s, dp %s, optimizer %s%s\n",
                      Seconds(t.compute), Seconds(t.tp_comm), Seconds(t.cp_comm), Seconds(t.pp_comm),
                      Seconds(t.bubble), Seconds(t.dp_comm), Seconds(t.optimizer),
                      t.ep_comm > 0 ? absl::StrCat(", ep ", Seconds(t.ep_comm)) : ""),
      absl::StrFormat("  memory per rank (stage %d): %.1f of %.1f GiB: weights %.1f, gradients %.1f, "
                      "optimizer %.1f, activations %.1f (%d micro-batches), logits %.1f, zero3 %.1f, "
                      "buffers %.1f, overhead %.1f%s\n",
                      m.stage, m.total() / kGiB, capacity / kGiB, m.weights / kGiB, m.gradients / kGiB,
                      m.optimizer / kGiB, m.activations / kGiB, m.micro_batches_in_flight,
                      m.logits / kGiB, m.zero3_gathered / kGiB, m.comm_buffers / kGiB,
                      m.overhead / kGiB,
                      m.snapshots_on_device && m.snapshots > 0
                          ? absl::StrFormat(", snapshots %.1f", m.snapshots / kGiB)
                          : ""),
      DescribeHostMemory(c, cluster),
      c.tight ? "  tight: inside the memory headroom; no layout with headroom was found\n" : "");
}

// What context parallelism saves: the same layout with its CP ranks turned
// into DP ranks (same world, same ZeRO stage) holds whole sequences.
std::string DescribeCpSaving(const PlanRequest& req, const Candidate& c) {
  const Layout& l = c.layout;
  if (l.cp <= 1) return "";
  Layout whole = l;
  whole.dp = l.dp * l.cp;
  whole.cp = 1;
  const MemoryBreakdown without = EstimateMemory(req.workload, whole, req.constants);
  const MemoryBreakdown& with = c.memory;
  const int64_t seq = req.workload.seq_len;
  return absl::StrFormat(
      "  context parallelism: cp=%d gives each rank %d of the %d tokens of a sequence (2 zigzag "
      "chunks of %d; ring attention passes K/V around the cp group). Activations %.1f GiB and "
      "logits %.1f GiB per rank, where cp=1 (dp=%d) would hold %.1f GiB and %.1f GiB: %.1f GiB "
      "per rank in all instead of %.1f GiB, %.1f GiB saved%s\n",
      l.cp, seq / l.cp, seq, seq / (2 * l.cp), with.activations / kGiB, with.logits / kGiB,
      whole.dp, without.activations / kGiB, without.logits / kGiB, with.total() / kGiB,
      without.total() / kGiB, (without.total() - with.total()) / kGiB,
      without.total() > req.cluster.memory_bytes ? " (cp=1 does not fit the device)" : "");
}

std::vector<const Rejection*> ClosestRejections(const PlanResult& r, int n) {
  std::vector<const Rejection*> out;
  for (const Rejection& x : r.rejected) out.push_back(&x);
  std::stable_sort(out.begin(), out.end(), [](const Rejection* a, const Rejection* b) {
    return a->memory.total() < b->memory.total();
  });
  if (static_cast<int>(out.size()) > n) out.resize(std::max(0, n));
  return out;
}

}  // namespace

std::string CompactLayout(const Layout& l) {
  std::string s = absl::StrCat("dp", l.dp, " tp", l.tp, " pp", l.pp);
  if (l.cp > 1) absl::StrAppend(&s, " cp", l.cp);
  if (l.ep > 1) absl::StrAppend(&s, " ep", l.ep);
  absl::StrAppend(&s, " mbs", l.micro_batch_size, " z", l.zero_stage);
  if (l.pp > 1) {
    if (l.schedule == spec::Schedule::kAfab) absl::StrAppend(&s, " afab");
    if (l.schedule == spec::Schedule::kInterleaved) absl::StrAppend(&s, " il", l.virtual_stages);
  }
  if (l.sequence_parallel) absl::StrAppend(&s, " sp");
  if (l.recompute == spec::Recompute::kSelective) absl::StrAppend(&s, " rc=sel");
  if (l.recompute == spec::Recompute::kFull) absl::StrAppend(&s, " rc=full");
  return s;
}

std::string RenderPlanText(const PlanRequest& req, const PlanResult& r, const RenderOptions& o) {
  const Workload& w = req.workload;
  const ClusterSpec& c = req.cluster;
  std::string out = absl::StrFormat(
      "Plan for %s: %s parameters, seq %d, global batch %d sequences (%s tokens), %s\n"
      "Cluster: %d node(s) x %d %s, %.1f GiB each%s\n"
      "Considered %d layouts: %d fit (%d of them tight: inside the %.0f%% memory headroom), %d out "
      "of memory.\n",
      w.model.name.empty() ? "the model" : w.model.name, Si(static_cast<double>(w.params.total)),
      w.seq_len, w.global_batch, Si(static_cast<double>(w.global_batch) * w.seq_len),
      Recipe(w.recipe).name, c.nodes, c.devices_per_node, c.name, c.memory_bytes / kGiB,
      c.host_memory_bytes > 0
          ? absl::StrFormat(", %.1f GiB of host memory per node", c.host_memory_bytes / kGiB)
          : "",
      r.layouts_considered, r.ranked.size(),
      std::count_if(r.ranked.begin(), r.ranked.end(), [](const Candidate& x) { return x.tight; }),
      100 * req.space.memory_headroom, r.rejected.size());
  if (r.ranked.empty()) {
    absl::StrAppend(&out, "\nNo layout fits in memory. Closest:\n");
  } else {
    absl::StrAppend(&out, "\nBest:\n", DescribeCandidate(r.ranked.front(), c),
                    DescribeCpSaving(req, r.ranked.front()));
    const int shown = std::min<int>(o.runners_up, static_cast<int>(r.ranked.size()) - 1);
    if (shown > 0) {
      // GPU nodes' snapshots get their own column (host memory, not the device's).
      const bool host = r.ranked.front().host_bytes_per_node > 0;
      absl::StrAppend(&out, "\nRunners-up:\n",
                      absl::StrFormat("  %-3s %-52s %10s %12s %7s %7s %9s%s\n", "#", "layout", "step",
                                      "tokens/s", "MFU", "bubble", "mem GiB",
                                      host ? " host GiB/node" : ""));
      for (int i = 1; i <= shown; ++i) {
        const Candidate& cand = r.ranked[i];
        absl::StrAppend(
            &out, absl::StrFormat("  %-3d %-52s %10s %12s %6.1f%% %6.1f%% %9.1f%s%s\n", i + 1,
                                  CompactLayout(cand.layout), Seconds(cand.time.total),
                                  Si(cand.time.tokens_per_second), 100 * cand.time.mfu,
                                  100 * cand.time.bubble_fraction, cand.memory.total() / kGiB,
                                  host ? absl::StrFormat(" %14.1f", cand.host_bytes_per_node / kGiB)
                                       : "",
                                  cand.tight ? " tight" : ""));
      }
    }
    if (o.rejections > 0 && !r.rejected.empty()) {
      absl::StrAppend(&out, "\nOut of memory (closest to fitting):\n");
    }
  }
  for (const Rejection* x : ClosestRejections(r, o.rejections)) {
    absl::StrAppend(&out, "  ", CompactLayout(x->layout), ": ", x->Reason(), "\n");
  }
  return out;
}

nlohmann::json LayoutToJson(const Layout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"ep", l.ep},
          {"zero_stage", l.zero_stage},
          {"micro_batch_size", l.micro_batch_size},
          {"grad_accum", l.grad_accum},
          {"schedule", ScheduleLabel(l.schedule)},
          {"virtual_stages", l.virtual_stages},
          {"sequence_parallel", l.sequence_parallel},
          {"recompute", RecomputeLabel(l.recompute)}};
}

nlohmann::json MemoryToJson(const MemoryBreakdown& m) {
  return {{"total_bytes", m.total()},
          {"weights_bytes", m.weights},
          {"gradients_bytes", m.gradients},
          {"optimizer_bytes", m.optimizer},
          {"activations_bytes", m.activations},
          {"logits_bytes", m.logits},
          {"zero3_gathered_bytes", m.zero3_gathered},
          {"comm_buffers_bytes", m.comm_buffers},
          {"overhead_bytes", m.overhead},
          {"snapshots_bytes", m.snapshots},
          {"snapshots_on_device", m.snapshots_on_device},
          {"stage", m.stage},
          {"micro_batches_in_flight", m.micro_batches_in_flight}};
}

nlohmann::json StepTimeToJson(const StepTime& t) {
  return {{"step_seconds", t.total},
          {"compute_seconds", t.compute},
          {"tp_comm_seconds", t.tp_comm},
          {"cp_comm_seconds", t.cp_comm},
          {"ep_comm_seconds", t.ep_comm},
          {"pp_comm_seconds", t.pp_comm},
          {"bubble_seconds", t.bubble},
          {"dp_comm_seconds", t.dp_comm},
          {"optimizer_seconds", t.optimizer},
          {"bubble_fraction", t.bubble_fraction},
          {"tokens_per_second", t.tokens_per_second},
          {"tokens_per_second_per_device", t.tokens_per_second_per_device},
          {"mfu", t.mfu},
          {"hfu", t.hfu}};
}

nlohmann::json CandidateToJson(const Candidate& c) {
  return {{"layout", LayoutToJson(c.layout)},
          {"memory", MemoryToJson(c.memory)},
          {"time", StepTimeToJson(c.time)},
          {"tight", c.tight},
          {"host_bytes_per_node", c.host_bytes_per_node}};
}

nlohmann::json PlanToJson(const PlanRequest& req, const PlanResult& r, const RenderOptions& o) {
  const Workload& w = req.workload;
  const ClusterSpec& c = req.cluster;
  nlohmann::json j;
  j["workload"] = {{"model", w.model.name},
                   {"parameters", w.params.total},
                   {"seq_len", w.seq_len},
                   {"global_batch", w.global_batch},
                   {"recipe", std::string(Recipe(w.recipe).name)}};
  j["cluster"] = {{"name", c.name},
                  {"nodes", c.nodes},
                  {"devices_per_node", c.devices_per_node},
                  {"memory_bytes", c.memory_bytes},
                  {"host_memory_bytes", c.host_memory_bytes},
                  {"peak_flops", c.PeakFlops(Recipe(w.recipe).compute)}};
  j["layouts_considered"] = r.layouts_considered;
  j["fit"] = r.ranked.size();
  j["memory_headroom"] = req.space.memory_headroom;
  j["out_of_memory"] = r.rejected.size();
  j["best"] = r.ranked.empty() ? nlohmann::json(nullptr) : CandidateToJson(r.ranked.front());
  j["runners_up"] = nlohmann::json::array();
  for (int i = 1; i <= o.runners_up && i < static_cast<int>(r.ranked.size()); ++i) {
    j["runners_up"].push_back(CandidateToJson(r.ranked[i]));
  }
  j["rejected"] = nlohmann::json::array();
  for (const Rejection* x : ClosestRejections(r, o.rejections)) {
    j["rejected"].push_back({{"layout", LayoutToJson(x->layout)},
                             {"memory", MemoryToJson(x->memory)},
                             {"host_bytes_per_node", x->host_bytes_per_node},
                             {"reason", x->Reason()}});
  }
  return j;
}

}  // namespace loom::planner
