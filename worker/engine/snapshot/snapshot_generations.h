// A rank's complete snapshots of one owner (its own state, or the copies of
// its ward's), a fixed number of generations, thread-safe. A new snapshot is
// written into the oldest generation's buffer (taken out of the complete ones
// while it is written) or a new one, and counts only once it is committed: a
// failure while capturing or copying leaves the newest complete generation
// where it was, so a rank never ends up without one.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "worker/engine/snapshot/snapshot.h"

namespace loom::engine {

class SnapshotGenerations {
 public:
  // Keeps at most `generations` (at least 1) complete snapshots.
  explicit SnapshotGenerations(size_t generations = 2);

  // The buffer to write the next snapshot into: the oldest complete one's
  // when all generations are complete and nobody else holds it (it is no
  // longer complete from now), else a new one.
  std::shared_ptr<Snapshot> BeginWrite();
  // A written snapshot (Reset, or received and adopted) becomes the newest
  // complete generation; the oldest beyond the limit is dropped. One of the
  // same step replaces it.
  void Commit(std::shared_ptr<Snapshot> written);

  // Complete generations' steps, oldest first.
  std::vector<int64_t> Steps() const;
  // The complete snapshot of `step`, or null.
  std::shared_ptr<const Snapshot> Find(int64_t step) const;
  // The same, to complete it in place (Snapshot::FillBorrowed).
  std::shared_ptr<Snapshot> FindWritable(int64_t step);
  // Bytes of the newest complete snapshot (0: none).
  int64_t newest_bytes() const;
  // Forgets the complete snapshots after `step` (a rollback to it).
  void DropAfter(int64_t step);
  void Clear();

 private:
  const size_t generations_;
  mutable std::mutex mu_;
  std::deque<std::shared_ptr<Snapshot>> complete_;  // oldest first
};

}  // namespace loom::engine
