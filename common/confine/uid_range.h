// Per-job uids (docs/security.md, "Under --run_as_user"): the range an
// operator sets aside for jobs (--job_uid_range on the coordinator,
// --run_as_uid_range on every agent), the uid a job gets from it, and the
// agent's check of a uid it is sent. Pure: no process or file is touched.
//
// The rule that keeps uids apart: a job's uid is FIRST + (its id's sequence
// number - 1). Sequence numbers are never reused by a store (deleted jobs are
// still counted, job_store.h), so no two jobs of one cluster ever get the
// same uid, live or ended, and a later job can never read an old job's
// checkpoints through its uid. When the sequence passes the range, the job is
// refused rather than given a uid twice. The gid is the same number.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace loom::confine {

struct UidRange {
  uid_t first = 0;
  uid_t last = 0;
  uint64_t size() const { return static_cast<uint64_t>(last) - first + 1; }
  bool Contains(uint64_t uid) const { return uid >= first && uid <= last; }
};

// "FIRST-LAST": decimal, 1 <= FIRST <= LAST <= 4294967294 (uid 0 is root,
// 4294967295 is (uid_t)-1). INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<UidRange> ParseUidRange(const std::string& text, const std::string& flag);

// FIRST-LAST, as the flag takes it.
std::string FormatUidRange(const UidRange& range);

// The uid of the job whose id has sequence number `sequence` (1, 2, ...):
// FIRST + sequence - 1. RESOURCE_EXHAUSTED when it would lie past LAST (the
// range is spent: widen LAST), INVALID_ARGUMENT for a sequence below 1.
absl::StatusOr<uid_t> JobUid(const UidRange& range, int64_t sequence);

// The agent's check of a uid an assignment names (`field`): inside this
// node's range, never 0. INVALID_ARGUMENT naming the field, the value and
// the range otherwise.
absl::Status CheckJobUid(const UidRange& range, uint64_t uid, const std::string& field);

}  // namespace loom::confine
