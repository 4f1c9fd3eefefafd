// The agent's one way to read a rank's log file: for the failure reason sent
// with a rank's exit (ReadLogTail) and for `loomctl logs` (ReadLogBeneath).
//
// A rank can write everything beneath its job's directory, so nothing there
// is trusted: the path is walked from the agent's own work directory one
// component at a time with O_NOFOLLOW (a symlink anywhere, planted before or
// after the rank ended, is refused, never followed), the file is opened
// O_NONBLOCK (a FIFO or device left in its place cannot block the caller),
// fstat must say regular file, and at most max_bytes are read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace loom::agent {

struct LogRead {
  std::string data;      // at most max_bytes
  int64_t offset = 0;    // where `data` starts in the file
  int64_t file_size = 0; // the file's size when it was read
};

// Bytes of the regular file `relative` (components separated by '/'; no
// empty, "." or ".." component) beneath the trusted directory `root`, from
// `offset` (negative: the last max_bytes) up to max_bytes. NOT_FOUND when a
// component is missing; FAILED_PRECONDITION when one is a symlink or the file
// is not a regular file; INVALID_ARGUMENT for a bad `relative`.
absl::StatusOr<LogRead> ReadLogBeneath(const std::string& root, const std::string& relative,
                                       int64_t offset, size_t max_bytes);

// The last `max_lines` lines of `relative` beneath `root`, reading at most its
// last `max_bytes` bytes (a line cut by that limit is dropped unless it is the
// only one), joined with '\n' without a trailing newline. A file that is
// missing or refused gives "" or, when refused, a note saying why.
std::string ReadLogTail(const std::string& root, const std::string& relative,
                        size_t max_lines = 20, size_t max_bytes = 16 * 1024);

// The same over text already in memory; `cut_at_start` says the text begins
// in the middle of a line.
std::string TailLines(const std::string& text, size_t max_lines, bool cut_at_start);

}  // namespace loom::agent
