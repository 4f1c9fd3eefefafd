#include "common/cli/parse_flags.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/flags/reflection.h"
#include "common/cli/closest_name.h"
#include "common/cli/flag_help.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"

namespace loom::cli {
namespace {

std::string& Program() {
  static std::string program = "loom";
  return program;
}
std::string& Usage() {
  static std::string usage;
  return usage;
}

bool IsBool(const absl::CommandLineFlag& flag) { return flag.IsOfType<bool>(); }

}  // namespace

void UsageError(const std::string& message) {
  std::fprintf(stderr, "%s: %s; usage: %s\n", Program().c_str(), message.c_str(),
               Usage().c_str());
  std::exit(2);
}

[[noreturn]] static void UnknownFlag(const std::string& name) {
  std::vector<std::string> names;
  for (const FlagDoc& flag : ProgramFlags()) names.push_back(flag.name);
  UsageError("unknown flag --" + name + DidYouMean(name, names, "--"));
}

CommandLine ParseCommandLine(int argc, char** argv, const std::string& usage) {
  const std::string path = argc > 0 ? argv[0] : "loom";
  Program() = path.substr(path.find_last_of('/') + 1);
  Usage() = usage;
  CommandLine parsed;
  std::vector<std::string>& positional = parsed.positional;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    if (body == "help" || body == "h") {
      parsed.help = true;
      return parsed;
    }
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (auto eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && name.rfind("no", 0) == 0) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && IsBool(*negated)) {
        flag = negated;
        value = "false";
        has_value = true;
      }
    }
    if (flag == nullptr || flag->IsRetired()) UnknownFlag(name);
    if (!has_value) {
      if (IsBool(*flag)) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        UsageError("flag --" + name + " needs a value");
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      UsageError("bad value for --" + name + "='" + value + "': " + error);
    }
    parsed.flags_set.push_back(std::string(flag->Name()));
  }
  return parsed;
}

std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const std::string& usage) {
  CommandLine parsed = ParseCommandLine(argc, argv, usage);
  if (parsed.help) {
    std::printf("usage: %s\n\n%s", usage.c_str(), RenderFlagHelp(ProgramFlags()).c_str());
    std::exit(0);
  }
  return std::move(parsed.positional);
}

}  // namespace loom::cli
