// Measures the peak memory of Loom's own CPU engine per rank, by category, for
// every layout the engine runs (dp1; dp2 and dp4 x ZeRO 0..3; tp2, tp2+sp,
// tp4+sp; dp2·tp2 at ZeRO 0 and 1, with and without sp; full recompute), on
// two model shapes, and writes the CSV that tests/planner/engine_memory_test.cc
// checks the planner's memory model against. Ranks are threads with real Gloo
// communicators over loopback; the numbers are the engine's own accounting
// (MemoryTracker), so they are exact byte counts, except where communication
// lag decides how many full-size gradient units are resident (ZeRO-2/3): the
// maximum over steps 2..N is recorded.
//   OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive build/bin/planner_engine_memory
//       --out=tools/planner/data/engine_memory.csv
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/memory/memory_tracker.h"
#include "worker/engine/training_loop.h"

ABSL_FLAG(std::string, out, "", "CSV to write (default: stdout)");
ABSL_FLAG(int64_t, steps, 3, "optimizer steps per layout; peaks are taken over steps 2..N");
ABSL_FLAG(std::string, command_line, "", "command recorded in the CSV header (default: argv)");

namespace loom::bench {
namespace {

using engine::MemoryKind;
using engine::MemoryUsage;

struct Shape {
  std::string name;
  spec::ModelSpec model;
  int64_t seq_len = 0;
  int64_t micro_batch = 0;
  int64_t global_batch = 0;
  int64_t bucket_mb = 25;
};

struct LayoutCase {
  int dp = 1;
  int tp = 1;
  bool sp = false;
  int zero = 0;
  spec::Recompute recompute = spec::Recompute::kNone;
};

// The model of docs/parallel_memory.md (6.4M parameters, untied, states
// dominate), and one where activations dominate: tied embeddings, kv heads
// that tp4 must replicate, 4 sequences of 128 tokens per micro-batch, and a
// small bucket so that DP buckets split and pad.
std::vector<Shape> Shapes() {
  Shape a;
  a.name = "h256-l8";
  a.model.vocab_size = 256;
  a.model.hidden_size = 256;
  a.model.num_layers = 8;
  a.model.num_heads = 8;
  a.model.num_kv_heads = 4;
  a.model.ffn_hidden_size = 768;
  a.model.max_seq_len = 64;
  a.model.tie_embeddings = false;
  a.seq_len = 64;
  a.micro_batch = 2;
  a.global_batch = 8;
  a.bucket_mb = 25;

  Shape b;
  b.name = "h192-l4-tied";
  b.model.vocab_size = 320;
  b.model.hidden_size = 192;
  b.model.num_layers = 4;
  b.model.num_heads = 8;
  b.model.num_kv_heads = 2;
  b.model.ffn_hidden_size = 512;
  b.model.max_seq_len = 128;
  b.model.tie_embeddings = true;
  b.seq_len = 128;
  b.micro_batch = 4;
  b.global_batch = 16;
  b.bucket_mb = 1;
  return {a, b};
}

std::vector<LayoutCase> Layouts() {
  std::vector<LayoutCase> out;
  out.push_back({1, 1, false, 0});
  out.push_back({1, 1, false, 0, spec::Recompute::kFull});
  for (int dp : {2, 4}) {
    for (int zero = 0; zero <= 3; ++zero) out.push_back({dp, 1, false, zero});
  }
  out.push_back({1, 2, false, 0});
  out.push_back({1, 2, true, 0});
  out.push_back({1, 4, true, 0});
  for (bool sp : {false, true}) {
    for (int zero : {0, 1}) out.push_back({2, 2, sp, zero});
  }
  return out;
}

std::string SyntheticText(int64_t bytes) {
  static const char* kWords[] = {"the ",    "engine ", "keeps ", "its ",      "shards ", "in ",
                                 "memory ", "and ",    "frees ", "what ",     "it ",     "no ",
                                 "longer ", "needs, ", "step ",  "by step.\n"};
  std::string out;
  uint64_t x = 88172645463325252ull;
  while (static_cast<int64_t>(out.size()) < bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out += kWords[x % 16];
  }
  out.resize(static_cast<size_t>(bytes));
  return out;
}

// n communicators of one group, created concurrently (each blocks until all joined).
absl::StatusOr<std::vector<std::unique_ptr<comm::Communicator>>> MakeGroup(
    comm::InProcessStore& store, int n, const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string prefix = absl::StrCat("engine_memory/", name, "/", counter.fetch_add(1));
  std::vector<std::unique_ptr<comm::Communicator>> comms(n);
  std::vector<absl::Status> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      comm::GlooOptions options;
      options.group_name = name;
      options.rank = r;
      options.size = n;
      options.key_prefix = prefix;
      options.timeout = absl::Seconds(120);
      absl::StatusOr<std::unique_ptr<comm::Communicator>> c =
          comm::CreateGlooCommunicator(store, options);
      if (c.ok()) {
        comms[r] = std::move(*c);
      } else {
        errors[r] = c.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return comms;
}

struct RankPeak {
  MemoryUsage usage;  // per-kind peaks and total peak, max over steps 2..N
};

void MergePeak(const MemoryUsage& step, MemoryUsage* into) {
  for (int k = 0; k < engine::kNumMemoryKinds; ++k)
    into->peak[k] = std::max(into->peak[k], step.peak[k]);
  into->total_peak = std::max(into->total_peak, step.total_peak);
}

// Trains `steps` steps of the layout; rank r = d * tp + t (tp fastest).
absl::StatusOr<std::vector<RankPeak>> RunLayout(const spec::JobSpec& base, const LayoutCase& l,
                                                int64_t steps) {
  spec::JobSpec job = base;
  job.parallelism.dp = l.dp;
  job.parallelism.tp = l.tp;
  job.parallelism.sequence_parallel = l.sp;
  job.parallelism.zero_stage = l.zero;
  job.parallelism.recompute = l.recompute;
  job.train.steps = steps;
  comm::InProcessStore store;
  std::vector<std::vector<std::unique_ptr<comm::Communicator>>> tp_groups, dp_groups;
  if (l.tp > 1) {
    for (int d = 0; d < l.dp; ++d) {
      auto g = MakeGroup(store, l.tp, "tp");
      if (!g.ok()) return g.status();
      tp_groups.push_back(std::move(*g));
    }
  }
  if (l.dp > 1) {
    for (int t = 0; t < l.tp; ++t) {
      auto g = MakeGroup(store, l.dp, "dp");
      if (!g.ok()) return g.status();
      dp_groups.push_back(std::move(*g));
    }
  }
  const int world = l.dp * l.tp;
  std::vector<RankPeak> peaks(world);
  std::vector<absl::Status> errors(world);
  std::vector<std::thread> threads;
  for (int d = 0; d < l.dp; ++d) {
    for (int t = 0; t < l.tp; ++t) {
      threads.emplace_back([&, d, t] {
        const int rank = d * l.tp + t;
        comm::Communicator* tp_comm = l.tp > 1 ? tp_groups[d][t].get() : nullptr;
        comm::Communicator* dp_comm = l.dp > 1 ? dp_groups[t][d].get() : nullptr;
        auto loop = engine::TrainingLoop::Create(job, d, l.dp, dp_comm, tp_comm);
        if (!loop.ok()) {
          errors[rank] = loop.status();
          return;
        }
        while (!(*loop)->done()) {
          absl::StatusOr<engine::StepProgress> p = (*loop)->TrainStep();
          if (!p.ok()) {
            errors[rank] = p.status();
            return;
          }
          // Step 1 allocates the activations midway and, under ZeRO-3, sheds
          // the start-up copy of the parameters: steady state starts at 2.
          if (p->step >= 2) MergePeak((*loop)->memory(), &peaks[rank].usage);
        }
      });
    }
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return peaks;
}

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown cpu";
}

int Main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2) {
    std::fprintf(stderr, "--steps=%lld: must be at least 2 (peaks are taken from step 2 on)\n",
                 static_cast<long long>(steps));
    return 2;
  }
  std::string command = absl::GetFlag(FLAGS_command_line);
  if (command.empty()) command = absl::StrJoin(std::vector<std::string>(argv, argv + argc), " ");

  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("loom_engine_memory_", getpid());
  std::filesystem::create_directories(dir);
  const std::string train_path = dir + "/train.txt";
  {
    std::ofstream f(train_path, std::ios::binary | std::ios::trunc);
    f << SyntheticText(400000);
  }

  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string csv;
  absl::StrAppend(
      &csv,
      "# Peak memory per rank of Loom's CPU engine (MemoryTracker, bytes), max over steps 2..",
      steps, "\n# date: ", date, "\n# machine: ", Hostname(), ", ", CpuModel(), ", ",
      std::thread::hardware_concurrency(), " hardware threads\n# command: ", command, "\n");
  absl::StrAppend(&csv,
                  "shape,vocab,hidden,layers,heads,kv_heads,ffn,tied,seq_len,micro_batch,"
                  "global_batch,bucket_mb,dp,tp,sp,zero,recompute,rank,parameters,gradients,"
                  "optimizer,activations,comm_buffers,total_peak\n");
  int failures = 0;
  for (const Shape& s : Shapes()) {
    spec::JobSpec job;
    job.name = s.name;
    job.model = s.model;
    job.train.seq_len = s.seq_len;
    job.train.micro_batch_size = s.micro_batch;
    job.train.global_batch_size = s.global_batch;
    job.train.eval_interval = 0;
    job.train.warmup_steps = 1;
    job.train.seed = 11;
    job.data.train_path = train_path;
    job.data.val_path = "";
    job.parallelism.bucket_mb = s.bucket_mb;
    for (const LayoutCase& l : Layouts()) {
      const std::string label =
          absl::StrCat(s.name, " dp", l.dp, " tp", l.tp, l.sp ? "+sp" : "", " zero", l.zero,
                       " recompute=", l.recompute == spec::Recompute::kFull ? "full" : "none");
      absl::StatusOr<std::vector<RankPeak>> peaks = RunLayout(job, l, steps);
      if (!peaks.ok()) {
        std::fprintf(stderr, "%s: %s\n", label.c_str(),
                     std::string(peaks.status().message()).c_str());
        ++failures;
        continue;
      }
      int64_t worst = 0;
      for (size_t r = 0; r < peaks->size(); ++r) {
        const MemoryUsage& u = (*peaks)[r].usage;
        worst = std::max(worst, u.total_peak);
        const spec::ModelSpec& m = s.model;
        absl::StrAppend(&csv, s.name, ",", m.vocab_size, ",", m.hidden_size, ",", m.num_layers, ",",
                        m.num_heads, ",", m.num_kv_heads, ",", m.ffn_hidden_size, ",",
                        m.tie_embeddings ? 1 : 0, ",", s.seq_len, ",", s.micro_batch, ",",
                        s.global_batch, ",", s.bucket_mb, ",", l.dp, ",", l.tp, ",", l.sp ? 1 : 0,
                        ",", l.zero, ",", l.recompute == spec::Recompute::kFull ? "full" : "none",
                        ",", r, ",", u.Peak(MemoryKind::kParameters), ",",
                        u.Peak(MemoryKind::kGradients), ",", u.Peak(MemoryKind::kOptimizerStates),
                        ",", u.Peak(MemoryKind::kActivations), ",",
                        u.Peak(MemoryKind::kCommBuffers), ",", u.total_peak, "\n");
      }
      std::fprintf(stderr, "%-45s peak %.3f MiB (worst rank)\n", label.c_str(), worst / 1048576.0);
    }
  }
  std::filesystem::remove_all(dir);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fputs(csv.c_str(), stdout);
  } else {
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    f << csv;
    if (!f) {
      std::fprintf(stderr, "--out=%s: cannot write the file\n", out.c_str());
      return 1;
    }
  }
  (void)rest;
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) { return loom::bench::Main(argc, argv); }
