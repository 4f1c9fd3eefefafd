// Strict command-line parsing shared by every Loom program: an unknown flag or
// a bad value prints one usage line naming it and exits with status 2 (the
// convention for usage errors, with the closest flag when one is near);
// --help prints the usage and every flag the program accepts (flag_help.h)
// and exits 0.
#pragma once

#include <string>
#include <vector>

namespace loom::cli {

struct CommandLine {
  std::vector<std::string> positional;  // in order
  std::vector<std::string> flags_set;   // the names of the flags given, in order
  bool help = false;                    // --help or -h was given (parsing stopped there)
};

// Sets the Abseil flags given as --name=value, --name value (non-boolean) or
// --name / --noname (boolean). A bad flag is a UsageError; --help is returned,
// for programs whose help depends on the other arguments (loomctl VERB --help).
CommandLine ParseCommandLine(int argc, char** argv, const std::string& usage);

// Sets the Abseil flags given as --name=value, --name value (non-boolean) or
// --name / --noname (boolean); returns the positional arguments in order.
std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const std::string& usage);

// Prints "<program>: <message>; usage: ..." on one line, then exits 2.
[[noreturn]] void UsageError(const std::string& message);

}  // namespace loom::cli
