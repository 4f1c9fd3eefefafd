// absl::Status <-> grpc::Status, so handlers stay one line each.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/text/safe_text.h"
#include "grpcpp/support/status.h"

namespace loom::coordinator {

// An error's message travels in a response header: one that quotes a huge
// refused value would break the transport's metadata limit, and the caller
// would see that instead of the rule. Every message is bounded (and escaped)
// here, whatever the handler below quoted.
inline constexpr size_t kMaxErrorMessageBytes = 2048;

inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      SafeText(std::string(status.message()), kMaxErrorMessageBytes));
}

}  // namespace loom::coordinator
