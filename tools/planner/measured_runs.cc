// Parsing of the measured-run CSVs and their translation into planner inputs.
#include "tools/planner/measured_runs.h"

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner/sweep.h"

namespace loom::planner::eval {
namespace {

std::vector<std::string> Lines(absl::string_view text) {
  absl::ConsumePrefix(&text, "\xEF\xBB\xBF");
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::ConsumeSuffix(&line, "\r");
    if (!line.empty()) lines.emplace_back(line);
  }
  return lines;
}

// Maps header names to column indices.
struct Table {
  std::map<std::string, size_t> columns;
  std::vector<std::vector<std::string>> rows;
};

absl::StatusOr<Table> ParseTable(absl::string_view text, absl::string_view what) {
  std::vector<std::string> lines = Lines(text);
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty file"));
  Table t;
  std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  for (size_t i = 0; i < header.size(); ++i) t.columns[header[i]] = i;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> row = absl::StrSplit(lines[i], ',');
    if (row.size() != header.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " line ", i + 1, ": ", row.size(),
                                                     " fields, header has ", header.size()));
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

absl::StatusOr<size_t> Column(const Table& t, const std::string& name, absl::string_view what) {
  auto it = t.columns.find(name);
  if (it == t.columns.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no column '", name, "'"));
  }
  return it->second;
}

double ToDouble(const std::string& s) {
  double v = 0;
  if (s == "nan" || !absl::SimpleAtod(s, &v)) return std::nan("");
  return v;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::vector<PlaybookRun>> ParsePlaybookCsv(absl::string_view text) {
  constexpr absl::string_view kWhat = "ultrascale_playbook_runs.csv";
  absl::StatusOr<Table> t = ParseTable(text, kWhat);
  if (!t.ok()) return t.status();
  const char* names[] = {"model", "nodes", "dp", "tp", "pp", "mbs", "gas", "zero",
                         "mfu_pct", "tok_s_gpu", "mem_gb"};
  std::vector<size_t> col;
  for (const char* n : names) {
    absl::StatusOr<size_t> c = Column(*t, n, kWhat);
    if (!c.ok()) return c.status();
    col.push_back(*c);
  }
  std::vector<PlaybookRun> runs;
  for (const std::vector<std::string>& row : t->rows) {
    PlaybookRun r;
    r.model = row[col[0]];
    int64_t* ints[] = {&r.nodes, &r.dp, &r.tp, &r.pp, &r.mbs, &r.gas, &r.zero};
    for (int i = 0; i < 7; ++i) {
      if (!absl::SimpleAtoi(row[col[i + 1]], ints[i])) {
        return absl::InvalidArgumentError(absl::StrCat(kWhat, ": bad ", names[i + 1], " '",
                                                       row[col[i + 1]], "'"));
      }
    }
    r.mfu_pct = ToDouble(row[col[8]]);
    r.tok_s_gpu = ToDouble(row[col[9]]);
    r.mem_gb = ToDouble(row[col[10]]);
    r.ok = !std::isnan(r.mfu_pct);
    runs.push_back(r);
  }
  return runs;
}

absl::StatusOr<std::vector<VtrainRun>> ParseVtrainCsv(absl::string_view text, bool multi) {
  const std::string what = multi ? "vtrain_megatron_a100_multi.csv" : "vtrain_megatron_a100_single.csv";
  absl::StatusOr<Table> t = ParseTable(text, what);
  if (!t.ok()) return t.status();
  const char* names[] = {"# GPUs", "global batch", "micro batch", "hidden size", "attention heads",
                         "# layers", "sequence length", "tensor parallelism",
                         "data parallelism", "pipeline parallelism", "iteration time (ms)"};
  std::vector<size_t> col;
  for (const char* n : names) {
    absl::StatusOr<size_t> c = Column(*t, n, what);
    if (!c.ok()) return c.status();
    col.push_back(*c);
  }
  std::vector<VtrainRun> runs;
  for (const std::vector<std::string>& row : t->rows) {
    VtrainRun r;
    r.multi = multi;
    int64_t* ints[] = {&r.gpus, &r.global_batch, &r.mbs, &r.hidden, &r.heads,
                       &r.layers, &r.seq, &r.tp, &r.dp, &r.pp};
    for (int i = 0; i < 10; ++i) {
      if (!absl::SimpleAtoi(row[col[i]], ints[i])) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad ", names[i], " '", row[col[i]], "'"));
      }
    }
    r.iteration_ms = ToDouble(row[col[10]]);
    runs.push_back(r);
  }
  return runs;
}

absl::StatusOr<MeasuredRuns> LoadRuns(const std::string& dir) {
  MeasuredRuns runs;
  absl::StatusOr<std::string> text = ReadFile(dir + "/ultrascale_playbook_runs.csv");
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<PlaybookRun>> playbook = ParsePlaybookCsv(*text);
  if (!playbook.ok()) return playbook.status();
  runs.playbook = std::move(*playbook);
  for (bool multi : {true, false}) {
    const std::string path =
        dir + (multi ? "/vtrain_megatron_a100_multi.csv" : "/vtrain_megatron_a100_single.csv");
    absl::StatusOr<std::string> t = ReadFile(path);
    if (!t.ok()) return t.status();
    absl::StatusOr<std::vector<VtrainRun>> v = ParseVtrainCsv(*t, multi);
    if (!v.ok()) return v.status();
    runs.vtrain.insert(runs.vtrain.end(), v->begin(), v->end());
  }
  return runs;
}

Workload PlaybookWorkload(const PlaybookRun& run) {
  ModelShape shape;
  for (const SweepModel& m : PlaybookModels()) {
    if (m.label == run.model) shape = m.shape;
  }
  return MakeWorkload(shape, 4096, run.dp * run.mbs * run.gas, RecipeKind::kBf16Fp32Accum);
}

PlannerConstants PlaybookConstants(PlannerConstants k) {
  k.zero1_reduce_scatter = false;
  return k;
}

Layout PlaybookLayout(const PlaybookRun& run) {
  Layout l;
  l.dp = run.dp;
  l.tp = run.tp;
  l.pp = run.pp;
  l.zero_stage = static_cast<int>(run.zero);
  l.micro_batch_size = run.mbs;
  l.grad_accum = run.gas;
  l.schedule = spec::Schedule::k1F1B;
  // nanotron's reduce-scatter TP mode shards the norms' inputs along the sequence.
  l.sequence_parallel = run.tp > 1;
  l.recompute = spec::Recompute::kNone;
  return l;
}

ClusterSpec PlaybookCluster(const PlaybookRun& run) {
  ClusterSpec c = *ClusterPreset("h100-sxm");
  c.nodes = run.nodes;
  return c;
}

bool PlaybookLayoutValid(const PlaybookRun& run) {
  SearchSpace space;
  space.allow_uneven_stages = true;
  space.tp_within_node = false;
  return ValidateLayout(PlaybookWorkload(run), PlaybookCluster(run), PlaybookLayout(run), space).ok();
}

Workload VtrainWorkload(const VtrainRun& run) {
  ModelShape m;
  m.name = "gpt";
  m.vocab_size = 51200;
  m.hidden_size = run.hidden;
  m.num_layers = run.layers;
  m.num_heads = run.heads;
  m.num_kv_heads = run.heads;
  m.ffn_hidden_size = 4 * run.hidden;
  m.tie_embeddings = true;
  m.gated_mlp = false;
  m.linear_bias = true;
  m.layer_norm = true;
  m.learned_positions = run.seq;
  m.fused_attention = false;
  // fp16 mixed precision: the bytes of the bf16 recipe without fp32
  // gradient accumulation.
  return MakeWorkload(m, run.seq, run.global_batch, RecipeKind::kBf16);
}

Layout VtrainLayout(const VtrainRun& run) {
  Layout l;
  l.dp = run.dp;
  l.tp = run.tp;
  l.pp = run.pp;
  l.micro_batch_size = run.mbs;
  l.grad_accum = run.global_batch / (run.dp * run.mbs);
  l.schedule = spec::Schedule::k1F1B;
  l.sequence_parallel = false;
  l.recompute = spec::Recompute::kFull;
  return l;
}

ClusterSpec VtrainCluster(const VtrainRun& run) {
  ClusterSpec c = *ClusterPreset("a100-80gb");
  // vTrain's validation configs describe the cluster: 800 Gb/s of network
  // per 8-GPU node (inter_node_bandwidth: 800), i.e. 12.5 GB/s per GPU.
  c.inter_node_bandwidth = 800e9 / 8 / 8;
  c.devices_per_node = std::min<int64_t>(8, run.gpus);
  c.nodes = (run.gpus + 7) / 8;
  return c;
}

}  // namespace loom::planner::eval
