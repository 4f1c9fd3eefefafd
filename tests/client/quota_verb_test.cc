// loomctl quota's requests from its flags and its table (client/quota_verb.h).
#include "client/quota_verb.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;

TEST(QuotaSetRequests, OneRequestPerThingSet) {
  auto r = QuotaSetRequests(
      {.user = "alice", .group = "ml", .gpu = "8", .cpu = "", .max_priority = "10"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_TRUE((*r)[0].set_member_of());
  EXPECT_EQ((*r)[0].member_of(), "ml");
  EXPECT_EQ((*r)[1].max_priority(), 10);
  EXPECT_EQ((*r)[2].device_kind(), "gpu");
  EXPECT_EQ((*r)[2].devices(), 8);
  for (const auto& each : *r) EXPECT_EQ(each.user(), "alice");
  auto none = QuotaSetRequests({.group = "ml", .cpu = "none"});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->at(0).group(), "ml");
  EXPECT_EQ(none->at(0).devices(), -1);  // no limit
  auto leave = QuotaSetRequests({.user = "bob", .group = "none", .max_priority = "none"});
  ASSERT_TRUE(leave.ok());
  EXPECT_EQ(leave->at(0).member_of(), "");
  EXPECT_TRUE(leave->at(1).remove_max_priority());
}

TEST(QuotaSetRequests, BadFlagsAreNamed) {
  EXPECT_THAT(QuotaSetRequests({.user = "a", .gpu = "-3"}).status().message(),
              HasSubstr("--gpu_quota=-3 must be a device count"));
  EXPECT_THAT(QuotaSetRequests({.user = "a", .max_priority = "high"}).status().message(),
              HasSubstr("--max_priority=high must be an integer"));
  EXPECT_THAT(QuotaSetRequests({.group = "ml", .max_priority = "3"}).status().message(),
              HasSubstr("not a --group"));
  EXPECT_THAT(QuotaSetRequests({}).status().message(), HasSubstr("needs --user"));
  EXPECT_THAT(QuotaSetRequests({.user = "a"}).status().message(), HasSubstr("something to set"));
}

TEST(FormatQuotas, UsersAndGroups) {
  loom::v1::ListQuotasResponse list;
  EXPECT_EQ(FormatQuotas(list), "no quotas\n");
  loom::v1::Quota* alice = list.add_quotas();
  alice->set_user("alice");
  alice->set_member_of("ml");
  alice->set_has_max_priority(true);
  alice->set_max_priority(10);
  loom::v1::DeviceQuota* d = alice->add_devices();
  d->set_kind("gpu");
  d->set_devices(8);
  list.add_quotas()->set_group("ml");
  const std::string out = FormatQuotas(list);
  EXPECT_THAT(out, HasSubstr("user alice"));
  EXPECT_THAT(out, HasSubstr("      8      -  ml           10\n"));
  EXPECT_THAT(out, HasSubstr("group ml"));
}

}  // namespace
}  // namespace loom::client
