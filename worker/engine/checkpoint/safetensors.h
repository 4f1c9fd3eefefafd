// Our own reader and writer of the safetensors format: an 8-byte little-endian
// header length, a JSON header mapping each tensor name to its dtype, shape and
// [begin, end) byte offsets in the data section (plus an optional
// "__metadata__" map of strings), then the data. Loom writes and reads F32
// only. The reader refuses anything malformed with an error naming the file
// and the fault.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offsets within the data section
  int64_t end = 0;
};

// Writes tensors in the given order (names must be unique) and fsyncs the file.
absl::StatusOr<FileDigest> WriteSafetensors(const std::string& path,
                                            const std::vector<TensorView>& tensors,
                                            const std::map<std::string, std::string>& metadata);

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);
  // bytes: the whole file; path is used in errors.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, std::string path);
  // Only the header of the file at path, checked against the file's size
  // (file_size) exactly as Parse checks it; the data is not read, so
  // CopyTo, Values and CopyElements must not be called on the result.
  static absl::StatusOr<SafetensorsFile> ReadHeader(const std::string& path, int64_t file_size);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  // Copies tensor `name` into dst; the shapes must be equal.
  absl::Status CopyTo(const std::string& name, const TensorView& dst) const;
  std::vector<float> Values(const SafetensorsEntry& entry) const;
  // Copies elements [first, first + count) of the entry (row-major, F32).
  void CopyElements(const SafetensorsEntry& entry, int64_t first, int64_t count, float* out) const;
  const std::string& bytes() const { return bytes_; }

 private:
  // Checks the header in bytes_ (which holds at least the header) against a
  // file of file_size bytes.
  absl::Status ParseHeader(int64_t file_size);

  std::string path_;
  std::string bytes_;
  int64_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> by_name_;
};

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace loom::engine
