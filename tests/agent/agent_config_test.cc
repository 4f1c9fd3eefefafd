// loom-worker's command line: strict parsing, defaults, errors naming the
// flag, and the derived node id.
#include "worker/agent/agent_config.h"

#include <filesystem>

#include "gtest/gtest.h"

namespace loom::agent {
namespace {

TEST(AgentConfigTest, ParsesTheContractFlagsWithDefaults) {
  absl::StatusOr<AgentConfig> config = ParseAgentCommandLine(
      {"--coordinator=127.0.0.1:7000", "--devices=cpu:4", "--work_dir=/tmp/x/../agent/", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator, "127.0.0.1:7000");
  EXPECT_EQ(config->devices.kind, DeviceRequest::Kind::kCpu);
  EXPECT_EQ(config->devices.cpu_count, 4);
  EXPECT_EQ(config->work_dir, "/tmp/agent");
  EXPECT_EQ(config->address, "127.0.0.1");
  EXPECT_EQ(config->trainer, "");
  EXPECT_DOUBLE_EQ(config->kill_grace_s, 5);
  EXPECT_EQ(config->node_id, DeriveNodeId(HostName(), "/tmp/agent"));
}

TEST(AgentConfigTest, ConfinementRootsDefaultUnderTheWorkDir) {
  absl::StatusOr<AgentConfig> config =
      ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->data_roots, std::vector<std::string>{"/w/data"});
  EXPECT_EQ(config->checkpoint_root, "/w/checkpoints");
  EXPECT_EQ(config->run_as_user, "");
  config = ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w",
                                  "--data_roots=/srv/a/,/srv/b", "--checkpoint_root=/ck",
                                  "--run_as_user=loom", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->data_roots, (std::vector<std::string>{"/srv/a", "/srv/b"}));
  EXPECT_EQ(config->checkpoint_root, "/ck");
  EXPECT_EQ(config->run_as_user, "loom");
  config = ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w",
                                  "--data_roots=/srv/../etc", "--insecure"});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("--data_roots"), absl::string_view::npos);
}

TEST(AgentConfigTest, PerJobUidRange) {
  absl::StatusOr<AgentConfig> config =
      ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w",
                             "--run_as_uid_range=200000-299999", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->run_as_uids.has_value());
  EXPECT_EQ(config->run_as_uids->first, 200000u);
  EXPECT_EQ(config->run_as_uids->last, 299999u);
  config = ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w",
                                  "--run_as_uid_range=0-10", "--insecure"});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("--run_as_uid_range"), absl::string_view::npos);
  config = ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w",
                                  "--run_as_uid_range=5-10", "--run_as_user=loom", "--insecure"});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("exclude each other"), absl::string_view::npos);
  // Not carried into the next parse.
  config = ParseAgentCommandLine(
      {"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->run_as_uids.has_value());
}

TEST(AgentConfigTest, LabelsAreParsedAndCheckedNamingTheFlag) {
  absl::StatusOr<AgentConfig> config =
      ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--insecure",
                             "--labels=rack=r1,nvlink_domain=d0"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->labels,
            (std::map<std::string, std::string>{{"rack", "r1"}, {"nvlink_domain", "d0"}}));
  config = ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w",
                                  "--insecure", "--labels=rack=r1,rack=r2"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), "--labels: key 'rack' is given twice; a key may appear once");
  // Not carried into the next parse.
  config = ParseAgentCommandLine({"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->labels.empty());
}

TEST(AgentConfigTest, OptionalFlags) {
  absl::StatusOr<AgentConfig> config = ParseAgentCommandLine(
      {"--coordinator=coord:1", "--devices=gpu", "--work_dir=/w", "--node_id=n7",
       "--address=10.0.0.2", "--trainer=/opt/loom-trainer", "--kill_grace_s=0.5", "--insecure=true"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->devices.kind, DeviceRequest::Kind::kGpu);
  EXPECT_EQ(config->node_id, "n7");
  EXPECT_EQ(config->address, "10.0.0.2");
  EXPECT_EQ(config->trainer, "/opt/loom-trainer");
  EXPECT_DOUBLE_EQ(config->kill_grace_s, 0.5);

  // Values do not leak into the next parse.
  config = ParseAgentCommandLine(
      {"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->address, "127.0.0.1");
  EXPECT_DOUBLE_EQ(config->kill_grace_s, 5);
}

TEST(AgentConfigTest, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--devices=cpu:1", "--work_dir=/w"}, "--coordinator"},
      {{"--coordinator=c", "--devices=cpu:1", "--work_dir=/w"}, "--coordinator='c'"},
      {{"--coordinator=c:0", "--devices=cpu:1", "--work_dir=/w"}, "--coordinator"},
      {{"--coordinator=c:1", "--work_dir=/w"}, "--devices"},
      {{"--coordinator=c:1", "--devices=cpu:0", "--work_dir=/w"}, "--devices=cpu:0"},
      {{"--coordinator=c:1", "--devices=cpu:1"}, "--work_dir"},
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--kill_grace_s=-1"},
       "--kill_grace_s"},
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--kill_grace_s=x"},
       "--kill_grace_s"},
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--bogus=1"}, "--bogus"},
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "positional"}, "positional"},
      {{"--coordinator", "c:1"}, "--coordinator needs a value"},
      {{"--flagfile=/etc/passwd"}, "--flagfile"},
      // Mutual TLS is the default: no certificates and no --insecure is an error.
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w"}, "--tls_dir"},
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--tls_dir=/nonexistent"},
       "--tls_cert"},
      {{"--coordinator=c:1", "--devices=cpu:1", "--work_dir=/w", "--insecure",
        "--tls_dir=/d"},
       "--insecure"},
  };
  for (const auto& [args, expected] : cases) {
    absl::StatusOr<AgentConfig> config = ParseAgentCommandLine(args);
    ASSERT_FALSE(config.ok()) << expected;
    EXPECT_NE(config.status().message().find(expected), absl::string_view::npos)
        << config.status().message();
  }
}

TEST(AgentConfigTest, RelativePathsBecomeAbsolute) {
  absl::StatusOr<AgentConfig> config = ParseAgentCommandLine(
      {"--coordinator=c:1", "--devices=cpu:1", "--work_dir=w", "--trainer=bin/loom-trainer",
       "--insecure"});
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(config->work_dir, cwd + "/w");
  EXPECT_EQ(config->trainer, cwd + "/bin/loom-trainer");
}

TEST(AgentConfigTest, HelpIsNotAnError) {
  absl::StatusOr<AgentConfig> config = ParseAgentCommandLine({"--help"});
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->help);
}

TEST(AgentConfigTest, NodeIdIsStablePerHostAndWorkDir) {
  EXPECT_EQ(DeriveNodeId("h", "/w/a"), DeriveNodeId("h", "/w/a"));
  EXPECT_NE(DeriveNodeId("h", "/w/a"), DeriveNodeId("h", "/w/b"));
  EXPECT_EQ(DeriveNodeId("h", "/w/a").rfind("h-", 0), 0u);
  EXPECT_EQ(DeriveNodeId("h", "/w/a").size(), 10u);
}

TEST(AgentConfigTest, DefaultTrainerSitsNextToTheExecutable) {
  std::string path = DefaultTrainerPath();
  EXPECT_EQ(path.substr(path.rfind('/') + 1), "loom-trainer");
  EXPECT_EQ(path[0], '/');
}

}  // namespace
}  // namespace loom::agent
