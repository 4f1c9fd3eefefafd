// Reading the engine's measured peaks and setting the planner's predictions
// beside them. A layout's ranks are merged into its worst rank: the planner
// predicts the rank that needs the most.
#include "tools/planner/engine_memory.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace loom::planner::eval {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

const char* const kColumns[] = {
    "shape",      "vocab",     "hidden",    "layers",      "heads",        "kv_heads",
    "ffn",        "tied",      "seq_len",   "micro_batch", "global_batch", "bucket_mb",
    "dp",         "tp",        "sp",        "zero",        "recompute",    "rank",
    "parameters", "gradients", "optimizer", "activations", "comm_buffers", "total_peak"};

}  // namespace

std::string EngineMemoryCase::Label() const {
  std::string s;
  if (dp > 1 || tp == 1) s = absl::StrCat("dp", dp);
  if (tp > 1) absl::StrAppend(&s, dp > 1 ? "·" : "", "tp", tp);
  if (sp) absl::StrAppend(&s, "+sp");
  if (dp > 1) absl::StrAppend(&s, " zero", zero);
  if (recompute == spec::Recompute::kFull) absl::StrAppend(&s, " recompute=full");
  return s;
}

absl::StatusOr<std::vector<EngineMemoryCase>> ParseEngineMemoryCsv(absl::string_view text) {
  std::vector<EngineMemoryCase> cases;
  std::map<std::string, size_t> index;  // layout key -> case
  std::map<std::string, int> column;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    if (column.empty()) {
      for (size_t i = 0; i < cells.size(); ++i) column[cells[i]] = static_cast<int>(i);
      for (const char* c : kColumns) {
        if (!column.count(c)) {
          return absl::InvalidArgumentError(
              absl::StrCat("engine memory CSV: header lacks column '", c, "'"));
        }
      }
      continue;
    }
    if (cells.size() != column.size()) {
      return absl::InvalidArgumentError(absl::StrCat("engine memory CSV line ", line_no, ": ",
                                                     cells.size(), " cells, the header has ",
                                                     column.size()));
    }
    auto num = [&](const char* name, double* out) -> absl::Status {
      if (!absl::SimpleAtod(cells[column[name]], out)) {
        return absl::InvalidArgumentError(absl::StrCat("engine memory CSV line ", line_no,
                                                       ": column '", name, "' is not a number: '",
                                                       cells[column[name]], "'"));
      }
      return absl::OkStatus();
    };
    double v[24] = {0};
    for (int i = 1; i < 24; ++i) {
      if (i == 16) continue;  // recompute is a word
      if (absl::Status s = num(kColumns[i], &v[i]); !s.ok()) return s;
    }
    const std::string recompute = cells[column["recompute"]];
    if (recompute != "none" && recompute != "full" && recompute != "selective") {
      return absl::InvalidArgumentError(absl::StrCat("engine memory CSV line ", line_no,
                                                     ": recompute '", recompute,
                                                     "' must be none, selective or full"));
    }
    EngineMemoryCase c;
    c.shape = cells[column["shape"]];
    c.model.vocab_size = static_cast<int64_t>(v[1]);
    c.model.hidden_size = static_cast<int64_t>(v[2]);
    c.model.num_layers = static_cast<int64_t>(v[3]);
    c.model.num_heads = static_cast<int64_t>(v[4]);
    c.model.num_kv_heads = static_cast<int64_t>(v[5]);
    c.model.ffn_hidden_size = static_cast<int64_t>(v[6]);
    c.model.tie_embeddings = v[7] != 0;
    c.seq_len = static_cast<int64_t>(v[8]);
    c.model.max_seq_len = c.seq_len;
    c.micro_batch = static_cast<int64_t>(v[9]);
    c.global_batch = static_cast<int64_t>(v[10]);
    c.bucket_mb = static_cast<int64_t>(v[11]);
    c.dp = static_cast<int64_t>(v[12]);
    c.tp = static_cast<int64_t>(v[13]);
    c.sp = v[14] != 0;
    c.zero = static_cast<int64_t>(v[15]);
    c.recompute = recompute == "full"        ? spec::Recompute::kFull
                  : recompute == "selective" ? spec::Recompute::kSelective
                                             : spec::Recompute::kNone;
    const std::string key = absl::StrCat(c.shape, "/", c.dp, "/", c.tp, "/", c.sp, "/", c.zero, "/",
                                         recompute, "/", c.seq_len, "/", c.micro_batch);
    auto [it, fresh] = index.emplace(key, cases.size());
    if (fresh) {
      c.best_rank_total_peak = v[23];
      cases.push_back(c);
    }
    EngineMemoryCase& into = cases[it->second];
    ++into.ranks;
    into.best_rank_total_peak = std::min(into.best_rank_total_peak, v[23]);
    if (into.ranks == 1 || v[23] > into.total_peak) {
      into.parameters = v[18];
      into.gradients = v[19];
      into.optimizer = v[20];
      into.activations = v[21];
      into.comm_buffers = v[22];
      into.total_peak = v[23];
    }
  }
  if (cases.empty()) return absl::InvalidArgumentError("engine memory CSV: no rows");
  return cases;
}

absl::StatusOr<std::vector<EngineMemoryCase>> LoadEngineMemoryCsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the engine memory CSV"));
  std::stringstream buf;
  buf << in.rdbuf();
  absl::StatusOr<std::vector<EngineMemoryCase>> cases = ParseEngineMemoryCsv(buf.str());
  if (!cases.ok())
    return absl::Status(cases.status().code(), absl::StrCat(path, ": ", cases.status().message()));
  return cases;
}

Workload EngineWorkload(const EngineMemoryCase& c) {
  Workload w = MakeWorkload(ModelShapeFromSpec(c.model, c.shape), c.seq_len, c.global_batch,
                            RecipeKind::kFp32);
  w.dp_bucket_bytes = static_cast<double>(c.bucket_mb) * kMiB;
  return w;
}

Layout EngineLayout(const EngineMemoryCase& c) {
  Layout l;
  l.dp = c.dp;
  l.tp = c.tp;
  l.zero_stage = static_cast<int>(c.zero);
  l.micro_batch_size = c.micro_batch;
  l.grad_accum = std::max<int64_t>(1, c.global_batch / (c.micro_batch * c.dp));
  l.sequence_parallel = c.sp;
  l.recompute = c.recompute;
  return l;
}

std::vector<EngineMemoryComparison> CompareEngineMemory(const std::vector<EngineMemoryCase>& cases,
                                                        const PlannerConstants& constants) {
  std::vector<EngineMemoryComparison> out;
  for (const EngineMemoryCase& c : cases) {
    EngineMemoryComparison r;
    r.measured = c;
    r.predicted = EstimateMemory(EngineWorkload(c), EngineLayout(c), constants);
    r.predicted_accounted = r.predicted.total() - r.predicted.overhead;
    r.relative_error = c.total_peak > 0 ? r.predicted_accounted / c.total_peak - 1.0 : 0.0;
    out.push_back(r);
  }
  return out;
}

std::string RenderEngineMemoryTable(const std::vector<EngineMemoryComparison>& rows) {
  // Cells are "measured / predicted" MiB. The measured kinds are each their
  // own peak; the total is the peak of the sum. ZeRO-3's gathered layers and
  // unreduced gradients are one predicted term, in their own column.
  std::string s =
      "| shape | layout | weights | gradients | optimizer | activations | buffers | ZeRO-3 "
      "gathered | total peak | predicted | error "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto pair = [](double measured, double predicted) {
    return absl::StrFormat("%.2f / %.2f", measured / kMiB, predicted / kMiB);
  };
  for (const EngineMemoryComparison& r : rows) {
    const EngineMemoryCase& m = r.measured;
    const MemoryBreakdown& p = r.predicted;
    absl::StrAppend(&s, "| ", m.shape, " | ", m.Label(), " | ", pair(m.parameters, p.weights),
                    " | ", pair(m.gradients, p.gradients), " | ", pair(m.optimizer, p.optimizer),
                    " | ", pair(m.activations, p.activations + p.logits), " | ",
                    pair(m.comm_buffers, p.comm_buffers), " | ",
                    p.zero3_gathered > 0 ? absl::StrFormat("%.2f", p.zero3_gathered / kMiB) : "–",
                    " | ", absl::StrFormat("%.2f", m.total_peak / kMiB), " | ",
                    absl::StrFormat("%.2f", r.predicted_accounted / kMiB), " | ",
                    absl::StrFormat("%+.1f%%", 100.0 * r.relative_error), " |\n");
  }
  return s;
}

}  // namespace loom::planner::eval
