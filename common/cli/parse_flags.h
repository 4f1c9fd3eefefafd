// Strict command-line parsing shared by every Loom program: an unknown flag or
// a bad value prints one usage line naming it and exits with status 2 (the
// convention for usage errors); --help prints the usage and exits 0.
#pragma once

#include <string>
#include <vector>

namespace loom::cli {

// Sets the Abseil flags given as --name=value, --name value (non-boolean) or
// --name / --noname (boolean); returns the positional arguments in order.
std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const std::string& usage);

// Prints "<program>: <message>; usage: ..." on one line, then exits 2.
[[noreturn]] void UsageError(const std::string& message);

}  // namespace loom::cli
