// Checks that the TCP transport can bind where it is told to, before Gloo
// tries: Gloo 0.5 crashes (instead of throwing) on a hostname that does not
// resolve or bind. Internal to the Gloo communicator.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace loom::comm {

// OK when `interface` (if set) exists with an IP address, or else when
// `hostname` resolves to an address this machine can bind.
absl::Status CheckTcpBindTarget(const std::string& hostname, const std::string& interface);

}  // namespace loom::comm
