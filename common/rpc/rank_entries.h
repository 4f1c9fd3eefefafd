// Rank entries of the rendezvous store (docs/fault_tolerance.md, "In-place
// recovery"): keys "loom/rank/<r>/<name>" hold what rank r publishes about
// its process (an address it keeps for its life), and only rank r may write
// them. When an attempt is placed in place, the coordinator opens its
// namespace with the surviving ranks' entries carried over from the attempt
// that failed and the join count kJoinedKey already at the number of
// survivors: only the relaunched ranks register anew (their entries, one add
// each), and the rank whose add makes the count the world size knows every
// rank is in. Any other key starts empty in every attempt, so what a
// communicator exchanges for its own connections (Gloo's pair addresses,
// NCCL's unique ids) is never carried. A wire contract, hence here and not in
// either program's code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>


namespace loom::rpc {

inline constexpr std::string_view kRankEntryPrefix = "loom/rank/";
// How many ranks have registered in the attempt (survivors carried count).
inline constexpr std::string_view kJoinedKey = "loom/joined";

inline std::string RankEntryKey(int32_t rank, std::string_view name) {
  return std::string(kRankEntryPrefix) + std::to_string(rank) + "/" + std::string(name);
}

// The rank a key is an entry of; nullopt for a key that is not a rank entry
// ("loom/rank/<r>/<name>" with r a rank number and a name).
inline std::optional<int32_t> RankOfEntry(std::string_view key) {
  if (key.substr(0, kRankEntryPrefix.size()) != kRankEntryPrefix) return std::nullopt;
  key.remove_prefix(kRankEntryPrefix.size());
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == key.size()) {
    return std::nullopt;
  }
  // Decimal digits only, at most 9 of them (no sign, no overflow).
  if (slash > 9) return std::nullopt;
  int32_t rank = 0;
  for (char c : key.substr(0, slash)) {
    if (c < '0' || c > '9') return std::nullopt;
    rank = rank * 10 + (c - '0');
  }
  return rank;
}

}  // namespace loom::rpc
