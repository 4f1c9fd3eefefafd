// coordinator/auth without sockets: who a peer is (certificate subject,
// bearer tokens, rank tokens) and who may call what.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "coordinator/auth/authenticate.h"
#include "coordinator/auth/policy.h"
#include "coordinator/auth/rank_token.h"
#include "coordinator/auth/user_tokens.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

#include <thread>

namespace loom::coordinator::auth {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "loom-auth-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

PeerInfo Cert(const std::string& cn, const std::string& ou, const std::string& authorization = "") {
  return PeerInfo{.tls = true,
                  .common_name = cn,
                  .organizational_units = {ou},
                  .authorization = authorization};
}

RankClaim Claim(const std::string& node = "node-a", int32_t attempt = 1, int32_t rank = 0) {
  return RankClaim{.job_id = "job-000001",
                   .attempt = attempt,
                   .rank = rank,
                   .node_id = node,
                   .store_namespace = "job-000001/attempt-1"};
}

TEST(AuthenticateTest, RoleComesFromTheCertificateSubject) {
  for (const auto& [ou, role] : std::vector<std::pair<std::string, Role>>{
           {"admin", Role::kAdmin}, {"user", Role::kUser}, {"node", Role::kNode},
           {"coordinator", Role::kCoordinator}}) {
    absl::StatusOr<Identity> id = Authenticate(Cert("x", ou), nullptr, nullptr);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->role, role);
    EXPECT_EQ(id->name, "x");
  }
  // An OU that names no role, a bad CN, or no credential at all: UNAUTHENTICATED.
  EXPECT_EQ(Authenticate(Cert("x", "ops"), nullptr, nullptr).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticate(Cert("a\nforged log line", "admin"), nullptr, nullptr).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticate(PeerInfo{.tls = true}, nullptr, nullptr).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Plaintext (--insecure) has no identities.
  EXPECT_EQ(Authenticate(PeerInfo{.tls = false}, nullptr, nullptr)->role, Role::kInsecure);
}

TEST(AuthenticateTest, UserTokensAreStoredHashedAndCanBeRevoked) {
  TempDir dir;
  const std::string path = dir.path() + "/tokens";
  auto store = UserTokenStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::string> token = (*store)->Create("alice");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_FALSE((*store)->Create("bad name").ok());

  // The file holds a hash, never the token.
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find(*token), std::string::npos);
  EXPECT_NE(text.find("alice"), std::string::npos);
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::others_read, fs::perms::none);

  // A reopened store (coordinator restart) still knows it.
  auto reopened = UserTokenStore::Open(path);
  ASSERT_TRUE(reopened.ok());
  absl::StatusOr<Identity> id =
      Authenticate(PeerInfo{.tls = true, .authorization = "Bearer " + *token}, reopened->get(), nullptr);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kUser);
  EXPECT_EQ(id->name, "alice");

  EXPECT_EQ(*(*reopened)->Revoke("alice"), 1);
  EXPECT_EQ(Authenticate(PeerInfo{.tls = true, .authorization = "Bearer " + *token},
                         reopened->get(), nullptr)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticate(PeerInfo{.tls = true, .authorization = "Bearer loomu1.00"},
                         reopened->get(), nullptr)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticate(PeerInfo{.tls = true, .authorization = "Basic abc"}, reopened->get(),
                         nullptr)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(RankTokenTest, VerifiesOnlyWhatItIssued) {
  RankTokenCodec codec(std::string(32, 'k'));
  const std::string token = codec.Issue(Claim());
  absl::StatusOr<RankClaim> claim = codec.Verify(token);
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->job_id, "job-000001");
  EXPECT_EQ(claim->attempt, 1);
  EXPECT_EQ(claim->store_namespace, "job-000001/attempt-1");

  // Another key, a changed byte, or garbage: refused.
  EXPECT_FALSE(RankTokenCodec(std::string(32, 'x')).Verify(token).ok());
  std::string tampered = token;
  tampered[10] = tampered[10] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(codec.Verify(tampered).ok());
  EXPECT_FALSE(codec.Verify("loomr1.zz.zz").ok());
}

TEST(RankTokenTest, KeyPersistsInTheStateDir) {
  TempDir dir;
  const std::string path = dir.path() + "/rank_token.key";
  auto first = RankTokenCodec::LoadOrCreate(path);
  ASSERT_TRUE(first.ok());
  auto second = RankTokenCodec::LoadOrCreate(path);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->Verify(first->Issue(Claim())).ok());
}

TEST(AuthenticateTest, RankTokenNeedsItsOwnNodesCertificate) {
  RankTokenCodec codec(std::string(32, 'k'));
  const std::string bearer = "Bearer " + codec.Issue(Claim("node-a"));
  absl::StatusOr<Identity> id = Authenticate(Cert("node-a", "node", bearer), nullptr, &codec);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(id->rank.has_value());
  EXPECT_EQ(id->rank->rank, 0);
  // Stolen by another node, or used without a node certificate: refused.
  EXPECT_EQ(Authenticate(Cert("node-b", "node", bearer), nullptr, &codec).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticate(Cert("alice", "user", bearer), nullptr, &codec).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticate(PeerInfo{.tls = true, .authorization = bearer}, nullptr, &codec)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PolicyTest, MethodsByRole) {
  const Identity admin{.role = Role::kAdmin, .name = "admin", .rank = {}};
  const Identity alice{.role = Role::kUser, .name = "alice", .rank = {}};
  const Identity node{.role = Role::kNode, .name = "node-a", .rank = {}};
  Identity rank = node;
  rank.rank = Claim();
  const Identity coordinator{.role = Role::kCoordinator, .name = "loom-coordinator", .rank = {}};
  const Identity insecure{.role = Role::kInsecure, .name = "insecure", .rank = {}};

  auto allowed = [](const Identity& who, const std::string& method) {
    return AuthorizeMethod(who, method).ok();
  };
  EXPECT_TRUE(allowed(alice, "/loom.v1.JobService/SubmitJob"));
  EXPECT_TRUE(allowed(alice, "/loom.v1.JobService/WatchJob"));
  EXPECT_FALSE(allowed(alice, "/loom.v1.JobService/ListNodes"));
  EXPECT_TRUE(allowed(admin, "/loom.v1.JobService/ListNodes"));
  EXPECT_FALSE(allowed(alice, "/loom.v1.AuthService/CreateToken"));
  EXPECT_TRUE(allowed(admin, "/loom.v1.AuthService/CreateToken"));
  EXPECT_TRUE(allowed(alice, "/loom.v1.AuthService/WhoAmI"));
  // Only nodes hold sessions; users and admins do not.
  EXPECT_TRUE(allowed(node, "/loom.v1.NodeService/Session"));
  EXPECT_FALSE(allowed(alice, "/loom.v1.NodeService/Session"));
  EXPECT_FALSE(allowed(admin, "/loom.v1.NodeService/Session"));
  // The rank service needs a rank token; nodes and ranks submit nothing.
  EXPECT_FALSE(allowed(node, "/loom.v1.RankService/StoreGet"));
  EXPECT_TRUE(allowed(rank, "/loom.v1.RankService/StoreGet"));
  // Progress goes through the node's agent, not to the coordinator.
  EXPECT_FALSE(allowed(rank, "/loom.v1.RankService/ReportProgress"));
  EXPECT_FALSE(allowed(node, "/loom.v1.JobService/SubmitJob"));
  EXPECT_FALSE(allowed(rank, "/loom.v1.JobService/ListJobs"));
  EXPECT_FALSE(allowed(coordinator, "/loom.v1.JobService/ListJobs"));
  // Unknown methods are refused; --insecure allows everything.
  EXPECT_FALSE(allowed(admin, "/loom.v1.JobService/DropAllTables"));
  EXPECT_TRUE(allowed(insecure, "/loom.v1.JobService/ListNodes"));
  EXPECT_EQ(AuthorizeMethod(alice, "/loom.v1.JobService/ListNodes").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(PolicyTest, JobsBelongToTheirOwner) {
  const Identity admin{.role = Role::kAdmin, .name = "admin", .rank = {}};
  const Identity alice{.role = Role::kUser, .name = "alice", .rank = {}};
  const Identity bob{.role = Role::kUser, .name = "bob", .rank = {}};
  EXPECT_TRUE(AuthorizeJob(alice, "job-1", "alice").ok());
  // Another owner's job answers as one that does not exist.
  EXPECT_EQ(AuthorizeJob(bob, "job-1", "alice"), JobNotFound("job-1"));
  EXPECT_EQ(JobNotFound("job-1").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(AuthorizeJob(admin, "job-1", "alice").ok());
  // A job from before owners existed is the admins' alone.
  EXPECT_FALSE(MaySeeJob(alice, ""));
  EXPECT_TRUE(MaySeeJob(admin, ""));
}

// A user token for the name "admin" (or "alice") is not the owner of the
// jobs of the certificate of that name.
TEST(PolicyTest, OwnersCarryTheKindOfTheirCredential) {
  const Identity alice_cert{.role = Role::kUser, .name = "alice", .rank = {}};
  const Identity alice_token{
      .role = Role::kUser, .name = "alice", .rank = {}, .credential = Credential::kToken};
  const Identity admin_token{
      .role = Role::kUser, .name = "admin", .rank = {}, .credential = Credential::kToken};
  EXPECT_EQ(OwnerName(alice_cert), "alice");
  EXPECT_EQ(OwnerName(alice_token), "token:alice");
  EXPECT_FALSE(MaySeeJob(alice_token, "alice"));
  EXPECT_FALSE(MaySeeJob(alice_cert, "token:alice"));
  EXPECT_TRUE(MaySeeJob(alice_token, OwnerName(alice_token)));
  EXPECT_FALSE(MaySeeJob(admin_token, "admin"));
}

// The role comes from the certificate's OU entries, one role only: an entry
// cannot smuggle another in (the structured subject has no string to split).
TEST(AuthenticateTest, ARoleIsOneOuEntryAndConflictingRolesAreRefused) {
  EXPECT_EQ(*RoleFromUnits({"team-x", "user"}), Role::kUser);
  EXPECT_EQ(*RoleFromUnits({"user", "user"}), Role::kUser);
  EXPECT_EQ(RoleFromUnits({"user", "admin"}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(RoleFromUnits({"x,OU=admin"}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(RoleFromUnits({}).status().code(), absl::StatusCode::kUnauthenticated);
  // Two CN entries reach Authenticate joined: no valid name.
  PeerInfo two_names = Cert("alice,admin", "user");
  EXPECT_EQ(Authenticate(two_names, nullptr, nullptr).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PolicyTest, NodesRegisterOnlyUnderTheirOwnName) {
  const Identity node{.role = Role::kNode, .name = "node-a", .rank = {}};
  const Identity admin{.role = Role::kAdmin, .name = "admin", .rank = {}};
  EXPECT_TRUE(AuthorizeRegister(node, "node-a").ok());
  EXPECT_EQ(AuthorizeRegister(node, "node-b").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(AuthorizeRegister(admin, "admin").ok());
}

TEST(PolicyTest, RanksReachOnlyTheirNamespace) {
  Identity rank{.role = Role::kNode, .name = "node-a", .rank = Claim("node-a", 1, 0)};
  EXPECT_TRUE(AuthorizeStore(rank, "job-000001/attempt-1").ok());
  EXPECT_EQ(AuthorizeStore(rank, "job-000001/attempt-2").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(AuthorizeStore(rank, "job-000002/attempt-1").ok());
  const Identity node{.role = Role::kNode, .name = "node-a", .rank = {}};
  EXPECT_FALSE(AuthorizeStore(node, "job-000001/attempt-1").ok());
}

// Token hashes kept in memory, with a save that waits at a gate or fails.
struct SlowPersistence {
  absl::Mutex mu;
  std::string text;
  bool open = true;
  bool saving = false;
  absl::Status failure;
  TokenPersistence Persistence() {
    return {.name = "memory",
            .load = [this]() -> absl::StatusOr<std::string> {
              absl::MutexLock lock(&mu);
              return text;
            },
            .save = [this](const std::string& next) {
              absl::MutexLock lock(&mu);
              saving = true;
              mu.Await(absl::Condition(&open));
              saving = false;
              if (!failure.ok()) return failure;
              text = next;
              return absl::OkStatus();
            }};
  }
};

TEST(UserTokenStoreTest, ALookupNeverWaitsForASaveAndAFailedSaveChangesNothing) {
  SlowPersistence saved;
  auto store = UserTokenStore::Open(saved.Persistence());
  ASSERT_TRUE(store.ok());
  auto alice = (*store)->Create("alice");
  ASSERT_TRUE(alice.ok());
  {
    absl::MutexLock lock(&saved.mu);
    saved.open = false;
  }
  absl::StatusOr<std::string> bob;
  std::thread create([&] { bob = (*store)->Create("bob"); });
  {
    absl::MutexLock lock(&saved.mu);
    saved.mu.Await(absl::Condition(&saved.saving));
  }
  // Bob's save is under way: lookups answer meanwhile.
  auto user = (*store)->Lookup(*alice);
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(*user, "alice");
  {
    absl::MutexLock lock(&saved.mu);
    saved.open = true;
  }
  create.join();
  ASSERT_TRUE(bob.ok());
  EXPECT_EQ(*(*store)->Lookup(*bob), "bob");

  // A save that fails: UNAVAILABLE naming why, and nothing changed.
  {
    absl::MutexLock lock(&saved.mu);
    saved.failure = absl::InternalError("cannot write memory: No space left on device");
  }
  auto carol = (*store)->Create("carol");
  EXPECT_EQ(carol.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(carol.status().message().find("No space left on device"), std::string::npos);
  auto revoked = (*store)->Revoke("alice");
  EXPECT_EQ(revoked.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*store)->Lookup(*alice).ok());  // still valid: the revoke was not saved
}

}  // namespace
}  // namespace loom::coordinator::auth
