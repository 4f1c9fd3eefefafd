// What a node may claim when it registers. A registration is input from the
// network: its id ends up in log lines, metrics and every placement, and its
// device count sizes loops the scheduler runs. Bounds and their flags are in
// docs/limits.md.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/rpc/progress_batch.h"
#include "loom/v1/node.pb.h"

namespace loom::coordinator {

struct NodeLimits {
  int32_t max_devices = 1024;       // devices of one node, all kinds together
  int32_t max_device_entries = 16;  // entries in RegisterNode.devices
  int32_t max_running = 4096;       // ranks listed as still running
  size_t max_text_bytes = 255;      // hostname, address, device name
  // Reports in one NodeMessage.progress. A fixed bound, not one per device:
  // an agent forwards at most one report per rank per window, and also the
  // last report of ranks that just ended while their successors start; 1024
  // is 128 reports for each of 8 devices.
  int32_t max_progress_batch = rpc::kMaxProgressBatchReports;
};

// A node id is 1-63 characters: letters, digits, '.' and '-', starting with a
// letter or digit (a DNS label or hostname, which is what agents derive it from).
bool ValidNodeId(const std::string& node_id);

// OK, or INVALID_ARGUMENT naming the field and the rule (never echoing the
// offending bytes of a free-text field).
absl::Status CheckRegistration(const loom::v1::RegisterNode& registration,
                               const NodeLimits& limits = {});

// OK, or INVALID_ARGUMENT naming the rule, for a batch of progress reports
// that is larger than max_progress_batch.
absl::Status CheckProgressBatch(const loom::v1::RankProgressBatch& batch,
                                const NodeLimits& limits = {});

}  // namespace loom::coordinator
