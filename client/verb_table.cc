#include "client/verb_table.h"

#include <algorithm>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cli/closest_name.h"
#include "common/cli/flag_help.h"

namespace loom::client {
namespace {

int WordCount(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  int count = 0;
  while (in >> word) ++count;
  return count;
}

int MinArgs(const Verb& verb) {
  return verb.min_args >= 0 ? verb.min_args : WordCount(verb.arguments);
}
int MaxArgs(const Verb& verb) {
  return verb.max_args >= 0 ? verb.max_args : WordCount(verb.arguments);
}

std::string FlagList(const std::vector<std::string>& names, int indent) {
  size_t width = 0;
  std::vector<cli::FlagDoc> flags = cli::ProgramFlags(names);
  for (const cli::FlagDoc& flag : flags) {
    width = std::max(width, flag.name.size() + 3 + (flag.is_bool ? 0 : flag.default_value.size() + 1));
  }
  width = std::min<size_t>(width, 30);
  std::string out;
  for (const std::string& name : names) out += cli::RenderOneFlag(name, static_cast<int>(width), indent);
  return out;
}

}  // namespace

const std::vector<std::string>& GlobalFlags() {
  static const std::vector<std::string> flags = {"coordinator", "tls_dir",  "tls_ca",
                                                 "tls_cert",    "tls_key",  "insecure",
                                                 "token_file"};
  return flags;
}

const Verb* FindVerb(const std::vector<Verb>& verbs, const std::string& name) {
  for (const Verb& verb : verbs) {
    if (verb.name == name) return &verb;
  }
  return nullptr;
}

std::string RenderHelp(const std::vector<Verb>& verbs) {
  std::string out =
      "loomctl submits, plans and follows Loom training jobs.\n\n"
      "usage: loomctl [global flags] VERB [arguments] [flags]\n\nverbs:\n";
  size_t width = 0;
  for (const Verb& verb : verbs) {
    width = std::max(width, verb.name.size() + (verb.arguments.empty() ? 0 : 1 + verb.arguments.size()));
  }
  width = std::min<size_t>(width, 32);
  for (const Verb& verb : verbs) {
    std::string left = verb.arguments.empty() ? verb.name : verb.name + " " + verb.arguments;
    left.resize(std::max(width, left.size()), ' ');
    absl::StrAppend(&out, "  ", left, "  ", verb.summary, "\n");
  }
  absl::StrAppend(&out, "\nglobal flags (TLS defaults to $LOOM_TLS_DIR, the token to $LOOM_TOKEN):\n",
                  FlagList(GlobalFlags(), 2),
                  "\n`loomctl help VERB` or `loomctl VERB --help` shows a verb's flags and an "
                  "example.\n");
  return out;
}

std::string RenderVerbHelp(const Verb& verb) {
  std::string synopsis = "loomctl " + verb.name;
  if (!verb.arguments.empty()) absl::StrAppend(&synopsis, " ", verb.arguments);
  for (const cli::FlagDoc& flag : cli::ProgramFlags(verb.flags)) {
    absl::StrAppend(&synopsis, flag.is_bool ? " [--" + flag.name + "]"
                                            : " [--" + flag.name + "=...]");
  }
  std::string out = absl::StrCat("usage: ", synopsis, "\n\n", verb.summary, "\n");
  if (!verb.flags.empty()) absl::StrAppend(&out, "\nflags:\n", FlagList(verb.flags, 2));
  absl::StrAppend(&out, "\nexample:\n  ", verb.example, "\n\nglobal flags: --",
                  absl::StrJoin(GlobalFlags(), ", --"), " (`loomctl help`)\n");
  return out;
}

std::string UnknownVerbMessage(const std::vector<Verb>& verbs, const std::string& name) {
  std::vector<std::string> names;
  for (const Verb& verb : verbs) names.push_back(verb.name);
  return absl::StrCat("unknown verb '", name, "'", cli::DidYouMean(name, names),
                      "; `loomctl help` lists the verbs");
}

std::string CheckArgumentCount(const Verb& verb, const std::vector<std::string>& args) {
  const int given = static_cast<int>(args.size()) - 1;
  if (given >= MinArgs(verb) && given <= MaxArgs(verb)) return "";
  if (MaxArgs(verb) == 0) {
    return absl::StrCat(verb.name, " takes no arguments (got '", args[1], "')");
  }
  if (given < MinArgs(verb)) return absl::StrCat(verb.name, " needs ", verb.arguments);
  return absl::StrCat(verb.name, " takes ", verb.arguments, ", not '",
                      absl::StrJoin(args.begin() + 1, args.end(), " "), "'");
}

std::string CheckFlags(const Verb& verb, const std::vector<std::string>& flags_set) {
  for (const std::string& flag : flags_set) {
    if (std::find(verb.flags.begin(), verb.flags.end(), flag) != verb.flags.end()) continue;
    if (std::find(GlobalFlags().begin(), GlobalFlags().end(), flag) != GlobalFlags().end()) continue;
    std::string takes = verb.flags.empty() ? "no flags of its own"
                                           : "--" + absl::StrJoin(verb.flags, ", --");
    return absl::StrCat("--", flag, " does not apply to ", verb.name, " (it takes ", takes, ")",
                        cli::DidYouMean(flag, verb.flags, "--"));
  }
  return "";
}

}  // namespace loom::client
