#include "worker/agent/log_read_queue.h"

#include <utility>

namespace loom::agent {

LogReadQueue::LogReadQueue(Reader reader, Reply reply, size_t capacity)
    : reader_(std::move(reader)),
      reply_(std::move(reply)),
      capacity_(capacity),
      thread_([this] { Loop(); }) {}

LogReadQueue::~LogReadQueue() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LogReadQueue::Submit(loom::v1::ReadRankLog request) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() < capacity_) {
      queue_.push_back(std::move(request));
      cv_.notify_one();
      return;
    }
  }
  loom::v1::RankLogChunk busy;
  busy.set_request_id(request.request_id());
  busy.set_error_code(8);  // RESOURCE_EXHAUSTED
  busy.set_error("this node is reading too many logs at once; try again");
  reply_(std::move(busy));
}

void LogReadQueue::Loop() {
  while (true) {
    loom::v1::ReadRankLog request;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    loom::v1::RankLogChunk chunk = reader_(request);
    chunk.set_request_id(request.request_id());
    reply_(std::move(chunk));
  }
}

}  // namespace loom::agent
