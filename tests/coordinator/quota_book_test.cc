// The quota book (coordinator/jobs/quota_book.h): its text, changes saved
// before they take effect, a failed save that changes nothing, the priority
// cap, and the wire form QuotaService answers with.
#include "coordinator/jobs/quota_book.h"

#include <string>

#include "coordinator/service/quota_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

// Persistence in a string, failing on demand.
struct Saved {
  std::string text;
  bool fail = false;
  auth::TokenPersistence Persistence() {
    return {.name = "quotas",
            .load = [this]() -> absl::StatusOr<std::string> { return text; },
            .save = [this](const std::string& t) {
              if (fail) return absl::InternalError("disk full");
              text = t;
              return absl::OkStatus();
            }};
  }
};

TEST(QuotaBook, ChangesAreSavedAndSurviveAReopen) {
  Saved saved;
  auto book = QuotaBook::Open(saved.Persistence());
  ASSERT_TRUE(book.ok()) << book.status();
  ASSERT_TRUE((*book)->Apply({.user = "alice", .device_kind = "gpu", .devices = 8}).ok());
  ASSERT_TRUE((*book)->Apply({.user = "alice", .member_of = "ml", .max_priority = 10}).ok());
  ASSERT_TRUE((*book)->Apply({.group = "ml", .device_kind = "gpu", .devices = 16}).ok());
  EXPECT_EQ(saved.text,
            "user alice gpu 8\ngroup ml gpu 16\nmember alice ml\nmax_priority alice 10\n");
  auto again = QuotaBook::Open(saved.Persistence());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*(*again)->Current() == *(*book)->Current());
  EXPECT_EQ(((*again)->Current()->quotas.users.at({"alice", "gpu"})), 8);
  // Removing a limit and a group.
  ASSERT_TRUE((*book)->Apply({.user = "alice", .device_kind = "gpu", .devices = -1,
                              .member_of = ""}).ok());
  EXPECT_EQ(saved.text, "group ml gpu 16\nmax_priority alice 10\n");
}

TEST(QuotaBook, AFailedSaveChangesNothing) {
  Saved saved;
  auto book = QuotaBook::Open(saved.Persistence());
  ASSERT_TRUE(book.ok());
  saved.fail = true;
  absl::Status s = (*book)->Apply({.user = "alice", .device_kind = "gpu", .devices = 8});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("disk full"));
  EXPECT_TRUE((*book)->Current()->quotas.users.empty());
}

TEST(QuotaBook, BadChangesAndBadTextAreNamed) {
  Saved saved;
  auto book = QuotaBook::Open(saved.Persistence());
  ASSERT_TRUE(book.ok());
  EXPECT_THAT((*book)->Apply({.user = "alice", .device_kind = "tpu", .devices = 1}).message(),
              HasSubstr("device_kind='tpu' must be cpu or gpu"));
  EXPECT_THAT((*book)->Apply({.user = "a", .group = "b"}).message(), HasSubstr("exactly one"));
  EXPECT_THAT((*book)->Apply({.group = "ml", .max_priority = 3}).message(),
              HasSubstr("for a user, not a group"));
  EXPECT_THAT((*book)->Apply({.user = "bad name"}).message(), HasSubstr("not a valid name"));
  EXPECT_TRUE(saved.text.empty());
  saved.text = "user alice gpu 8\nuser bob gpu -1\n";
  auto broken = QuotaBook::Open(saved.Persistence());
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(broken.status().message(), HasSubstr("quotas:2:"));
}

TEST(QuotaBook, PriorityCap) {
  Saved saved;
  saved.text = "max_priority alice 5\n";
  auto book = QuotaBook::Open(saved.Persistence());
  ASSERT_TRUE(book.ok());
  EXPECT_TRUE((*book)->CheckPriority("alice", 5).ok());
  EXPECT_THAT((*book)->CheckPriority("alice", 6).message(),
              HasSubstr("scheduling.priority=6 must be at most 5, alice's cap"));
  EXPECT_TRUE((*book)->CheckPriority("bob", 1000).ok());  // no cap
}

TEST(QuotaService, ListsEntriesInWireForm) {
  QuotaTable table;
  table.quotas.users[{"alice", "gpu"}] = 8;
  table.quotas.group_of["alice"] = "ml";
  table.quotas.groups[{"ml", "gpu"}] = 16;
  table.max_priority["bob"] = 3;
  loom::v1::ListQuotasResponse all = ListQuotas(table, {});
  ASSERT_EQ(all.quotas_size(), 3);
  EXPECT_EQ(all.quotas(0).user(), "alice");
  EXPECT_EQ(all.quotas(0).member_of(), "ml");
  EXPECT_EQ(all.quotas(0).devices(0).devices(), 8);
  EXPECT_EQ(all.quotas(1).user(), "bob");
  EXPECT_TRUE(all.quotas(1).has_max_priority());
  EXPECT_EQ(all.quotas(2).group(), "ml");
  loom::v1::ListQuotasRequest alice;
  alice.set_user("alice");
  loom::v1::ListQuotasResponse mine = ListQuotas(table, alice);
  ASSERT_EQ(mine.quotas_size(), 2);  // alice and her group
  EXPECT_EQ(mine.quotas(1).group(), "ml");
}

}  // namespace
}  // namespace loom::coordinator
