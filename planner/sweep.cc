// Running and drawing the sweep.
#include "planner/sweep.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/render.h"

namespace loom::planner {
namespace {

ModelShape Llama(const char* name, int64_t layers, int64_t hidden, int64_t heads, int64_t ffn,
                 bool tied) {
  ModelShape m;
  m.name = name;
  m.vocab_size = 131072;
  m.hidden_size = hidden;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = heads;
  m.ffn_hidden_size = ffn;
  m.tie_embeddings = tied;
  return m;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

// White (0% MFU) to deep blue (the best cell).
std::string HeatColor(double fraction) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int r = static_cast<int>(247 - fraction * (247 - 8));
  const int g = static_cast<int>(251 - fraction * (251 - 69));
  const int b = static_cast<int>(255 - fraction * (255 - 148));
  return absl::StrFormat("#%02x%02x%02x", r, g, b);
}

}  // namespace

std::vector<SweepModel> PlaybookModels() {
  // Heads: 32 for 1B, 3B and 8B, 64 for 80B (the runs use TP up to 32).
  return {{"1B", Llama("llama-1b", 16, 2048, 32, 8192, true)},
          {"3B", Llama("llama-3b", 28, 3072, 32, 8192, true)},
          {"8B", Llama("llama-8b", 32, 4096, 32, 14336, false)},
          {"80B", Llama("llama-80b", 80, 8192, 64, 28672, false)}};
}

SweepRequest PlaybookSweep(const ClusterSpec& cluster) {
  SweepRequest req;
  req.cluster = cluster;
  req.models = PlaybookModels();
  req.node_counts = {1, 2, 4, 8, 16, 32, 64};
  req.seq_len = 4096;
  req.global_batch = 256;
  req.recipe = RecipeKind::kBf16Fp32Accum;
  return req;
}

absl::StatusOr<SweepResult> RunSweep(const SweepRequest& req) {
  if (req.models.empty() || req.node_counts.empty()) {
    return absl::InvalidArgumentError("sweep: need at least one model and one node count");
  }
  SweepResult out;
  out.cluster = req.cluster;
  out.seq_len = req.seq_len;
  out.global_batch = req.global_batch;
  out.node_counts = req.node_counts;
  for (const SweepModel& m : req.models) out.models.push_back(m.label);
  for (const SweepModel& m : req.models) {
    for (int64_t nodes : req.node_counts) {
      if (nodes < 1) return absl::InvalidArgumentError(absl::StrCat("sweep: node count ", nodes, " must be at least 1"));
      PlanRequest plan;
      plan.workload = MakeWorkload(m.shape, req.seq_len, req.global_batch, req.recipe);
      plan.cluster = req.cluster;
      plan.cluster.nodes = nodes;
      plan.constants = req.constants;
      plan.space = req.space;
      SweepCell cell;
      cell.model = m.label;
      cell.nodes = nodes;
      absl::StatusOr<PlanResult> r = PlanLayouts(plan);
      if (!r.ok()) {
        cell.note = std::string(r.status().message());
      } else {
        cell.considered = r->layouts_considered;
        cell.fit = static_cast<int64_t>(r->ranked.size());
        if (r->ranked.empty()) {
          cell.note = "out of memory";
        } else {
          cell.best = r->ranked.front();
        }
      }
      out.cells.push_back(std::move(cell));
    }
  }
  return out;
}

std::string RenderSweepTable(const SweepResult& r) {
  constexpr int kWidth = 22;
  std::string out = absl::StrFormat(
      "Best layout per cell: predicted MFU, layout (%s, seq %d, global batch %d sequences)\n",
      r.cluster.name, r.seq_len, r.global_batch);
  auto rule = [&] {
    std::string s = std::string(7, '-');
    for (size_t j = 0; j < r.node_counts.size(); ++j) s += "+" + std::string(kWidth, '-');
    return s + "\n";
  };
  std::string header = absl::StrFormat("%-7s", "nodes");
  for (int64_t n : r.node_counts) header += absl::StrFormat("|%*s", kWidth, absl::StrCat(n, " "));
  absl::StrAppend(&out, header, "\n", rule());
  for (size_t i = 0; i < r.models.size(); ++i) {
    std::string line1 = absl::StrFormat("%-7s", r.models[i]);
    std::string line2 = absl::StrFormat("%-7s", "");
    std::string line3 = absl::StrFormat("%-7s", "");
    for (size_t j = 0; j < r.node_counts.size(); ++j) {
      const SweepCell& c = r.cell(i, j);
      if (!c.best) {
        line1 += absl::StrFormat("|%*s", kWidth, "OOM ");
        line2 += absl::StrFormat("|%*s", kWidth, "");
        line3 += absl::StrFormat("|%*s", kWidth, "");
        continue;
      }
      const Layout& l = c.best->layout;
      line1 += absl::StrFormat("|%*s", kWidth, absl::StrFormat("%.1f%% ", 100 * c.best->time.mfu));
      std::string axes = absl::StrCat("dp", l.dp, " tp", l.tp, " pp", l.pp);
      if (l.cp > 1) absl::StrAppend(&axes, " cp", l.cp);
      line2 += absl::StrFormat("|%*s", kWidth, axes + " ");
      std::string rest = absl::StrCat("mbs", l.micro_batch_size, " z", l.zero_stage);
      if (l.recompute == spec::Recompute::kSelective) absl::StrAppend(&rest, " rc=sel");
      if (l.recompute == spec::Recompute::kFull) absl::StrAppend(&rest, " rc=full");
      line3 += absl::StrFormat("|%*s", kWidth, rest + " ");
    }
    absl::StrAppend(&out, line1, "\n", line2, "\n", line3, "\n", rule());
  }
  return out;
}

std::string RenderSweepSvg(const SweepResult& r) {
  constexpr int kCellW = 150, kCellH = 78, kLeft = 70, kTop = 70;
  const int cols = static_cast<int>(r.node_counts.size());
  const int rows = static_cast<int>(r.models.size());
  const int width = kLeft + cols * kCellW + 20;
  const int height = kTop + rows * kCellH + 50;
  double best_mfu = 0;
  for (const SweepCell& c : r.cells) {
    if (c.best) best_mfu = std::max(best_mfu, c.best->time.mfu);
  }
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"24\" font-size=\"16\" font-weight=\"bold\">Best layout per cell "
      "(predicted MFU)</text>\n"
      "<text x=\"%d\" y=\"44\" font-size=\"12\">%s, seq %d, global batch %d sequences; rows: "
      "model, columns: nodes of %d</text>\n",
      width, height, kLeft, kLeft, XmlEscape(r.cluster.name), r.seq_len, r.global_batch,
      r.cluster.devices_per_node);
  for (int j = 0; j < cols; ++j) {
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">%d</text>\n",
                                          kLeft + j * kCellW + kCellW / 2, kTop - 8, r.node_counts[j]));
  }
  for (int i = 0; i < rows; ++i) {
    const int y = kTop + i * kCellH;
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">%s</text>\n",
                                          kLeft - 8, y + kCellH / 2 + 4, XmlEscape(r.models[i])));
    for (int j = 0; j < cols; ++j) {
      const SweepCell& c = r.cell(i, j);
      const int x = kLeft + j * kCellW;
      const double frac = c.best && best_mfu > 0 ? c.best->time.mfu / best_mfu : 0;
      absl::StrAppend(&svg, absl::StrFormat(
          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#888\"/>\n",
          x, y, kCellW, kCellH, c.best ? HeatColor(frac) : "#e0e0e0"));
      const char* ink = frac > 0.55 ? "white" : "black";
      const int cx = x + kCellW / 2;
      if (!c.best) {
        absl::StrAppend(&svg, absl::StrFormat("<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">OOM</text>\n",
                                              cx, y + kCellH / 2 + 4));
        continue;
      }
      const Layout& l = c.best->layout;
      std::string axes = absl::StrCat("dp", l.dp, " tp", l.tp, " pp", l.pp);
      if (l.cp > 1) absl::StrAppend(&axes, " cp", l.cp);
      std::string rest = absl::StrCat("mbs", l.micro_batch_size, " zero", l.zero_stage);
      if (l.recompute != spec::Recompute::kNone) absl::StrAppend(&rest, " rc=", RecomputeLabel(l.recompute));
      absl::StrAppend(&svg, absl::StrFormat(
          "<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\" fill=\"%s\">%.1f%%</text>\n"
          "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\" fill=\"%s\">%s</text>\n"
          "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\" fill=\"%s\">%s</text>\n",
          cx, y + 24, ink, 100 * c.best->time.mfu, cx, y + 44, ink, XmlEscape(axes), cx, y + 62, ink,
          XmlEscape(rest)));
    }
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

nlohmann::json SweepToJson(const SweepResult& r) {
  nlohmann::json j;
  j["cluster"] = r.cluster.name;
  j["devices_per_node"] = r.cluster.devices_per_node;
  j["seq_len"] = r.seq_len;
  j["global_batch"] = r.global_batch;
  j["models"] = r.models;
  j["node_counts"] = r.node_counts;
  j["cells"] = nlohmann::json::array();
  for (const SweepCell& c : r.cells) {
    nlohmann::json cell = {{"model", c.model}, {"nodes", c.nodes}, {"considered", c.considered},
                           {"fit", c.fit}};
    cell["best"] = c.best ? CandidateToJson(*c.best) : nlohmann::json(nullptr);
    if (!c.note.empty()) cell["note"] = c.note;
    j["cells"].push_back(cell);
  }
  return j;
}

}  // namespace loom::planner
