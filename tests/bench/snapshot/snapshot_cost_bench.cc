// What in-place recovery's snapshots cost a training step: two data-parallel
// ranks (threads, Gloo on loopback, ZeRO-1) train a small Llama in blocks of
// four steps, alternately without snapshots and with a snapshot after every
// step copied to the other rank (its buddy) in the background, as a
// coordinated rank does. Prints one JSON
// line per rank: the median step time of each mode, and
// with snapshots the median capture time, wait for the previous copy, copy
// time (in the background, overlapped with the next step) and the snapshot's
// bytes. A benchmark, not a test: the numbers go to docs/fault_tolerance.md.
//
// usage: snapshot_cost_bench [--steps=16] [--hidden=256] [--layers=4] [--seq=128]
//                            [--batch=8] [--threads=1]
#include <algorithm>
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

struct RankNumbers {
  std::vector<double> plain_step, snap_step, capture, wait, copy;
  int64_t snapshot_bytes = 0, copy_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  const int64_t steps = Flag(argc, argv, "steps", 16);
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
  job.model.ffn_hidden_size = job.model.hidden_size * 4;
  job.model.max_seq_len = Flag(argc, argv, "seq", 128);
  job.train.steps = 2 * steps;
  job.train.seq_len = job.model.max_seq_len;
  job.train.global_batch_size = Flag(argc, argv, "batch", 8);
  job.train.micro_batch_size = job.train.global_batch_size / 2;
  job.train.eval_interval = 0;
  job.data.train_path = dir + "/train.txt";
  job.parallelism.dp = 2;
  job.parallelism.zero_stage = 1;
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);

  comm::InProcessStore store;
  std::vector<RankNumbers> numbers(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      comm::PrefixStore view(store, "bench");
      auto dp = comm::CreateGroupCommunicator(view, "", "dp", {0, 1}, r, absl::Seconds(120));
      comm::PairGroupOptions options;
      options.timeout = absl::Seconds(120);
      auto pairs = comm::CreatePairGroups(view, r, {1 - r}, options);
      if (!dp.ok() || !pairs.ok()) {
        std::fprintf(stderr, "groups: %s %s\n", dp.status().ToString().c_str(),
                     pairs.status().ToString().c_str());
        std::exit(1);
      }
      auto loop = engine::TrainingLoop::Create(job, r, 2, dp->get());
      if (!loop.ok()) {
        std::fprintf(stderr, "loop: %s\n", loop.status().ToString().c_str());
        std::exit(1);
      }
      RankNumbers& n = numbers[static_cast<size_t>(r)];
      engine::SnapshotKeeperOptions ko;
      ko.interval = 1;
      ko.rank = r;
      engine::SnapshotKeeper keeper(ko);
      comm::Communicator* pair = pairs->at(1 - r).get();
      keeper.AttachRing(pair, pair, 1 - r);
      // Blocks of kBlock steps, alternately without and with snapshots, so
      // both see the same load; the first step of a block is dropped (it
      // still carries the other mode's last copy, or none).
      constexpr int64_t kBlock = 4;
      for (int64_t s = 0; s < 2 * steps; ++s) {
        const bool snap = (s / kBlock) % 2 == 1;
        const auto start = std::chrono::steady_clock::now();
        auto p = (*loop)->TrainStep();
        if (!p.ok()) std::exit(1);
        if (snap && !keeper.AfterStep(**loop, &*p).ok()) std::exit(1);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (s < kBlock || s % kBlock == 0) continue;
        if (!snap) {
          n.plain_step.push_back(took);
          continue;
        }
        n.snap_step.push_back(took);
        n.capture.push_back(p->snapshot->capture_seconds);
        n.wait.push_back(p->snapshot->wait_seconds);
        n.copy.push_back(p->snapshot->copy_seconds);
        n.snapshot_bytes = p->snapshot->snapshot_bytes;
        n.copy_bytes = p->snapshot->copy_bytes;
      }
      keeper.WaitForCopies();
      keeper.DetachRing();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    const RankNumbers& n = numbers[static_cast<size_t>(r)];
    const double plain = Median(n.plain_step), with = Median(n.snap_step);
    std::printf(
        "{\"rank\":%d,\"step_s\":%.4f,\"step_with_snapshots_s\":%.4f,\"overhead\":%.4f,"
        "\"capture_s\":%.4f,\"wait_s\":%.4f,\"copy_s\":%.4f,\"snapshot_bytes\":%lld,"
        "\"copy_bytes\":%lld}\n",
        r, plain, with, plain > 0 ? with / plain - 1 : 0, Median(n.capture), Median(n.wait),
        Median(n.copy), static_cast<long long>(n.snapshot_bytes),
        static_cast<long long>(n.copy_bytes));
  }
  return 0;
}
