#include "coordinator/service/log_relay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::coordinator {

LogRelay::LogRelay(Send send, Connected connected, LogRelayOptions options)
    : send_(std::move(send)),
      connected_(std::move(connected)),
      options_(options),
      thread_([this] { Loop(); }) {}

LogRelay::~LogRelay() {
  std::map<int64_t, Stream> left;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    left.swap(streams_);
  }
  cv_.notify_all();
  thread_.join();
  for (auto& [id, stream] : left) {
    stream.sink->Finish(absl::UnavailableError("the coordinator is stopping"));
  }
}

size_t LogRelay::streams() const {
  std::lock_guard lock(mu_);
  return streams_.size();
}

absl::StatusOr<int64_t> LogRelay::Open(LogStreamSpec spec, std::shared_ptr<LogSink> sink) {
  std::lock_guard lock(mu_);
  int64_t of_job = 0;
  for (const auto& [id, stream] : streams_) of_job += stream.spec.job_id == spec.job_id ? 1 : 0;
  if (of_job >= options_.max_streams_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", spec.job_id, " has ", of_job, " log streams open, the most it may have; close one "
        "(or wait for one to end) and try again"));
  }
  const int64_t id = next_stream_++;
  Stream& stream = streams_[id];
  stream.spec = std::move(spec);
  stream.sink = std::move(sink);
  stream.tokens = options_.lines_per_second;
  stream.refilled = Clock::now();
  for (const LogSource& source : stream.spec.ranks) {
    Cursor cursor;
    cursor.source = source;
    cursor.offset = stream.spec.tail_lines > 0 ? -1 : 0;
    stream.cursors.push_back(std::move(cursor));
  }
  cv_.notify_all();
  return id;
}

void LogRelay::Close(int64_t id) {
  std::lock_guard lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (it->second.request != 0) requests_.erase(it->second.request);
  streams_.erase(it);
}

void LogRelay::Deliver(const std::string& node_id, loom::v1::RankLogChunk chunk) {
  std::lock_guard lock(mu_);
  if (requests_.count(chunk.request_id()) == 0) return;  // its stream is gone
  if (chunks_.size() >= options_.max_queued_chunks) return;  // its stream times out
  chunks_.emplace_back(node_id, std::move(chunk));
  cv_.notify_all();
}

void LogRelay::Wake() { cv_.notify_all(); }

void LogRelay::Loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    while (!chunks_.empty()) {
      auto [node, chunk] = std::move(chunks_.front());
      chunks_.pop_front();
      Apply(node, chunk);
    }
    Clock::time_point due = Step(Clock::now());
    if (streams_.empty()) {
      // A sink call releases mu_: the stop or an Open may have come then.
      cv_.wait(lock, [this] { return stopping_ || !streams_.empty() || !chunks_.empty(); });
    } else {
      // Sinks wake the relay when a write completes; the bound covers a
      // wake-up that came before this wait.
      cv_.wait_until(lock, std::min(due, Clock::now() + std::chrono::milliseconds(50)));
    }
  }
}

void LogRelay::AddLines(Stream& stream, Cursor& cursor, const std::string& data, bool last) {
  std::string text = std::move(cursor.partial) + data;
  cursor.partial.clear();
  size_t start = 0;
  std::vector<std::string> lines;
  while (true) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) break;
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  cursor.partial = text.substr(start);
  if (last && !cursor.partial.empty()) {
    lines.push_back(std::move(cursor.partial));
    cursor.partial.clear();
  }
  if (cursor.first && stream.spec.tail_lines > 0 &&
      lines.size() > static_cast<size_t>(stream.spec.tail_lines)) {
    lines.erase(lines.begin(), lines.end() - stream.spec.tail_lines);
  }
  for (std::string& line : lines) stream.pending.emplace_back(cursor.source.rank, std::move(line));
}

void LogRelay::Apply(const std::string& node_id, const loom::v1::RankLogChunk& chunk) {
  auto request = requests_.find(chunk.request_id());
  if (request == requests_.end()) return;
  auto it = streams_.find(request->second);
  if (it == streams_.end() || it->second.request != chunk.request_id()) return;
  Stream& stream = it->second;
  Cursor& cursor = stream.cursors[stream.request_cursor];
  // Only the node that was asked may answer.
  if (cursor.source.nodes[cursor.node] != node_id) return;
  requests_.erase(request);
  stream.request = 0;
  const std::string attempt_rank =
      absl::StrCat("rank ", cursor.source.rank, " of attempt ", stream.spec.attempt);
  if (chunk.error_code() == static_cast<int>(absl::StatusCode::kNotFound) &&
      cursor.node + 1 < cursor.source.nodes.size()) {
    ++cursor.node;  // an earlier attempt: the next node that may hold it
    cursor.next_ask = Clock::now();
    return;
  }
  if (chunk.error_code() != 0) {
    const std::string where =
        cursor.source.nodes.size() == 1
            ? absl::StrCat("node ", node_id)
            : absl::StrCat("any of nodes ", absl::StrJoin(cursor.source.nodes, ", "));
    End(it, absl::Status(static_cast<absl::StatusCode>(chunk.error_code()),
                         absl::StrCat("the log of ", attempt_rank, " of job ", stream.spec.job_id,
                                      " could not be read on ", where, ": ", chunk.error())));
    return;
  }
  std::string data = chunk.data();
  if (cursor.first && chunk.offset() > 0) {
    // A tail's window starts mid-line unless the file had no more.
    size_t newline = data.find('\n');
    data = newline == std::string::npos ? std::string() : data.substr(newline + 1);
  }
  cursor.offset = chunk.offset() + static_cast<int64_t>(chunk.data().size());
  const bool caught_up = cursor.offset >= chunk.file_size();
  const bool ended = caught_up && (!stream.spec.follow || !chunk.running());
  AddLines(stream, cursor, data, ended);
  cursor.first = false;
  if (ended) {
    cursor.done = true;
  } else {
    cursor.next_ask = Clock::now() + (caught_up ? options_.follow_poll : Clock::duration::zero());
  }
}

void LogRelay::End(std::map<int64_t, Stream>::iterator it, const absl::Status& status) {
  if (it->second.request != 0) requests_.erase(it->second.request);
  // Finished from the relay's thread once mu_ is released (Step's caller).
  std::shared_ptr<LogSink> sink = std::move(it->second.sink);
  streams_.erase(it);
  mu_.unlock();
  sink->Finish(status);
  mu_.lock();
}

LogRelay::Clock::time_point LogRelay::Step(Clock::time_point now) {
  Clock::time_point due = now + std::chrono::seconds(1);
  // By id: the lock is released around each sink call, and Open or Close
  // may change the map meanwhile.
  std::vector<int64_t> ids;
  for (const auto& [id, stream] : streams_) ids.push_back(id);
  for (const int64_t id : ids) {
    auto current = streams_.find(id);
    if (current == streams_.end()) continue;
    Stream& stream = current->second;
    if (stream.request != 0 && now > stream.request_deadline) {
      const Cursor& cursor = stream.cursors[stream.request_cursor];
      End(current, absl::UnavailableError(absl::StrCat(
                       "node ", cursor.source.nodes[cursor.node], " did not answer for the log of "
                       "rank ", cursor.source.rank, " within ",
                       options_.node_answer_timeout.count() / 1000, " s")));
      continue;
    }
    // Lines to the caller, as fast as the rate allows and it reads.
    if (!stream.pending.empty()) {
      const double elapsed = std::chrono::duration<double>(now - stream.refilled).count();
      stream.tokens = std::min(options_.lines_per_second,
                               stream.tokens + elapsed * options_.lines_per_second);
      stream.refilled = now;
      std::shared_ptr<LogSink> sink = stream.sink;
      size_t n = std::min({stream.pending.size(), options_.max_lines_per_message,
                           static_cast<size_t>(stream.tokens)});
      if (n > 0) {
        mu_.unlock();
        const bool writable = sink->Writable();
        mu_.lock();
        auto again = streams_.find(id);
        if (again == streams_.end()) continue;  // closed meanwhile
        Stream& s = again->second;
        if (writable) {
          loom::v1::StreamLogsResponse response;
          int64_t bytes = 0;
          response.set_rank(s.pending.front().first);
          while (n-- > 0 && !s.pending.empty() && bytes < options_.chunk_bytes) {
            auto& [rank, line] = s.pending.front();
            bytes += static_cast<int64_t>(line.size());
            response.add_lines(s.spec.prefix_rank ? absl::StrCat("[rank ", rank, "] ", line)
                                                  : std::move(line));
            s.pending.pop_front();
            s.tokens -= 1;
          }
          mu_.unlock();
          sink->Write(std::move(response));
          mu_.lock();
          if (streams_.count(id) == 0) continue;
        }
      } else {
        due = std::min(due, now + std::chrono::milliseconds(
                                      static_cast<int64_t>(1000 / options_.lines_per_second) + 1));
      }
    }
    auto found = streams_.find(id);
    if (found == streams_.end()) continue;
    Stream& s = found->second;
    // Done: every rank read to its end and every line written.
    bool all_done = std::all_of(s.cursors.begin(), s.cursors.end(),
                                [](const Cursor& c) { return c.done; });
    if (all_done && s.pending.empty() && s.request == 0) {
      std::shared_ptr<LogSink> sink = s.sink;
      mu_.unlock();
      const bool writable = sink->Writable();  // the last lines are written
      mu_.lock();
      found = streams_.find(id);
      if (found != streams_.end() && writable) End(found, absl::OkStatus());
      continue;
    }
    // The next request: round robin over the ranks that are due.
    if (s.request != 0 || s.pending.size() >= options_.max_pending_lines) continue;
    for (size_t k = 0; k < s.cursors.size(); ++k) {
      size_t index = (s.next_cursor + k) % s.cursors.size();
      Cursor& cursor = s.cursors[index];
      if (cursor.done) continue;
      if (cursor.next_ask > now) {
        due = std::min(due, cursor.next_ask);
        continue;
      }
      const std::string& node = cursor.source.nodes[cursor.node];
      const std::string attempt_rank =
          absl::StrCat("rank ", cursor.source.rank, " of attempt ", s.spec.attempt);
      loom::v1::CoordinatorMessage message;
      loom::v1::ReadRankLog* read = message.mutable_read_log();
      read->set_request_id(next_request_++);
      read->set_job_id(s.spec.job_id);
      read->set_attempt(s.spec.attempt);
      read->set_rank(cursor.source.rank);
      read->set_offset(cursor.offset);
      read->set_max_bytes(options_.chunk_bytes);
      if (!connected_(node) || !send_(node, message)) {
        if (cursor.node + 1 < cursor.source.nodes.size()) {
          ++cursor.node;  // an earlier attempt: try the next candidate
          due = now;
          break;
        }
        End(found, absl::UnavailableError(absl::StrCat(
                       attempt_rank, " of job ", s.spec.job_id, " ran on node ", node,
                       ", which is offline; its log can be read when the node is back")));
        break;
      }
      s.request = read->request_id();
      s.request_cursor = index;
      s.request_deadline = now + options_.node_answer_timeout;
      s.next_cursor = index + 1;
      requests_[s.request] = id;
      due = std::min(due, s.request_deadline);
      break;
    }
  }
  return due;
}

}  // namespace loom::coordinator
