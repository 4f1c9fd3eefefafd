#include "worker/engine/checkpoint/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/crc32.h"

namespace loom::engine {
namespace {

absl::Status Errno(const std::string& path, const char* what) {
  return absl::InternalError(absl::StrCat(path, ": ", what, " failed: ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<DurableFile> DurableFile::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(path, "open for writing");
  return DurableFile(fd, path);
}

DurableFile::DurableFile(DurableFile&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), digest_(other.digest_) {
  other.fd_ = -1;
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status DurableFile::Write(const void* data, size_t size) {
  digest_.crc32 = Crc32(digest_.crc32, data, size);
  digest_.bytes += static_cast<int64_t>(size);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(path_, "write");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> DurableFile::Close() {
  if (::fsync(fd_) != 0) return Errno(path_, "fsync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Errno(path_, "close");
  return digest_;
}

absl::StatusOr<FileDigest> WriteFileDurably(const std::string& path, std::string_view content) {
  absl::StatusOr<DurableFile> file = DurableFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Write(content.data(), content.size()); !s.ok()) return s;
  return file->Close();
}

absl::Status FsyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(path, "open directory");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno(path, "fsync directory");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": missing or unreadable"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return bytes;
}

}  // namespace loom::engine

namespace loom::engine {

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, int64_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": missing or unreadable"));
  std::string bytes(static_cast<size_t>(n > 0 ? n : 0), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  bytes.resize(static_cast<size_t>(in.gcount()));
  return bytes;
}

}  // namespace loom::engine
