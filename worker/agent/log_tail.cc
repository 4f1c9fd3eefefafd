#include "worker/agent/log_tail.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::agent {
namespace {

// Closes a descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

absl::Status OpenError(const std::string& what, int error) {
  if (error == ENOENT) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  if (error == ELOOP || error == ENOTDIR) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is a symbolic link or not a directory; it is not followed"));
  }
  return absl::PermissionDeniedError(absl::StrCat("cannot open ", what, ": ", strerror(error)));
}

}  // namespace

absl::StatusOr<LogRead> ReadLogBeneath(const std::string& root, const std::string& relative,
                                       int64_t offset, size_t max_bytes) {
  std::vector<std::string> parts = absl::StrSplit(relative, '/');
  for (const std::string& part : parts) {
    if (part.empty() || part == "." || part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("log path '", relative, "' must be plain names separated by '/'"));
    }
  }
  // The root is the agent's own work directory, named by its operator.
  Fd dir(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return OpenError(root, errno);
  std::string walked = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += "/" + parts[i];
    int next = openat(dir.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return OpenError(walked, errno);
    dir.reset(next);
  }
  walked += "/" + parts.back();
  Fd file(openat(dir.get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat(walked, " is a symbolic link; it is not followed"));
    }
    return OpenError(walked, errno);
  }
  struct stat info = {};
  if (fstat(file.get(), &info) != 0) return OpenError(walked, errno);
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(walked, " is not a regular file; it is not read"));
  }
  LogRead read;
  read.file_size = static_cast<int64_t>(info.st_size);
  const int64_t limit = static_cast<int64_t>(max_bytes);
  read.offset = offset < 0 ? std::max<int64_t>(0, read.file_size - limit)
                           : std::min(offset, read.file_size);
  read.data.resize(static_cast<size_t>(std::min(limit, read.file_size - read.offset)));
  size_t got = 0;
  while (got < read.data.size()) {
    ssize_t n = pread(file.get(), read.data.data() + got, read.data.size() - got,
                      static_cast<off_t>(read.offset + static_cast<int64_t>(got)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the file shrank, or an error: what was read stands
    got += static_cast<size_t>(n);
  }
  read.data.resize(got);
  return read;
}

std::string TailLines(const std::string& text, size_t max_lines, bool cut_at_start) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  if (cut_at_start && lines.size() > 1) lines.erase(lines.begin());
  size_t first = lines.size() > max_lines ? lines.size() - max_lines : 0;
  std::string out;
  for (size_t i = first; i < lines.size(); ++i) {
    if (i > first) out += '\n';
    out += lines[i];
  }
  return out;
}

std::string ReadLogTail(const std::string& root, const std::string& relative, size_t max_lines,
                        size_t max_bytes) {
  // One byte more than the window: whether the window starts a line.
  absl::StatusOr<LogRead> read = ReadLogBeneath(root, relative, -1, max_bytes + 1);
  if (!read.ok()) {
    if (absl::IsNotFound(read.status())) return "";
    return absl::StrCat("(the log was not read: ", read.status().message(), ")");
  }
  std::string& text = read->data;
  bool cut = false;
  if (text.size() > max_bytes) {
    cut = text[0] != '\n';
    text.erase(0, 1);
  }
  return TailLines(text, max_lines, cut);
}

}  // namespace loom::agent
