#include "worker/agent/log_tail.h"

#include <fstream>
#include <vector>

namespace loom::agent {

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

std::string ReadLogTail(const std::string& path, size_t max_lines, size_t max_bytes) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) return "";
  std::streamoff size = file.tellg();
  if (size <= 0) return "";
  std::streamoff offset = size > static_cast<std::streamoff>(max_bytes)
                              ? size - static_cast<std::streamoff>(max_bytes)
                              : 0;
  file.seekg(offset);
  std::string text(static_cast<size_t>(size - offset), '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(file.gcount()));
  bool cut = false;
  if (offset > 0) {
    // Cut mid-line unless the byte before the window ends a line.
    char before = '\n';
    file.clear();
    file.seekg(offset - 1);
    file.get(before);
    cut = before != '\n';
  }
  return TailLines(text, max_lines, cut);
}

}  // namespace loom::agent
