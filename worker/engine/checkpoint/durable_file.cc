#include "worker/engine/checkpoint/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

namespace {

// An open regular file, closed when it goes.
class RegularFile {
 public:
  static absl::StatusOr<RegularFile> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": missing or unreadable"));
    RegularFile file(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::DataLossError(
          absl::StrCat(path, ": not a regular file (a link, directory, device or FIFO)"));
    }
    file.size_ = static_cast<int64_t>(st.st_size);
    return file;
  }
  RegularFile(RegularFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  RegularFile& operator=(RegularFile&&) = delete;
  ~RegularFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t size() const { return size_; }
  // Up to n bytes from the start (fewer if the file is shorter now).
  absl::StatusOr<std::string> Read(const std::string& path, int64_t n) const {
    std::string bytes(static_cast<size_t>(n > 0 ? n : 0), '\0');
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t got = ::pread(fd_, bytes.data() + done, bytes.size() - done,
                                  static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return absl::DataLossError(absl::StrCat(path, ": read error"));
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    bytes.resize(done);
    return bytes;
  }

 private:
  explicit RegularFile(int fd) : fd_(fd) {}
  int fd_;
  int64_t size_ = 0;
};

}  // namespace

absl::StatusOr<std::string> ReadFileBytes(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<RegularFile> file = RegularFile::Open(path);
  if (!file.ok()) return file.status();
  if (file->size() > max_bytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", file->size(), " bytes, more than the ", max_bytes, " allowed"));
  }
  absl::StatusOr<std::string> bytes = file->Read(path, file->size());
  if (bytes.ok() && static_cast<int64_t>(bytes->size()) != file->size()) {
    return absl::DataLossError(absl::StrCat(path, ": read error (the file changed)"));
  }
  return bytes;
}

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, int64_t n) {
  absl::StatusOr<RegularFile> file = RegularFile::Open(path);
  if (!file.ok()) return file.status();
  return file->Read(path, std::min(n, file->size()));
}

absl::StatusOr<int64_t> RegularFileSize(const std::string& path) {
  absl::StatusOr<RegularFile> file = RegularFile::Open(path);
  if (!file.ok()) return file.status();
  return file->size();
}

}  // namespace loom::engine
