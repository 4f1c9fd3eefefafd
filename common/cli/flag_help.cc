#include "common/cli/flag_help.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "absl/flags/reflection.h"

namespace loom::cli {
namespace {

constexpr size_t kWidth = 100;

// The source tree's top-level directories that define flags.
constexpr const char* kTopDirectories[] = {"coordinator", "common", "worker", "client",
                                           "tools",       "planner", "export", "tests"};

std::string Shown(const FlagDoc& flag) {
  if (flag.is_bool) return "--" + flag.name;
  return "--" + flag.name + "=" + (flag.default_value.empty() ? "\"\"" : flag.default_value);
}

// `text` wrapped to lines of at most `width` characters, each after `indent`.
std::string Wrap(const std::string& text, size_t first_column, size_t indent) {
  std::istringstream words(text);
  std::string word, out;
  size_t column = first_column;
  bool line_start = true;
  while (words >> word) {
    if (!line_start && column + 1 + word.size() > kWidth) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      line_start = true;
    }
    if (!line_start) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    line_start = false;
  }
  return out;
}

std::string RenderLine(const FlagDoc& flag, size_t name_width, size_t indent) {
  std::string shown = Shown(flag);
  std::string line = std::string(indent, ' ') + shown;
  std::string help = flag.help;
  if (flag.is_bool) help += flag.default_value == "true" ? " (default: on)" : " (default: off)";
  size_t column = indent + std::max(name_width, shown.size()) + 2;
  line.resize(column, ' ');
  // Continuation lines under the help column, unless that leaves no room.
  return line + Wrap(help, column, column <= 60 ? column : indent + 6) + "\n";
}

}  // namespace

std::string FlagGroup(const std::string& filename) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(filename);
  while (std::getline(in, part, '/')) parts.push_back(part);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    for (const char* top : kTopDirectories) {
      if (parts[i] != top) continue;
      std::string group = parts[i];
      for (size_t j = i + 1; j + 1 < parts.size(); ++j) group += "/" + parts[j];
      return group;
    }
  }
  return parts.size() > 1 ? parts[parts.size() - 2] : "flags";
}

std::vector<FlagDoc> ProgramFlags(const std::vector<std::string>& only) {
  std::vector<FlagDoc> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    const std::string filename = flag->Filename();
    if (filename.find("absl/") != std::string::npos) continue;
    if (!only.empty() && std::find(only.begin(), only.end(), std::string(name)) == only.end()) {
      continue;
    }
    flags.push_back({std::string(name), flag->DefaultValue(), flag->Help(), FlagGroup(filename),
                     flag->IsOfType<bool>()});
  }
  std::sort(flags.begin(), flags.end(), [](const FlagDoc& a, const FlagDoc& b) {
    return std::tie(a.group, a.name) < std::tie(b.group, b.name);
  });
  return flags;
}

std::string RenderFlagHelp(const std::vector<FlagDoc>& flags, int indent, bool headings) {
  size_t width = 0;
  for (const FlagDoc& flag : flags) width = std::max(width, std::min<size_t>(Shown(flag).size(), 34));
  std::string out;
  std::string group = "\x01";
  for (const FlagDoc& flag : flags) {
    if (headings && flag.group != group) {
      group = flag.group;
      out += (out.empty() ? "" : "\n") + std::string("flags from ") + group + "/:\n";
    }
    out += RenderLine(flag, width, static_cast<size_t>(indent));
  }
  return out;
}

std::string RenderOneFlag(const std::string& name, int name_width, int indent) {
  std::vector<FlagDoc> flags = ProgramFlags({name});
  if (flags.empty()) return "";
  return RenderLine(flags.front(), static_cast<size_t>(name_width), static_cast<size_t>(indent));
}

}  // namespace loom::cli
