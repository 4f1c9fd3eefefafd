// RankService.StoreBatch's logic (coordinator/service/store_batch.h) with the
// real authentication of a node certificate and rank tokens: each op is
// admitted on its own, so a batch mixing a good op with another node's
// rank's token, a foreign namespace and a bad token applies only the good
// one; a batch over the bound is refused naming it; the commit gate answers a
// rank's commit add per op (fenced, superseded, foreign).
#include "coordinator/service/store_batch.h"

#include "common/rpc/commit_gate.h"
#include "common/rpc/rank_entries.h"
#include "common/rpc/store_quotas.h"
#include "coordinator/auth/rank_token.h"
#include "coordinator/service/caller_identity.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

constexpr char kNs[] = "job-000001/attempt-1";

auth::RankClaim Claim(const std::string& node, int32_t rank, const std::string& ns = kNs) {
  return auth::RankClaim{
      .job_id = "job-000001", .attempt = 1, .rank = rank, .node_id = node, .store_namespace = ns};
}

loom::v1::StoreOp SetOp(const std::string& token, const std::string& ns, const std::string& key) {
  loom::v1::StoreOp op;
  op.set_rank_token(token);
  op.mutable_set()->set_store_namespace(ns);
  op.mutable_set()->set_key(key);
  op.mutable_set()->set_value("v-" + key);
  return op;
}

loom::v1::StoreOp AddOp(const std::string& token, const std::string& ns, const std::string& key) {
  loom::v1::StoreOp op;
  op.set_rank_token(token);
  op.mutable_add()->set_store_namespace(ns);
  op.mutable_add()->set_key(key);
  op.mutable_add()->set_delta(1);
  return op;
}

class StoreBatchTest : public ::testing::Test {
 protected:
  StoreBatchTest() : codec_(std::string(32, 'k')), auth_(/*tls=*/true, nullptr, &codec_) {
    kv_.OpenNamespace(kNs);
    kv_.OpenNamespace("job-000002/attempt-1");
    node_a_.tls = true;
    node_a_.common_name = "node-a";
    node_a_.organizational_units = {"node"};
  }
  loom::v1::StoreBatchResponse Apply(const loom::v1::StoreBatchRequest& request) {
    loom::v1::StoreBatchResponse response;
    ApplyStoreBatch(
        request,
        [this](const std::string& token, const std::string& method) {
          return auth_.AdmitWithToken(node_a_, token, method);
        },
        &kv_, &response);
    return response;
  }

  auth::RankTokenCodec codec_;
  CallerAuth auth_;
  auth::PeerInfo node_a_;
  KvStore kv_;
};

TEST_F(StoreBatchTest, OnlyTheOpsTheirOwnTokenAllowsAreApplied) {
  loom::v1::StoreBatchRequest request;
  *request.add_ops() = SetOp(codec_.Issue(Claim("node-a", 0)), kNs, "good");
  // A rank of node-b: node-a may not act for it.
  *request.add_ops() = SetOp(codec_.Issue(Claim("node-b", 1)), kNs, "other-node");
  // node-a's own rank, but another job's namespace.
  *request.add_ops() = SetOp(codec_.Issue(Claim("node-a", 0)), "job-000002/attempt-1", "foreign");
  *request.add_ops() = SetOp("not-a-token", kNs, "bad-token");
  *request.add_ops() = AddOp(codec_.Issue(Claim("node-a", 0)), kNs, "count");
  *request.add_ops() = AddOp(codec_.Issue(Claim("node-b", 1)), kNs, "count");
  *request.add_ops() = SetOp("", kNs, "no-token");
  ASSERT_TRUE(CheckStoreBatch(request).ok());
  loom::v1::StoreBatchResponse response = Apply(request);
  ASSERT_EQ(response.results_size(), 7);
  EXPECT_EQ(response.results(0).code(), 0) << response.results(0).message();
  EXPECT_EQ(response.results(1).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_NE(response.results(1).message().find("another node"), std::string::npos)
      << response.results(1).message();
  EXPECT_EQ(response.results(2).code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(response.results(3).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(response.results(4).code(), 0) << response.results(4).message();
  EXPECT_EQ(response.results(4).value(), 1);
  EXPECT_EQ(response.results(5).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(response.results(6).code(), static_cast<int>(absl::StatusCode::kPermissionDenied));

  EXPECT_EQ(*kv_.Get(kNs, "good", absl::ZeroDuration()), "v-good");
  for (const char* key : {"other-node", "bad-token", "no-token"}) {
    EXPECT_FALSE(kv_.Get(kNs, key, absl::ZeroDuration()).ok()) << key;
  }
  EXPECT_FALSE(kv_.Get("job-000002/attempt-1", "foreign", absl::ZeroDuration()).ok());
  // The refused add was not applied: the next one counts 2.
  EXPECT_EQ(*kv_.Add(kNs, "count", 1), 2);
}

TEST_F(StoreBatchTest, ARankEntryIsWrittenByItsOwnRankOnly) {
  // Entries are carried into the next attempt placed in place: one rank
  // must not be able to plant another's.
  loom::v1::StoreBatchRequest request;
  const std::string rank0 = codec_.Issue(Claim("node-a", 0));
  *request.add_ops() = SetOp(rank0, kNs, rpc::RankEntryKey(0, "addr"));
  *request.add_ops() = SetOp(rank0, kNs, rpc::RankEntryKey(1, "addr"));
  *request.add_ops() = AddOp(rank0, kNs, rpc::RankEntryKey(1, "count"));
  *request.add_ops() = SetOp(rank0, kNs, "loom/rank/x/addr");
  *request.add_ops() = AddOp(rank0, kNs, std::string(rpc::kJoinedKey));
  loom::v1::StoreBatchResponse response = Apply(request);
  ASSERT_EQ(response.results_size(), 5);
  EXPECT_EQ(response.results(0).code(), 0) << response.results(0).message();
  EXPECT_EQ(response.results(1).code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(response.results(1).message().find("rank 1's entry"), std::string::npos)
      << response.results(1).message();
  EXPECT_EQ(response.results(2).code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(response.results(3).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(response.results(4).code(), 0) << response.results(4).message();
  EXPECT_FALSE(kv_.Get(kNs, rpc::RankEntryKey(1, "addr"), absl::ZeroDuration()).ok());
}

TEST_F(StoreBatchTest, AStoreErrorFailsItsOpAlone) {
  loom::v1::StoreBatchRequest request;
  const std::string token = codec_.Issue(Claim("node-a", 0));
  *request.add_ops() = SetOp(token, kNs, std::string(rpc::StoreQuotas().max_key_bytes + 1, 'k'));
  *request.add_ops() = SetOp(token, kNs, "fine");
  request.add_ops()->set_rank_token(token);  // neither a set nor an add
  loom::v1::StoreBatchResponse response = Apply(request);
  ASSERT_EQ(response.results_size(), 3);
  EXPECT_NE(response.results(0).code(), 0);
  EXPECT_EQ(response.results(1).code(), 0) << response.results(1).message();
  EXPECT_EQ(response.results(2).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreBatchTest, ABatchOverTheBoundIsRefusedNamingIt) {
  loom::v1::StoreBatchRequest request;
  const std::string token = codec_.Issue(Claim("node-a", 0));
  for (int i = 0; i <= rpc::kMaxStoreBatchOps; ++i) {
    *request.add_ops() = AddOp(token, kNs, "count");
  }
  absl::Status status = CheckStoreBatch(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("StoreBatchRequest.ops"), std::string::npos) << status;
  EXPECT_NE(status.message().find("at most 1024"), std::string::npos) << status;
  request.mutable_ops()->RemoveLast();
  EXPECT_TRUE(CheckStoreBatch(request).ok());

  loom::v1::StoreBatchRequest big;
  for (int i = 0; i < 9; ++i) {
    *big.add_ops() = SetOp(token, kNs, "k");
    big.mutable_ops()->rbegin()->mutable_set()->set_value(std::string(1 << 20, 'v'));
  }
  status = CheckStoreBatch(big);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bytes"), std::string::npos) << status;
}

// What a rank's commit add gets through RankService: its own attempt's fenced
// namespace UNAVAILABLE naming the wait; a superseded attempt's (its token
// still verifies, its namespace is dropped) NOT_FOUND; another attempt's
// namespace with an old token PERMISSION_DENIED.
TEST_F(StoreBatchTest, TheCommitGateAsARankSeesIt) {
  const std::string next = "job-000001/attempt-2";
  kv_.OpenNamespace(next, {.until = absl::Now() + absl::Hours(1),
                           .why = "node node-b was lost and its lease may not have run out"});
  kv_.DropNamespace(kNs);  // attempt 1 was superseded
  loom::v1::StoreBatchRequest request;
  *request.add_ops() = AddOp(codec_.Issue(Claim("node-a", 0, next)), next, rpc::CommitKey(7));
  *request.add_ops() = AddOp(codec_.Issue(Claim("node-a", 0)), kNs, rpc::CommitKey(7));
  *request.add_ops() = AddOp(codec_.Issue(Claim("node-a", 0)), next, rpc::CommitKey(7));
  *request.add_ops() = AddOp(codec_.Issue(Claim("node-a", 0, next)), next, "barrier");
  loom::v1::StoreBatchResponse response = Apply(request);
  ASSERT_EQ(response.results_size(), 4);
  EXPECT_EQ(response.results(0).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(response.results(0).message().find("node-b was lost"), std::string::npos)
      << response.results(0).message();
  EXPECT_EQ(response.results(1).code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(response.results(2).code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(response.results(3).code(), 0) << response.results(3).message();
}

}  // namespace
}  // namespace loom::coordinator
