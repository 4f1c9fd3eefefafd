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
// Checkpoint files are input like any other (a step directory may have been
// crafted): every read opens the name itself, never through a symlink
// (O_NOFOLLOW), without blocking (a FIFO), and reads only a regular file
// (fstat), so a name cannot lead to /dev/zero, a FIFO or another file.
// NOT_FOUND when it cannot be opened, DATA_LOSS when it is no regular file or
// larger than max_bytes.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path,
                                          int64_t max_bytes = INT64_MAX);
// The first min(n, file size) bytes of the file (same rules).
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, int64_t n);
// The size of a regular file (same rules), without reading it.
absl::StatusOr<int64_t> RegularFileSize(const std::string& path);

}  // namespace loom::engine
