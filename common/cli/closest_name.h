// "Did you mean": the known name nearest to a mistyped one, for the usage
// errors of every Loom program (an unknown flag, an unknown loomctl verb).
#pragma once

#include <string>
#include <vector>

namespace loom::cli {

// The candidate with the fewest single-character edits from `typed`, if that
// is at most a third of the longer name (rounded up, at least 1); a prefix of
// a candidate ("foll" for "follow") also matches. Ties go to the earliest
// candidate. "" when nothing is close.
std::string ClosestName(const std::string& typed, const std::vector<std::string>& candidates);

// " (did you mean 'X'?)" or "".
std::string DidYouMean(const std::string& typed, const std::vector<std::string>& candidates,
                       const std::string& prefix = "");

}  // namespace loom::cli
