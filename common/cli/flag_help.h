// The flags part of every Loom program's --help: each flag the program
// accepts with its default and meaning, grouped by the part of the source that
// defines it, generated from the Abseil flags themselves (so help cannot omit
// a flag the code defines).
#pragma once

#include <string>
#include <vector>

namespace loom::cli {

struct FlagDoc {
  std::string name;
  std::string default_value;
  std::string help;
  std::string group;  // e.g. "coordinator", "common/rpc"
  bool is_bool = false;
};

// The group of a flag defined in `filename` (as __FILE__ spelt it, absolute
// or relative to the build directory): its directory within the source tree.
std::string FlagGroup(const std::string& filename);

// Every flag linked into this program, except Abseil's own (--flagfile and
// kin, which Loom's parser does not offer); with `only` given, just those.
std::vector<FlagDoc> ProgramFlags(const std::vector<std::string>& only = {});

// "  --name=DEFAULT   help" lines, aligned, wrapped, under one heading per
// group in sorted order; `indent` spaces before each flag.
std::string RenderFlagHelp(const std::vector<FlagDoc>& flags, int indent = 2,
                           bool headings = true);

// One flag, or "" if the program has no such flag.
std::string RenderOneFlag(const std::string& name, int name_width, int indent);

}  // namespace loom::cli
