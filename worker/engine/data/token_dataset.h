// A token stream the engine trains or evaluates on, loaded whole into memory
// and validated once: raw text read as bytes (vocabulary 256) or an
// llm.c / nanoGPT token file (256 x int32 header: magic 20240520, version 1,
// token count at index 2; then uint16 tokens). Every load error names the file
// and the fault.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace loom::engine {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderInts = 256;

class TokenDataset {
 public:
  // Every token id must be < vocab_size, or the load fails naming the first
  // offender and its position.
  static absl::StatusOr<TokenDataset> Load(const std::string& path, spec::DataFormat format,
                                           int64_t vocab_size);
  // For tests and tools: a dataset over tokens already in memory.
  static TokenDataset FromTokens(std::vector<uint16_t> tokens, std::string name);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const uint16_t* data() const { return tokens_.data(); }
  uint16_t operator[](int64_t i) const { return tokens_[static_cast<size_t>(i)]; }
  const std::string& path() const { return path_; }

 private:
  std::vector<uint16_t> tokens_;
  std::string path_;
};

// Writes an llm.c token file (for tools and tests).
absl::Status WriteTokenFile(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace loom::engine
