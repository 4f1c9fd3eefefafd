// UDP sockets for the liveness path, from the addresses the programs already
// have: the coordinator binds the host of --listen (every address it
// resolves to) on the port its gRPC server got; an agent sends to the host
// of the coordinator address it is connected to.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::liveness {

// "host:port", "[v6]:port", "dns:///host:port", "ipv4:1.2.3.4:port" -> host
// (without brackets). INVALID_ARGUMENT naming `target` when there is no
// host and port.
absl::StatusOr<std::string> HostOf(const std::string& target);

// Non-blocking UDP sockets bound to port on every address host resolves to
// ("0.0.0.0" and "::" included). An error names the address and the reason.
absl::StatusOr<std::vector<int>> BindUdp(const std::string& host, int port);

// A non-blocking UDP socket connected to host:port (the first address that
// resolves): it sends there and receives only from there.
absl::StatusOr<int> ConnectUdp(const std::string& host, int port);

}  // namespace loom::liveness
