// loomctl's verbs in one table (client/loomctl_main.cc): each verb's name,
// arguments, one-line summary, flags, example and function. `loomctl help`,
// `loomctl help VERB`, `loomctl VERB --help`, the argument-count check and the
// "unknown verb" suggestion are all generated from it, so adding a verb is
// one entry there (docs/client.md, "Adding a verb").
#pragma once

#include <string>
#include <vector>

namespace loom::client {

struct Verb {
  std::string name;       // "logs"
  std::string arguments;  // "ID", "JOB.yaml", "CHECKPOINT_DIR OUT_DIR", "" (none)
  std::string summary;    // one line: what it does
  std::vector<std::string> flags;  // its own flags (the global ones apply to all)
  std::string example;    // one command line
  int (*run)(const std::vector<std::string>& args);  // args[0] is the verb
  int min_args = -1;      // positional arguments after the verb; -1: as many as `arguments` names
  int max_args = -1;
};

// The flags every verb takes: where the coordinator is and who is calling.
const std::vector<std::string>& GlobalFlags();

// The verb named `name`, or nullptr.
const Verb* FindVerb(const std::vector<Verb>& verbs, const std::string& name);

// `loomctl help`: the verbs, aligned, then the global flags.
std::string RenderHelp(const std::vector<Verb>& verbs);

// `loomctl help VERB`: synopsis, summary, flags with defaults, example.
std::string RenderVerbHelp(const Verb& verb);

// "unknown verb 'X' (did you mean 'Y'?)".
std::string UnknownVerbMessage(const std::vector<Verb>& verbs, const std::string& name);

// "" when `args` (the verb first) has as many arguments as the verb takes,
// else what is wrong ("status needs ID").
std::string CheckArgumentCount(const Verb& verb, const std::vector<std::string>& args);

// "" when every flag given is the verb's or a global one, else which is not.
std::string CheckFlags(const Verb& verb, const std::vector<std::string>& flags_set);

}  // namespace loom::client
