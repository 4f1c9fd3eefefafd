#include "common/topology/node_labels.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace loom::topology {
namespace {

bool ValueChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.'; }

bool ValidKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxLabelBytes || !absl::ascii_islower(key[0])) return false;
  for (char c : key) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_' || c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}

bool ValidValue(absl::string_view value) {
  if (value.empty() || value.size() > kMaxLabelBytes) return false;
  for (char c : value) {
    if (!ValueChar(c)) return false;
  }
  return true;
}

constexpr char kKeyRule[] =
    "a label key is 1-63 characters of lowercase letters, digits, '_', '-' and '.', starting "
    "with a letter";
constexpr char kValueRule[] =
    "a label value is 1-63 characters of letters, digits, '_', '-' and '.'";

absl::Status TooMany(absl::string_view what, size_t count) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " has ", count, " labels; at most ", kMaxNodeLabels, " are accepted"));
}

}  // namespace

absl::StatusOr<NodeLabels> ParseNodeLabels(absl::string_view text, absl::string_view what) {
  NodeLabels labels;
  if (text.empty()) return labels;
  std::vector<absl::string_view> items = absl::StrSplit(text, ',');
  if (items.size() > static_cast<size_t>(kMaxNodeLabels)) return TooMany(what, items.size());
  for (absl::string_view item : items) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", item, "' must be KEY=VALUE (labels are comma-separated)"));
    }
    const absl::string_view key = item.substr(0, eq);
    const absl::string_view value = item.substr(eq + 1);
    if (!ValidKey(key)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": key '", key, "': ", kKeyRule));
    }
    if (!ValidValue(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", key, "='", value, "': ", kValueRule));
    }
    if (!labels.emplace(key, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": key '", key, "' is given twice; a key may appear once"));
    }
  }
  return labels;
}

absl::Status CheckNodeLabels(const NodeLabels& labels, absl::string_view what) {
  if (labels.size() > static_cast<size_t>(kMaxNodeLabels)) return TooMany(what, labels.size());
  for (const auto& [key, value] : labels) {
    if (!ValidKey(key)) return absl::InvalidArgumentError(absl::StrCat(what, ": ", kKeyRule));
    if (!ValidValue(value)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " (key ", key, "): ", kValueRule));
    }
  }
  return absl::OkStatus();
}

std::string FormatNodeLabels(const NodeLabels& labels) {
  return absl::StrJoin(labels, ",", absl::PairFormatter("="));
}

}  // namespace loom::topology
