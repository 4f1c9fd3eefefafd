// The last lines of a rank's log file: what the agent sends to the
// coordinator with a rank's exit so that a failure reason is visible without
// access to the node.
#pragma once

#include <cstddef>
#include <string>

namespace loom::agent {

// The last `max_lines` lines of the file at `path`, reading at most its last
// `max_bytes` bytes (a line cut by that limit is dropped unless it is the only
// one). Lines are joined with '\n', without a trailing newline. A file that is
// missing or unreadable gives "".
std::string ReadLogTail(const std::string& path, size_t max_lines = 20,
                        size_t max_bytes = 16 * 1024);

// The same over text already in memory; `cut_at_start` says the text begins
// in the middle of a line.
std::string TailLines(const std::string& text, size_t max_lines, bool cut_at_start);

}  // namespace loom::agent
