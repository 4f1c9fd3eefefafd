// Where the agent reads rank logs for the coordinator (ReadRankLog): on one
// thread of its own with a bounded queue, so a slow disk or a burst of
// `loomctl logs` never holds up the session's thread (launches, kills,
// heartbeats). A request that finds the queue full is answered at once with
// RESOURCE_EXHAUSTED.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "loom/v1/node.pb.h"

namespace loom::agent {

class LogReadQueue {
 public:
  using Reader = std::function<loom::v1::RankLogChunk(const loom::v1::ReadRankLog&)>;
  using Reply = std::function<void(loom::v1::RankLogChunk)>;

  LogReadQueue(Reader reader, Reply reply, size_t capacity = 16);
  ~LogReadQueue();  // drops what waits, finishes the read in progress

  // Queues the request (never blocks); its answer goes to `reply` from the
  // queue's thread, or from here when the queue is full.
  void Submit(loom::v1::ReadRankLog request);

 private:
  void Loop();

  const Reader reader_;
  const Reply reply_;
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<loom::v1::ReadRankLog> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest exists
};

// The most bytes one RankLogChunk carries, whatever the request asks.
inline constexpr int64_t kMaxLogChunkBytes = 64 * 1024;

}  // namespace loom::agent
