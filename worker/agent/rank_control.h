// The ranks' control streams (AgentService.Control, server streams of
// RankControl): what in-place recovery tells a rank (AbortRanks, then its own
// EnterEpoch) is queued here per launched rank and written, in order, on that
// rank's stream for as long as the rank runs, across its attempts.
//  - Messages wait for a rank whose stream is not open yet (or is being
//    replaced), at most kMaxPending per rank; beyond that the oldest is
//    dropped (a rank that never reads its stream cannot grow the agent).
//  - One stream per rank. A second one replaces the first, which ends with
//    ABORTED: only the rank holds its token, and it opens a new stream only
//    when its old one broke, perhaps before the agent noticed; refusing the
//    new one would cut the rank off until then. A message whose write failed
//    on the old stream goes again on the new one; one written whole on it
//    counts as delivered.
//  - When the rank ends (Close), its stream ends with OK and what waits is
//    dropped.
#pragma once

#include <cstdint>
#include <deque>
#include <map>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/rank_control_sink.h"

namespace loom::agent {

class RankControlHub final : public RankControlSink {
 public:
  static constexpr size_t kMaxPending = 32;

  // Destroy it after the server whose Control calls it serves has shut down
  // (their reactions call into it until they are done).
  RankControlHub() = default;
  ~RankControlHub() override = default;
  RankControlHub(const RankControlHub&) = delete;
  RankControlHub& operator=(const RankControlHub&) = delete;

  void Open(uint64_t launch_id) override;
  void Close(uint64_t launch_id) override;
  void Push(uint64_t launch_id, loom::v1::RankControl message) override;

  // The reactor for a Control call of rank `launch_id` (already
  // authenticated by its token). NOT_FOUND when that rank is not open.
  grpc::ServerWriteReactor<loom::v1::RankControl>* Attach(uint64_t launch_id);
  // A reactor that ends the call at once with `status` (a refused call).
  static grpc::ServerWriteReactor<loom::v1::RankControl>* Refuse(grpc::Status status);

  // For tests and logs: ranks open, streams attached, messages dropped.
  size_t open_ranks() const;
  size_t attached_streams() const;
  int64_t dropped() const;

  class Stream;

 private:
  struct Entry {
    std::deque<loom::v1::RankControl> pending;
    Stream* stream = nullptr;  // the attached stream, if any
    // The stream with a write in flight (perhaps a replaced one): nothing
    // else is written for the rank until it returns, so that a write that
    // failed goes again before anything after it.
    Stream* writer = nullptr;
  };

  // Starts the next write on the entry's stream if it is idle.
  void PumpLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called by a Stream's reactions.
  void WriteDone(uint64_t launch_id, Stream* stream, bool ok);
  void Cancelled(uint64_t launch_id, Stream* stream);
  void Done(uint64_t launch_id, Stream* stream);

  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> ranks_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom::agent
