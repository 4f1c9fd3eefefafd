// Helpers shared by the engine tests: scratch directories, small files, a
// deterministic English-like text, and a tiny job spec.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/spec/job_spec.h"
#include "tests/common/scratch_dir.h"

namespace loom::engine::testing {

// A fresh directory, removed by the destructor.
class ScratchDir : public loom::testing::ScratchDir {
 public:
  ScratchDir() : loom::testing::ScratchDir("loom_engine") {}
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Words drawn by a fixed LCG: learnable structure, no I/O dependencies.
inline std::string SyntheticText(int64_t bytes, uint64_t seed) {
  static const char* kWords[] = {"the ", "model ", "learns ", "to ", "predict ", "next ",
                                 "byte ", "in ", "a ", "stream ", "of ", "text, ",
                                 "and ", "loss ", "goes ", "down.\n"};
  std::string out;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  while (static_cast<int64_t>(out.size()) < bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out += kWords[(x >> 33) % 16];
  }
  out.resize(static_cast<size_t>(bytes));
  return out;
}

// train.txt (20 kB) and val.txt (2 kB) of SyntheticText in `dir` (a ScratchDir
// or a path): the corpus of the tiny jobs.
template <typename Dir>
void WriteTinyCorpus(const Dir& dir) {
  WriteFile(dir / "train.txt", SyntheticText(20000, 1));
  WriteFile(dir / "val.txt", SyntheticText(2000, 2));
}

// hidden 32, 2 layers, 4 heads over 2 kv heads, seq 16: milliseconds per step.
inline spec::JobSpec TinyJob(const std::string& train_path, const std::string& val_path) {
  spec::JobSpec job;
  job.name = "tiny";
  job.model.vocab_size = 256;
  job.model.hidden_size = 32;
  job.model.num_layers = 2;
  job.model.num_heads = 4;
  job.model.num_kv_heads = 2;
  job.model.ffn_hidden_size = 64;
  job.model.max_seq_len = 32;
  job.train.steps = 20;
  job.train.global_batch_size = 8;
  job.train.micro_batch_size = 2;
  job.train.seq_len = 16;
  job.train.lr = 3e-3;
  job.train.warmup_steps = 3;
  job.train.eval_interval = 5;
  job.train.eval_windows = 4;
  job.train.seed = 7;
  job.data.train_path = train_path;
  job.data.val_path = val_path;
  job.data.format = spec::DataFormat::kText;
  return job;
}

}  // namespace loom::engine::testing
