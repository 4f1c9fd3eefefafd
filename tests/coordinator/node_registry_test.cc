// NodeRegistry's one identity rule: a second session cannot take a node id
// whose session is alive; a silent leftover is replaced.
#include "coordinator/cluster/node_registry.h"

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

class NullChannel final : public NodeChannel {
 public:
  void Send(const loom::v1::CoordinatorMessage&) override {}
};

loom::v1::RegisterNode Node(const std::string& id) {
  loom::v1::RegisterNode r;
  r.set_node_id(id);
  loom::v1::Device* d = r.add_devices();
  d->set_kind("cpu");
  d->set_count(2);
  return r;
}

TEST(NodeRegistryTest, ASecondSessionCannotReplaceALiveNode) {
  NodeRegistry nodes;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Duration alive = absl::Seconds(2);
  auto first = std::make_shared<NullChannel>();
  auto second = std::make_shared<NullChannel>();
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), first, t0, alive));
  EXPECT_FALSE(nodes.RegisterIfFree(Node("n1"), second, t0 + absl::Seconds(1), alive));
  // The same session may register again (an agent re-sends its registration).
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), first, t0 + absl::Seconds(1), alive));
  // After the first session closed, or went silent, the id is free.
  EXPECT_TRUE(nodes.SessionClosed("n1", first.get()));
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), second, t0 + absl::Seconds(1), alive));
  auto third = std::make_shared<NullChannel>();
  EXPECT_FALSE(nodes.RegisterIfFree(Node("n1"), third, t0 + absl::Seconds(2), alive));
  EXPECT_TRUE(nodes.RegisterIfFree(Node("n1"), third, t0 + absl::Seconds(10), alive));
  EXPECT_FALSE(nodes.SessionClosed("n1", second.get()));  // no longer the node's session
}

}  // namespace
}  // namespace loom::coordinator
