// gRPC settings that clients and the coordinator must agree on: keepalive on
// long-lived streams (node sessions, progress, watch) and deadlines for unary
// calls. Kept in one place so both sides change together.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace loom::rpc {

// A client pings an idle stream every 10 s and gives up after 5 s without an
// answer; the server must permit pings that often, or it would GOAWAY them.
inline constexpr int kKeepaliveTimeMs = 10'000;
inline constexpr int kKeepaliveTimeoutMs = 5'000;
inline constexpr int kMinPingIntervalMs = 5'000;
// Largest message either side accepts; bigger ones get RESOURCE_EXHAUSTED.
inline constexpr int kMaxMessageBytes = 16 * 1024 * 1024;
// Default deadline of a unary call.
inline constexpr std::chrono::seconds kUnaryDeadline{10};

void ApplyServerSettings(grpc::ServerBuilder& builder);
// A channel to address with credentials from common/rpc/tls.h.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials);
// A context whose deadline is now + timeout.
std::unique_ptr<grpc::ClientContext> UnaryContext(
    std::chrono::milliseconds timeout = kUnaryDeadline);

}  // namespace loom::rpc
