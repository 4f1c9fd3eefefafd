// The bounds of a job attempt's rendezvous store: what the coordinator's
// store (coordinator/rendezvous/kv_store.h) accepts by default and what a
// node agent checks before relaying a rank's call (worker/agent/store_relay.h),
// so both answer an oversized request the same way. A wire contract, hence here
// and not in either program's code.
#pragma once

#include <cstdint>

namespace loom::rpc {

struct StoreQuotas {
  int64_t max_keys = 65536;                         // per namespace
  int64_t max_key_bytes = 1024;
  int64_t max_value_bytes = 1 << 20;                // 1 MiB
  int64_t max_namespace_bytes = int64_t{64} << 20;  // keys and values, 64 MiB
  int64_t max_waiters = 65536;                      // gets waiting in one namespace
};

// A StoreBatch (RankService) carries at most this many ops; a node agent
// never sends more (worker/agent/store_relay.h), the coordinator refuses more.
inline constexpr int kMaxStoreBatchOps = 1024;
// And at most this many bytes of keys and values in all, well under the
// 16 MiB message bound (rpc_settings.h); one op (StoreQuotas' key and value
// bounds) always fits.
inline constexpr int64_t kMaxStoreBatchBytes = int64_t{8} << 20;

}  // namespace loom::rpc
