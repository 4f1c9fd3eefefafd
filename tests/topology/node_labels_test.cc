// Node labels: the --labels syntax, its rules and the registration's check.
#include "common/topology/node_labels.h"

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

TEST(NodeLabelsTest, ParsesPairs) {
  absl::StatusOr<NodeLabels> labels =
      ParseNodeLabels("rack=r1,nvlink_domain=d0,zone=eu-1.a", "--labels");
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels, (NodeLabels{{"rack", "r1"}, {"nvlink_domain", "d0"}, {"zone", "eu-1.a"}}));
  EXPECT_EQ(FormatNodeLabels(*labels), "nvlink_domain=d0,rack=r1,zone=eu-1.a");
  labels = ParseNodeLabels("", "--labels");
  ASSERT_TRUE(labels.ok());
  EXPECT_TRUE(labels->empty());
  EXPECT_EQ(FormatNodeLabels({}), "");
}

TEST(NodeLabelsTest, RefusesBadInputNamingTheFlagAndRule) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"rack", "'rack' must be KEY=VALUE"},
      {"rack=r1,", "'' must be KEY=VALUE"},
      {"Rack=r1", "key 'Rack': a label key is 1-63 characters of lowercase letters"},
      {"1rack=r1", "starting with a letter"},
      {"=r1", "key ''"},
      {"rack=", "rack='': a label value is 1-63 characters"},
      {"rack=r 1", "a label value"},
      {"rack=r1,rack=r2", "key 'rack' is given twice"},
      {"a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1,j=1,k=1,l=1,m=1,n=1,o=1,p=1,q=1",
       "has 17 labels; at most 16"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<NodeLabels> labels = ParseNodeLabels(c.text, "--labels");
    ASSERT_FALSE(labels.ok()) << c.text;
    EXPECT_EQ(labels.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(labels.status().message().rfind("--labels", 0), 0u) << labels.status();
    EXPECT_NE(labels.status().message().find(c.says), std::string::npos)
        << c.text << ": " << labels.status();
  }
  std::string long_value(64, 'v');
  EXPECT_FALSE(ParseNodeLabels("rack=" + long_value, "--labels").ok());
  EXPECT_TRUE(ParseNodeLabels("rack=" + long_value.substr(1), "--labels").ok());
}

TEST(NodeLabelsTest, ChecksARegistrationsLabelsWithoutEchoingThem) {
  EXPECT_TRUE(CheckNodeLabels({{"rack", "r1"}}, "register.labels").ok());
  absl::Status s = CheckNodeLabels({{"rack", "bad\nvalue"}}, "register.labels");
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().find("bad"), std::string::npos) << s;
  EXPECT_NE(s.message().find("register.labels (key rack)"), std::string::npos) << s;
  s = CheckNodeLabels({{"Bad\x01", "x"}}, "register.labels");
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().find("Bad"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom::topology
