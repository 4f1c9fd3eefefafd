// What in-place recovery's snapshots cost a training step: two data-parallel
// ranks (threads, Gloo on loopback, ZeRO-1 unless --zero) train a small Llama in blocks of
// four steps, rotating through three modes so that all of them see the same
// load: no snapshots (snapshot_interval 0); a snapshot after every step copied
// to the other rank (its buddy) in the background with the copy threads at
// the ranks' CPU priority (what a rank does); and the same with the copy
// threads at the lowest priority (comm/background_priority.h, an option of
// SnapshotKeeperOptions and PairGroupOptions, off by default). Prints one JSON line per rank and mode: the median step time,
// the overhead against no snapshots, the median capture time (on the step),
// wait for the previous copy, copy time (in the background) and the bytes,
// and the process's CPU seconds per step (every thread: the ranks, Gloo's,
// the copies'), whose excess over no snapshots is what the snapshot costs in
// CPU. A benchmark, not a test: the numbers go to docs/fault_tolerance.md.
//
// usage: snapshot_cost_bench [--steps=16] [--hidden=256] [--layers=4] [--seq=128]
//                            [--batch=8] [--threads=1] [--zero=1] [--ffn=4*hidden]
//   (the README demo's shape: --hidden=384 --layers=6 --ffn=1024 --batch=16 --zero=0)
//   --steps: counted steps per mode (each block of four counts its last three)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/group_factory.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/pair_groups.h"
#include "worker/comm/prefix_store.h"
#include "worker/engine/snapshot_keeper.h"
#include "worker/engine/training_loop.h"

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      return std::atoll(argv[i] + prefix.size());
  }
  return def;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ProcessCpuSeconds() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

enum Mode { kNone = 0, kCopyAtRankPriority = 1, kCopyInBackground = 2, kModes = 3 };
const char* const kModeNames[kModes] = {"none", "copy_at_rank_priority", "copy_in_background"};

struct ModeNumbers {
  std::vector<double> step, capture, wait, copy, cpu;
  int64_t snapshot_bytes = 0, copy_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  const int64_t counted = Flag(argc, argv, "steps", 16);
  constexpr int64_t kBlock = 4;
  // Each block counts kBlock - 1 steps; whole rounds of the three modes.
  const int64_t rounds = (counted + kBlock - 2) / (kBlock - 1);
  const int64_t steps = rounds * kModes * kBlock;
  const int threads = static_cast<int>(Flag(argc, argv, "threads", 1));
  const std::string dir = std::filesystem::temp_directory_path() / "loom_snapshot_bench";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/train.txt", std::ios::binary);
    uint64_t x = 12345;
    std::string text;
    for (int i = 0; i < 2'000'000; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text.push_back(static_cast<char>('a' + (x >> 59)));
    }
    out << text;
  }
  spec::JobSpec job;
  job.model.vocab_size = 256;
  job.model.hidden_size = Flag(argc, argv, "hidden", 256);
  job.model.num_layers = Flag(argc, argv, "layers", 4);
  job.model.num_heads = 8;
  job.model.num_kv_heads = 4;
  job.model.ffn_hidden_size = Flag(argc, argv, "ffn", job.model.hidden_size * 4);
  job.model.max_seq_len = Flag(argc, argv, "seq", 128);
  job.train.steps = steps;
  job.train.seq_len = job.model.max_seq_len;
  job.train.global_batch_size = Flag(argc, argv, "batch", 8);
  job.train.micro_batch_size = job.train.global_batch_size / 2;
  job.train.eval_interval = 0;
  job.data.train_path = dir + "/train.txt";
  job.parallelism.dp = 2;
  job.parallelism.zero_stage = Flag(argc, argv, "zero", 1);
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);

  comm::InProcessStore store;
  std::vector<std::vector<ModeNumbers>> numbers(2, std::vector<ModeNumbers>(kModes));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      comm::PrefixStore view(store, "bench");
      auto dp = comm::CreateGroupCommunicator(view, "", "dp", {0, 1}, r, absl::Seconds(120));
      comm::PairGroupOptions options;
      options.timeout = absl::Seconds(120);
      options.background = false;
      auto pairs = comm::CreatePairGroups(view, r, {1 - r}, options);
      options.background = true;
      auto background_pairs = comm::CreatePairGroups(view, r, {1 - r}, options);
      if (!dp.ok() || !pairs.ok() || !background_pairs.ok()) {
        std::fprintf(stderr, "groups: %s %s %s\n", dp.status().ToString().c_str(),
                     pairs.status().ToString().c_str(),
                     background_pairs.status().ToString().c_str());
        std::exit(1);
      }
      auto loop = engine::TrainingLoop::Create(job, r, 2, dp->get());
      if (!loop.ok()) {
        std::fprintf(stderr, "loop: %s\n", loop.status().ToString().c_str());
        std::exit(1);
      }
      std::vector<ModeNumbers>& n = numbers[static_cast<size_t>(r)];
      std::vector<std::unique_ptr<engine::SnapshotKeeper>> keepers(kModes);
      for (int m = kCopyAtRankPriority; m < kModes; ++m) {
        engine::SnapshotKeeperOptions ko;
        ko.interval = 1;
        ko.rank = r;
        ko.background_copies = m == kCopyInBackground;
        keepers[static_cast<size_t>(m)] = std::make_unique<engine::SnapshotKeeper>(ko);
        comm::Communicator* pair =
            (m == kCopyInBackground ? *background_pairs : *pairs).at(1 - r).get();
        keepers[static_cast<size_t>(m)]->AttachRing(pair, pair, 1 - r);
      }
      // Blocks of kBlock steps rotating through the modes; the first step of
      // a block is dropped (it still carries the previous mode's last copy).
      for (int64_t s = 0; s < steps; ++s) {
        const int mode = static_cast<int>((s / kBlock) % kModes);
        engine::SnapshotKeeper* keeper = keepers[static_cast<size_t>(mode)].get();
        const double cpu_start = ProcessCpuSeconds();
        const auto start = std::chrono::steady_clock::now();
        auto p = (*loop)->TrainStep();
        if (!p.ok()) std::exit(1);
        if (keeper != nullptr && !keeper->AfterStep(**loop, &*p).ok()) std::exit(1);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double cpu = ProcessCpuSeconds() - cpu_start;
        if (s % kBlock == 0) continue;
        ModeNumbers& m = n[static_cast<size_t>(mode)];
        m.step.push_back(took);
        m.cpu.push_back(cpu);
        if (keeper == nullptr) continue;
        m.capture.push_back(p->snapshot->capture_seconds);
        m.wait.push_back(p->snapshot->wait_seconds);
        m.copy.push_back(p->snapshot->copy_seconds);
        m.snapshot_bytes = p->snapshot->snapshot_bytes;
        m.copy_bytes = p->snapshot->copy_bytes;
      }
      for (auto& k : keepers) {
        if (k == nullptr) continue;
        k->WaitForCopies();
        k->DetachRing();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    const std::vector<ModeNumbers>& n = numbers[static_cast<size_t>(r)];
    const double plain = Median(n[kNone].step);
    const double plain_cpu = Median(n[kNone].cpu);
    for (int m = 0; m < kModes; ++m) {
      const ModeNumbers& x = n[static_cast<size_t>(m)];
      const double step = Median(x.step), cpu = Median(x.cpu);
      std::printf(
          "{\"rank\":%d,\"mode\":\"%s\",\"steps\":%zu,\"step_s\":%.4f,\"overhead\":%.4f,"
          "\"cpu_per_step_s\":%.4f,\"extra_cpu_per_step_s\":%.4f,\"capture_s\":%.4f,"
          "\"wait_s\":%.4f,\"copy_s\":%.4f,\"snapshot_bytes\":%lld,\"copy_bytes\":%lld}\n",
          r, kModeNames[m], x.step.size(), step, plain > 0 ? step / plain - 1 : 0, cpu,
          cpu - plain_cpu, Median(x.capture), Median(x.wait), Median(x.copy),
          static_cast<long long>(x.snapshot_bytes), static_cast<long long>(x.copy_bytes));
    }
  }
  return 0;
}
