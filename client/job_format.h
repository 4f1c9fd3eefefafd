// How loomctl shows jobs: the list table, the status page, the live progress
// line and the JSON-lines form of each step. Pure formatting.
#pragma once

#include <string>
#include <vector>

#include "loom/v1/job.pb.h"

namespace loom::client {

std::string StateName(loom::v1::JobState state);
std::string FormatJobTable(const std::vector<loom::v1::Job>& jobs);
std::string FormatJobStatus(const loom::v1::Job& job);
// "step 12/50  loss 3.1416  val 3.2000  12.3k tok/s  MFU 4.1%  ETA 0:42  (attempt 1)"
std::string FormatProgressLine(const loom::v1::JobProgress& progress);
// One JSON object (no newline) with step, loss, tokens, step_seconds,
// tokens_per_second, mfu, attempt, lr, grad_norm, and val_loss on eval steps.
std::string FormatProgressJson(const loom::v1::JobProgress& progress);
std::string FormatEvent(const loom::v1::JobEvent& event);
std::string FormatNodeTable(const std::vector<loom::v1::Node>& nodes);

}  // namespace loom::client
