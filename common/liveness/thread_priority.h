// The liveness threads' priority: above everything else of their process,
// where the system lets them. A thread that reads beats (or sends them) and
// waits behind a saturated coordinator's (or node's) other threads for its
// turn on the CPU is late for the same reason a gRPC handler would be; at a
// higher weight it runs as soon as a datagram arrives, and what it does per
// datagram is bounded (a parse, a lookup, an HMAC).
#pragma once

namespace loom::liveness {

// The nice value the liveness threads ask for (Linux: per thread).
inline constexpr int kLivenessNice = -10;

// Raises the calling thread to kLivenessNice. Needs CAP_SYS_NICE (root, or
// the capability, or RLIMIT_NICE); returns false and changes nothing
// without it.
bool RaiseThisThread();

}  // namespace loom::liveness
