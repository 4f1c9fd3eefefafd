// Files that survive a crash once written: every write goes through here, is
// fsynced before Close() returns, and reports its size and CRC-32 so the
// checkpoint metadata can record them without reading the file back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::engine {

struct FileDigest {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

class DurableFile {
 public:
  // Creates or truncates path; a symlink at path is refused, never followed.
  static absl::StatusOr<DurableFile> Create(const std::string& path);
  DurableFile(DurableFile&& other) noexcept;
  DurableFile& operator=(DurableFile&&) = delete;
  ~DurableFile();

  absl::Status Write(const void* data, size_t size);
  // fsync + close; the digest covers every byte written.
  absl::StatusOr<FileDigest> Close();

 private:
  DurableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
  FileDigest digest_;
};

absl::StatusOr<FileDigest> WriteFileDurably(const std::string& path, std::string_view content);
// fsync of a directory makes creations and renames inside it durable.
absl::Status FsyncDirectory(const std::string& path);
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);
// The first min(n, file size) bytes of the file.
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, int64_t n);

}  // namespace loom::engine
