// The rules of a node's registration (node_limits.h).
#include "coordinator/cluster/node_limits.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/topology/node_labels.h"

namespace loom::coordinator {
namespace {

bool IsIdChar(char c, bool first) {
  const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  return alnum || (!first && (c == '-' || c == '.'));
}

// Printable ASCII only: a newline or an escape in a log line forges others.
bool Printable(const std::string& text) {
  for (char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

bool ValidNodeId(const std::string& id) {
  if (id.empty() || id.size() > 63) return false;
  for (size_t i = 0; i < id.size(); ++i) {
    if (!IsIdChar(id[i], i == 0)) return false;
  }
  return true;
}

absl::Status CheckRegistration(const loom::v1::RegisterNode& r, const NodeLimits& limits) {
  if (!ValidNodeId(r.node_id())) {
    return absl::InvalidArgumentError(
        "register.node_id must be 1-63 characters of letters, digits, '.' and '-', starting "
        "with a letter or digit (loom-worker --node_id)");
  }
  for (const auto& [field, text] : {std::pair{"hostname", &r.hostname()},
                                    std::pair{"address", &r.address()}}) {
    if (text->size() > limits.max_text_bytes || !Printable(*text)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register.", field, " must be at most ", limits.max_text_bytes,
          " printable ASCII characters"));
    }
  }
  if (r.devices_size() > limits.max_device_entries) {
    return absl::InvalidArgumentError(absl::StrCat("register.devices lists ", r.devices_size(),
                                                   " entries; at most ",
                                                   limits.max_device_entries, " are accepted"));
  }
  int64_t total = 0;
  for (const loom::v1::Device& d : r.devices()) {
    if (d.kind() != "cpu" && d.kind() != "gpu") {
      return absl::InvalidArgumentError("register.devices.kind must be cpu or gpu");
    }
    if (d.count() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("register.devices.count=", d.count(), " must not be negative"));
    }
    total += d.count();
    if (d.name().size() > limits.max_text_bytes || !Printable(d.name())) {
      return absl::InvalidArgumentError(absl::StrCat("register.devices.name must be at most ",
                                                     limits.max_text_bytes,
                                                     " printable ASCII characters"));
    }
    if (!std::isfinite(d.peak_flops()) || d.peak_flops() < 0 || d.memory_bytes() < 0) {
      return absl::InvalidArgumentError(
          "register.devices.peak_flops and memory_bytes must be finite and not negative");
    }
  }
  if (total > limits.max_devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register.devices claims ", total, " devices; a node may have at most ",
        limits.max_devices, " (coordinator flag --max_node_devices)"));
  }
  // Bounded before copying: the map came from the network.
  if (r.labels_size() > topology::kMaxNodeLabels) {
    return absl::InvalidArgumentError(absl::StrCat("register.labels has ", r.labels_size(),
                                                   " labels; at most ", topology::kMaxNodeLabels,
                                                   " are accepted (loom-worker --labels)"));
  }
  if (absl::Status s = topology::CheckNodeLabels({r.labels().begin(), r.labels().end()},
                                                 "register.labels (loom-worker --labels)");
      !s.ok()) {
    return s;
  }
  if (r.running_size() > limits.max_running) {
    return absl::InvalidArgumentError(absl::StrCat("register.running lists ", r.running_size(),
                                                   " ranks; at most ", limits.max_running,
                                                   " are accepted"));
  }
  return absl::OkStatus();
}

absl::Status CheckProgressBatch(const loom::v1::RankProgressBatch& batch,
                                const NodeLimits& limits) {
  if (batch.reports_size() <= limits.max_progress_batch) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("progress.reports holds ", batch.reports_size(),
                                                 " reports; at most ", limits.max_progress_batch,
                                                 " are accepted in one message"));
}

}  // namespace loom::coordinator
