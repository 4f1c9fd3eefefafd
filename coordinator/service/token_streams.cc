#include "coordinator/service/token_streams.h"

#include <utility>
#include <vector>

namespace loom::coordinator {

int64_t TokenStreams::Add(const std::string& user, std::function<void()> end) {
  absl::MutexLock lock(&mu_);
  const int64_t handle = next_++;
  streams_.emplace(handle, Stream{user, std::move(end)});
  return handle;
}

void TokenStreams::Remove(int64_t handle) {
  absl::MutexLock lock(&mu_);
  streams_.erase(handle);
}

int TokenStreams::EndAll(const std::string& user) {
  std::vector<std::function<void()>> ends;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [handle, stream] : streams_) {
      if (stream.user == user) ends.push_back(stream.end);
    }
  }
  // Outside the lock: an end finishes a stream, whose OnDone calls Remove.
  for (const auto& end : ends) end();
  return static_cast<int>(ends.size());
}

}  // namespace loom::coordinator
