// The ranks an agent test pretends to have launched: token -> identity, for
// the AgentService and the store relay without a RankManager.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "worker/agent/rank_tokens.h"

namespace loom::agent::testing {

class FakeRankTokens final : public RankTokens {
 public:
  std::optional<RankIdentity> RankForToken(std::string_view token) const override {
    auto it = ranks_.find(std::string(token));
    if (it == ranks_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<RankIdentity> RankForLaunch(uint64_t launch_id) const override {
    for (const auto& [token, rank] : ranks_) {
      if (rank.launch_id == launch_id) return rank;
    }
    return std::nullopt;
  }
  // Give each rank its own launch_id when RankForLaunch matters.
  std::map<std::string, RankIdentity> ranks_;
};

}  // namespace loom::agent::testing
