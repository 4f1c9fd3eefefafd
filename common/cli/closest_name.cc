#include "common/cli/closest_name.h"

#include <algorithm>

namespace loom::cli {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string ClosestName(const std::string& typed, const std::vector<std::string>& candidates) {
  if (typed.empty()) return "";
  std::string best;
  size_t best_distance = static_cast<size_t>(-1);
  for (const std::string& candidate : candidates) {
    size_t distance = EditDistance(typed, candidate);
    size_t longer = std::max(typed.size(), candidate.size());
    size_t allowed = std::max<size_t>(1, (longer + 2) / 3);
    bool prefix = typed.size() >= 3 && candidate.rfind(typed, 0) == 0;
    if (distance > allowed && !prefix) continue;
    if (prefix) distance = std::min(distance, allowed);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string DidYouMean(const std::string& typed, const std::vector<std::string>& candidates,
                       const std::string& prefix) {
  std::string closest = ClosestName(typed, candidates);
  if (closest.empty()) return "";
  return " (did you mean '" + prefix + closest + "'?)";
}

}  // namespace loom::cli
