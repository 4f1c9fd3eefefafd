#include "common/rpc/coordinator_channel.h"

#include <algorithm>

#include "absl/strings/str_split.h"
#include "common/rpc/rpc_settings.h"
#include "grpcpp/generic/generic_stub.h"

namespace loom::rpc {
namespace {

// grpc.health.v1.Health/Check for the whole server (an empty request); the
// answer's field 1 is the status, 1 = SERVING.
bool Serving(grpc::Channel* channel, absl::Duration timeout) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  grpc::Slice empty;
  grpc::ByteBuffer(&empty, 1).Swap(&request);
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   absl::MutexLock lock(&mu);
                   status = std::move(s);
                   done = true;
                 });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  if (!status.ok()) return false;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes.size() >= 2 && bytes[0] == 0x08 && bytes[1] == 0x01;
}

}  // namespace

std::vector<std::string> SplitAddresses(const std::string& addresses) {
  return absl::StrSplit(addresses, ',', absl::SkipWhitespace());
}

CoordinatorChannel::CoordinatorChannel(const std::string& addresses,
                                       std::shared_ptr<grpc::ChannelCredentials> credentials)
    : addresses_(SplitAddresses(addresses)), credentials_(std::move(credentials)) {
  current_ = addresses_.empty() ? addresses : addresses_.front();
}

std::shared_ptr<grpc::Channel> CoordinatorChannel::ChannelLocked(const std::string& address) {
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) channel = MakeChannel(address, credentials_);
  return channel;
}

std::shared_ptr<grpc::Channel> CoordinatorChannel::channel() {
  absl::MutexLock lock(&mu_);
  return ChannelLocked(current_);
}

std::string CoordinatorChannel::address() {
  absl::MutexLock lock(&mu_);
  return current_;
}

void CoordinatorChannel::Failed(const grpc::Status& status, const grpc::ClientContext* context) {
  if (!several() || status.error_code() != grpc::StatusCode::UNAVAILABLE) return;
  absl::MutexLock lock(&mu_);
  if (context != nullptr) {
    const auto& trailers = context->GetServerTrailingMetadata();
    auto it = trailers.find(kLeaderMetadataKey);
    if (it != trailers.end()) {
      const std::string leader(it->second.data(), it->second.size());
      // Only an address this client was given: a standby does not get to
      // send a client anywhere else.
      if (leader != current_ &&
          std::find(addresses_.begin(), addresses_.end(), leader) != addresses_.end()) {
        current_ = leader;
        return;
      }
    }
  }
  auto it = std::find(addresses_.begin(), addresses_.end(), current_);
  const size_t index = it == addresses_.end() ? 0 : (it - addresses_.begin() + 1) % addresses_.size();
  current_ = addresses_[index];
}

bool CoordinatorChannel::FindLeader(absl::Duration per_address) {
  if (!several()) return true;
  std::vector<std::string> order;
  {
    absl::MutexLock lock(&mu_);
    order.push_back(current_);
  }
  for (const std::string& a : addresses_) {
    if (a != order.front()) order.push_back(a);
  }
  for (const std::string& candidate : order) {
    std::shared_ptr<grpc::Channel> channel;
    {
      absl::MutexLock lock(&mu_);
      channel = ChannelLocked(candidate);
    }
    if (Serving(channel.get(), per_address)) {
      absl::MutexLock lock(&mu_);
      current_ = candidate;
      return true;
    }
  }
  return false;
}

}  // namespace loom::rpc
