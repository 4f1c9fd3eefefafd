// LogReadQueue: the agent answers ReadRankLog on its own thread, never the
// caller's (the session's), and refuses at once when its queue is full.
#include "worker/agent/log_read_queue.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace loom::agent {
namespace {

TEST(LogReadQueueTest, ReadsOffTheCallersThreadAndRefusesWhenFull) {
  std::mutex mu;
  std::condition_variable cv;
  bool reading = false;
  bool release = false;
  std::vector<loom::v1::RankLogChunk> answers;
  std::vector<std::thread::id> reader_threads;
  LogReadQueue queue(
      [&](const loom::v1::ReadRankLog& request) {
        std::unique_lock lock(mu);
        reader_threads.push_back(std::this_thread::get_id());
        reading = true;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });  // a slow disk
        loom::v1::RankLogChunk chunk;
        chunk.set_data("rank " + std::to_string(request.rank()));
        return chunk;
      },
      [&](loom::v1::RankLogChunk chunk) {
        std::lock_guard lock(mu);
        answers.push_back(std::move(chunk));
        cv.notify_all();
      },
      /*capacity=*/2);
  auto request = [](int id) {
    loom::v1::ReadRankLog r;
    r.set_request_id(id);
    r.set_rank(id);
    return r;
  };
  queue.Submit(request(1));
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return reading; }));
  }
  // One read in progress (held), two waiting: the fourth is refused at once,
  // on this thread, while the reader is still busy.
  queue.Submit(request(2));
  queue.Submit(request(3));
  queue.Submit(request(4));
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].request_id(), 4);
    EXPECT_EQ(answers[0].error_code(), 8);  // RESOURCE_EXHAUSTED
    release = true;
    cv.notify_all();
  }
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return answers.size() == 4; }));
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(answers[i].request_id(), static_cast<int64_t>(i));
    EXPECT_EQ(answers[i].data(), "rank " + std::to_string(i));
    EXPECT_EQ(answers[i].error_code(), 0);
  }
  for (std::thread::id id : reader_threads) EXPECT_NE(id, std::this_thread::get_id());
}

}  // namespace
}  // namespace loom::agent
