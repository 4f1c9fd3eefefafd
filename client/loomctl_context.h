// What every loomctl verb shares: the flags that pick the coordinator and
// the caller's credentials, the channel to the coordinator that leads, and
// the way errors are printed. A verb (client/*_verb*.cc) uses these and
// nothing of another verb.
#pragma once

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "common/rpc/coordinator_channel.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/job.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, format);
ABSL_DECLARE_FLAG(std::string, token_file);

namespace loom::client {

// "loomctl: <message>" on stderr; returns `code` (1: the request failed).
int Fail(const std::string& message, int code = 1);

// An RPC error in words; an unreachable coordinator says how to start one.
int RpcFail(const grpc::Status& status);

bool ReadFile(const std::string& path, std::string* out);
std::string Env(const char* name);

// The coordinators, with TLS from the flags or $LOOM_TLS_DIR and the bearer
// token (--token_file or $LOOM_TOKEN) on every call.
loom::rpc::CoordinatorChannel& Coordinators();

// With several coordinators: looks for the leader for up to ~10 s; false if
// none leads.
bool FindLeader();

// The channel to the coordinator that leads (found once per process).
std::shared_ptr<grpc::Channel> Channel();

std::unique_ptr<loom::v1::JobService::Stub> Stub();

// --format is one of `allowed` (or empty); otherwise a usage error naming the verb.
void RequireFormat(const std::string& verb, std::initializer_list<const char*> allowed);

}  // namespace loom::client
