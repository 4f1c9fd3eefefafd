// `loomctl logs` at the coordinator: turns one StreamLogs call into
// ReadRankLog requests to the nodes that hold the ranks' logs (on their agent
// sessions) and their RankLogChunk answers into whole lines for the caller.
//
// Everything happens on the relay's own thread: a node session's reaction
// only queues the chunk it received (Deliver), the handler only opens a
// stream (Open). Bounded everywhere: one request in flight per stream of at
// most chunk_bytes, at most max_pending_lines lines waiting per stream (no
// new request until the caller has read them), lines_per_second per stream,
// max_streams_per_job streams per job, and a node that does not answer in
// node_answer_timeout ends the stream with UNAVAILABLE.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::coordinator {

struct LogRelayOptions {
  int64_t max_streams_per_job = 8;
  int64_t chunk_bytes = 64 * 1024;
  double lines_per_second = 5000;  // per stream; the burst is one second's worth
  size_t max_pending_lines = 4096;  // per stream
  size_t max_lines_per_message = 512;
  std::chrono::milliseconds follow_poll{300};  // a caught-up running rank is asked again after this
  std::chrono::milliseconds node_answer_timeout{10000};
  size_t max_queued_chunks = 1024;  // answers waiting for the relay's thread
};

// The caller's side of one stream (the gRPC reactor; a fake in tests). Called
// from the relay's thread; Writable and Write must not block, and the sink
// calls LogRelay::Wake (without holding its own lock) when a write completes.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual bool Writable() = 0;  // no write in flight
  virtual void Write(loom::v1::StreamLogsResponse response) = 0;
  virtual void Finish(const absl::Status& status) = 0;  // once, last
};

// One rank of a stream and the nodes that may hold its log, asked in order
// until one has it (one for the current attempt: where the rank was placed).
struct LogSource {
  int rank = 0;
  std::vector<std::string> nodes;
};

struct LogStreamSpec {
  std::string job_id;
  int attempt = 1;
  std::vector<LogSource> ranks;
  bool prefix_rank = false;  // "[rank N] " before each line (--all)
  bool follow = false;
  int tail_lines = 0;  // 0: from the beginning
};

class LogRelay {
 public:
  using Send = std::function<bool(const std::string& node_id, const loom::v1::CoordinatorMessage&)>;
  using Connected = std::function<bool(const std::string& node_id)>;

  LogRelay(Send send, Connected connected, LogRelayOptions options = {});
  ~LogRelay();  // finishes every open stream with UNAVAILABLE

  // Starts a stream; RESOURCE_EXHAUSTED when its job has max_streams_per_job.
  // The sink is finished exactly once, from the relay's thread (or here).
  absl::StatusOr<int64_t> Open(LogStreamSpec spec, std::shared_ptr<LogSink> sink);
  // The caller went away: the stream ends without finishing its sink.
  void Close(int64_t stream);
  // An answer from node `node_id`'s session; never blocks (queued).
  void Deliver(const std::string& node_id, loom::v1::RankLogChunk chunk);
  // A sink finished a write.
  void Wake();

  size_t streams() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Cursor {
    LogSource source;
    size_t node = 0;  // index into source.nodes being asked
    int64_t offset = 0;  // next byte; negative before a tail's first read
    std::string partial;  // bytes after the last newline seen
    bool done = false;
    bool first = true;
    Clock::time_point next_ask;
  };
  struct Stream {
    LogStreamSpec spec;
    std::shared_ptr<LogSink> sink;
    std::vector<Cursor> cursors;
    size_t next_cursor = 0;
    std::deque<std::pair<int, std::string>> pending;  // (rank, line)
    int64_t request = 0;  // in flight; 0: none
    size_t request_cursor = 0;
    Clock::time_point request_deadline;
    double tokens = 0;
    Clock::time_point refilled;
  };

  void Loop();
  // One pass over the streams; returns when the next one is due.
  Clock::time_point Step(Clock::time_point now);
  void Apply(const std::string& node_id, const loom::v1::RankLogChunk& chunk);
  // Ends a stream (sink finished with `status`) and forgets it.
  void End(std::map<int64_t, Stream>::iterator it, const absl::Status& status);
  void AddLines(Stream& stream, Cursor& cursor, const std::string& data, bool last);

  const Send send_;
  const Connected connected_;
  const LogRelayOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Stream> streams_;
  std::map<int64_t, int64_t> requests_;  // request id -> stream id
  std::deque<std::pair<std::string, loom::v1::RankLogChunk>> chunks_;
  int64_t next_stream_ = 1;
  int64_t next_request_ = 1;
  bool stopping_ = false;
  std::thread thread_;  // last
};

}  // namespace loom::coordinator
