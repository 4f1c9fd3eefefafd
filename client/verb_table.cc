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

// `text` wrapped at `width` columns, continuation lines indented to `column`.
std::string Wrap(const std::string& text, size_t column, size_t width) {
  std::istringstream words(text);
  std::string word, out;
  size_t at = column;
  while (words >> word) {
    if (!out.empty() && at + 1 + word.size() > width) {
      out += "\n" + std::string(column, ' ');
      at = column;
    } else if (!out.empty()) {
      out += ' ';
      ++at;
    }
    out += word;
    at += word.size();
  }
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
    absl::StrAppend(&out, "  ", left, "  ", Wrap(verb.summary, 4 + left.size(), 100), "\n");
  }
  absl::StrAppend(&out, "\nglobal flags (TLS defaults to $LOOM_TLS_DIR, the token to $LOOM_TOKEN):\n",
                  FlagList(GlobalFlags(), 2),
                  "\n`loomctl help VERB` or `loomctl VERB --help` shows a verb's flags and an "
                  "example.\n");
  return out;
}

std::string RenderVerbHelp(const Verb& verb) {
  // "usage: loomctl VERB ARGS [--flag] [--flag=...]", wrapped under the verb.
  const std::string head = "usage: loomctl " + verb.name;
  std::string synopsis = head;
  size_t line_start = 0;
  auto add = [&](const std::string& piece) {
    if (synopsis.size() - line_start + 1 + piece.size() > 100) {
      synopsis += "\n";
      line_start = synopsis.size();
      synopsis += std::string(head.size(), ' ');
    }
    absl::StrAppend(&synopsis, " ", piece);
  };
  if (!verb.arguments.empty()) add(verb.arguments);
  for (const std::string& name : verb.flags) {
    std::vector<cli::FlagDoc> flag = cli::ProgramFlags({name});
    if (flag.empty()) continue;
    add(flag[0].is_bool ? "[--" + name + "]" : "[--" + name + "=...]");
  }
  std::string out = absl::StrCat(synopsis, "\n\n", verb.summary, "\n");
  if (!verb.flags.empty()) absl::StrAppend(&out, "\nflags:\n", FlagList(verb.flags, 2));
  absl::StrAppend(&out, "\nexample:\n  ", verb.example, "\n\n",
                  Wrap("global flags (`loomctl help`): --" + absl::StrJoin(GlobalFlags(), ", --"),
                       2, 100),
                  "\n");
  return out;
}

std::string UnknownVerbMessage(const std::vector<Verb>& verbs, const std::string& name) {
  std::vector<std::string> names;
  for (const Verb& verb : verbs) names.push_back(verb.name);
  return absl::StrCat("unknown verb '", name, "'", cli::DidYouMean(name, names));
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
