// LogRelay (coordinator/service/log_relay.h) and LogStreamSpecFor
// (logs_stream.h): a test thread plays the agents, answering the ReadRankLog
// requests the relay sends, and a recording sink plays the caller.
#include "coordinator/service/log_relay.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "coordinator/service/logs_stream.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using std::chrono::milliseconds;

// The agents' side: requests as the relay sent them.
class FakeNodes {
 public:
  bool Send(const std::string& node, const loom::v1::CoordinatorMessage& message) {
    std::lock_guard lock(mu_);
    requests_.emplace_back(node, message.read_log());
    cv_.notify_all();
    return true;
  }
  std::optional<std::pair<std::string, loom::v1::ReadRankLog>> Next(milliseconds wait = milliseconds(5000)) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !requests_.empty(); })) return std::nullopt;
    auto next = requests_.front();
    requests_.erase(requests_.begin());
    return next;
  }
  std::set<std::string> offline;
  bool Connected(const std::string& node) {
    std::lock_guard lock(mu_);
    return offline.count(node) == 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, loom::v1::ReadRankLog>> requests_;
};

class RecordingSink : public LogSink {
 public:
  bool Writable() override { return true; }
  void Write(loom::v1::StreamLogsResponse response) override {
    std::lock_guard lock(mu_);
    for (const std::string& line : response.lines()) lines_.push_back(line);
  }
  void Finish(const absl::Status& status) override {
    std::lock_guard lock(mu_);
    EXPECT_FALSE(status_.has_value()) << "finished twice";
    status_ = status;
    cv_.notify_all();
  }
  std::optional<absl::Status> Wait(milliseconds wait = milliseconds(5000)) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [&] { return status_.has_value(); });
    return status_;
  }
  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  std::optional<absl::Status> status_;
};

loom::v1::RankLogChunk Chunk(const loom::v1::ReadRankLog& request, const std::string& file,
                             bool running) {
  loom::v1::RankLogChunk chunk;
  chunk.set_request_id(request.request_id());
  int64_t offset = request.offset() < 0
                       ? std::max<int64_t>(0, static_cast<int64_t>(file.size()) - request.max_bytes())
                       : std::min<int64_t>(request.offset(), file.size());
  chunk.set_offset(offset);
  chunk.set_data(file.substr(offset, request.max_bytes()));
  chunk.set_file_size(static_cast<int64_t>(file.size()));
  chunk.set_running(running);
  return chunk;
}

LogStreamSpec OneRank(int rank, const std::string& node, bool follow = false) {
  LogStreamSpec spec;
  spec.job_id = "j-1";
  spec.attempt = 1;
  spec.ranks.push_back({rank, {node}});
  spec.follow = follow;
  return spec;
}

// Answers the relay's requests with `answer` until the sink finishes. The
// relay finishes a stream on its own thread some time after the last answer,
// so each wait is for "a request or the end", never for a request alone.
// Returns false when neither came within 5 s.
template <typename Answer>
bool AnswerUntilFinished(FakeNodes& nodes, RecordingSink& sink, Answer answer) {
  auto quiet_since = std::chrono::steady_clock::now();
  while (!sink.Wait(milliseconds(0)).has_value()) {
    auto request = nodes.Next(milliseconds(20));
    if (!request.has_value()) {
      if (std::chrono::steady_clock::now() - quiet_since > milliseconds(5000)) return false;
      continue;
    }
    answer(*request);
    quiet_since = std::chrono::steady_clock::now();
  }
  return true;
}

class LogRelayTest : public ::testing::Test {
 protected:
  explicit LogRelayTest(LogRelayOptions options = Fast()) {
    relay_ = std::make_unique<LogRelay>(
        [this](const std::string& node, const loom::v1::CoordinatorMessage& m) {
          return nodes_.Send(node, m);
        },
        [this](const std::string& node) { return nodes_.Connected(node); }, options);
  }
  static LogRelayOptions Fast() {
    LogRelayOptions options;
    options.follow_poll = milliseconds(10);
    options.node_answer_timeout = milliseconds(500);
    options.max_streams_per_job = 2;
    options.chunk_bytes = 8;  // several requests per log
    return options;
  }
  FakeNodes nodes_;
  std::unique_ptr<LogRelay> relay_;
};

TEST_F(LogRelayTest, ReadsAWholeLogInBoundedChunks) {
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(OneRank(1, "n1"), sink).ok());
  const std::string file = "step 1 loss 5.0\nstep 2 loss 4.0\nno newline";
  int requests = 0;
  ASSERT_TRUE(AnswerUntilFinished(nodes_, *sink, [&](const auto& request) {
    EXPECT_EQ(request.first, "n1");
    EXPECT_EQ(request.second.rank(), 1);
    EXPECT_LE(request.second.max_bytes(), 8);
    ++requests;
    relay_->Deliver("n1", Chunk(request.second, file, /*running=*/true));
  }));
  EXPECT_TRUE(sink->Wait()->ok()) << *sink->Wait();
  EXPECT_GE(requests, 5);
  EXPECT_EQ(sink->lines(),
            (std::vector<std::string>{"step 1 loss 5.0", "step 2 loss 4.0", "no newline"}));
}

TEST_F(LogRelayTest, FollowsUntilTheRankEnds) {
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(OneRank(0, "n1", /*follow=*/true), sink).ok());
  std::string file = "a\n";
  int polls = 0;
  ASSERT_TRUE(AnswerUntilFinished(nodes_, *sink, [&](const auto& request) {
    ++polls;
    if (polls == 5) file += "b\n";
    const bool running = polls < 8;
    relay_->Deliver("n1", Chunk(request.second, file, running));
  }));
  EXPECT_TRUE(sink->Wait()->ok());
  EXPECT_EQ(sink->lines(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(polls, 8);  // kept asking while the rank ran, stopped when it ended
}

TEST_F(LogRelayTest, PrefixesEveryRankAndTailsEach) {
  LogStreamSpec spec;
  spec.job_id = "j-1";
  spec.attempt = 2;
  spec.ranks = {{0, {"n1"}}, {1, {"n2"}}};
  spec.prefix_rank = true;
  spec.tail_lines = 1;
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(spec, sink).ok());
  const std::map<std::string, std::string> files = {{"n1", "zero-a\nzero-b\n"}, {"n2", "one\n"}};
  ASSERT_TRUE(AnswerUntilFinished(nodes_, *sink, [&](const auto& request) {
    EXPECT_EQ(request.second.attempt(), 2);
    relay_->Deliver(request.first, Chunk(request.second, files.at(request.first), false));
  }));
  EXPECT_TRUE(sink->Wait()->ok());
  std::vector<std::string> lines = sink->lines();
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank 0] zero-b", "[rank 1] one"}));
}

TEST_F(LogRelayTest, NamesTheOfflineNode) {
  nodes_.offline.insert("n7");
  LogStreamSpec spec = OneRank(3, "n7");
  spec.attempt = 2;
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(spec, sink).ok());
  std::optional<absl::Status> status = sink->Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status->message().find("rank 3 of attempt 2 of job j-1 ran on node n7, which is offline"),
            std::string::npos)
      << *status;
}

TEST_F(LogRelayTest, IgnoresAnswersFromNodesNotAskedAndTimesOut) {
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(OneRank(0, "n1"), sink).ok());
  auto request = nodes_.Next();
  ASSERT_TRUE(request.has_value());
  relay_->Deliver("n2", Chunk(request->second, "forged\n", false));
  std::optional<absl::Status> status = sink->Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kUnavailable) << *status;
  EXPECT_NE(status->message().find("node n1 did not answer"), std::string::npos) << *status;
  EXPECT_TRUE(sink->lines().empty());
}

TEST_F(LogRelayTest, AnAgentErrorReachesTheCaller) {
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(OneRank(0, "n1"), sink).ok());
  auto request = nodes_.Next();
  ASSERT_TRUE(request.has_value());
  loom::v1::RankLogChunk refused;
  refused.set_request_id(request->second.request_id());
  refused.set_error_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  refused.set_error("log.txt is a symbolic link; it is not followed");
  relay_->Deliver("n1", refused);
  std::optional<absl::Status> status = sink->Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status->message().find("on node n1: log.txt is a symbolic link"), std::string::npos)
      << *status;
}

TEST_F(LogRelayTest, BoundsStreamsPerJob) {
  auto a = std::make_shared<RecordingSink>();
  auto b = std::make_shared<RecordingSink>();
  auto c = std::make_shared<RecordingSink>();
  ASSERT_TRUE(relay_->Open(OneRank(0, "n1", true), a).ok());
  absl::StatusOr<int64_t> second = relay_->Open(OneRank(1, "n1", true), b);
  ASSERT_TRUE(second.ok());
  absl::StatusOr<int64_t> third = relay_->Open(OneRank(1, "n1", true), c);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  relay_->Close(*second);  // the caller went away: room for another
  EXPECT_TRUE(relay_->Open(OneRank(1, "n1", true), c).ok());
  EXPECT_EQ(relay_->streams(), 2u);
}

TEST(LogStreamSpecTest, NamesWhatIsMissing) {
  loom::v1::Job job;
  job.set_id("j-1");
  loom::v1::StreamLogsRequest request;
  request.set_id("j-1");
  EXPECT_EQ(LogStreamSpecFor(job, request, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // not placed yet
  job.set_attempt(2);
  for (int rank = 0; rank < 2; ++rank) {
    auto* p = job.add_placement();
    p->set_rank(rank);
    p->set_node_id(rank == 0 ? "n1" : "n2");
  }
  request.set_rank(5);
  absl::StatusOr<LogStreamSpec> spec = LogStreamSpecFor(job, request, {});
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find("has ranks 0 to 1; there is no rank 5"), std::string::npos);
  request.set_rank(1);
  request.set_attempt(3);
  EXPECT_EQ(LogStreamSpecFor(job, request, {}).status().code(), absl::StatusCode::kNotFound);
  // The current attempt: the node the rank was placed on, only.
  request.set_attempt(0);
  spec = LogStreamSpecFor(job, request, {"n3"});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->attempt, 2);
  ASSERT_EQ(spec->ranks.size(), 1u);
  EXPECT_EQ(spec->ranks[0].nodes, (std::vector<std::string>{"n2"}));
  // An earlier attempt: its own node first, then the others that may hold it.
  request.set_attempt(1);
  spec = LogStreamSpecFor(job, request, {"n1", "n3"});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->ranks[0].nodes, (std::vector<std::string>{"n2", "n1", "n3"}));
  request.set_all_ranks(true);
  request.set_attempt(0);
  spec = LogStreamSpecFor(job, request, {});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->ranks.size(), 2u);
  EXPECT_TRUE(spec->prefix_rank);
}

}  // namespace
}  // namespace loom::coordinator
