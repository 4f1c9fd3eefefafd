// Live nodes: who is connected, what devices they have, when they last spoke,
// and the channel to send them commands. Soft state: rebuilt from the sessions
// that (re)connect after a coordinator restart.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/cluster/heartbeat_lag.h"
#include "coordinator/cluster/liveness_board.h"
#include "common/liveness/beat_datagram.h"
#include "loom/v1/node.pb.h"

namespace loom::coordinator {

// Where commands to a node go: the session stream of its agent.
class NodeChannel {
 public:
  virtual ~NodeChannel() = default;
  virtual void Send(const loom::v1::CoordinatorMessage& message) = 0;
  // What this session's agent may beat with on the liveness path (sent in
  // Registered); null: it has none and is heard on the session only.
  virtual const liveness::Grant* liveness_grant() const { return nullptr; }
};

struct NodeInfo {
  std::string node_id;
  std::string hostname;
  std::string address;
  std::string device_kind;  // cpu | gpu
  int32_t device_count = 0;
  std::string device_name;
  int64_t device_memory_bytes = 0;
  double peak_flops_per_device = 0;
  bool live = false;
  // Its agent's session is open. A node whose session ended stays live (and
  // keeps its ranks) until it has been silent for the node timeout: its
  // agent reconnects within that time after a transient break, and until its
  // lease ran out its ranks may still act (docs/fault_tolerance.md,
  // "Fencing"). No new ranks go to a node that is not connected.
  bool connected = false;
  bool cordoned = false;
  // A cluster spare (RegisterNode.spare): the scheduler places no job on it;
  // in-place recovery relaunches failed ranks on it.
  bool spare = false;
  // Drained (loomctl drain, or its agent shutting down): cordoned, takes no
  // new ranks at all (a cordon alone only makes it a last resort), and the
  // cordon does not expire; until uncordoned.
  bool draining = false;
  // RegisterNode.labels (loom-worker --labels): placement reads rack and
  // nvlink_domain (common/topology/node_labels.h).
  std::map<std::string, std::string> labels;
  std::string cordon_reason;
  absl::Time cordoned_at = absl::InfinitePast();
  // When the coordinator last read a message from it (any message: each one
  // proves its agent alive).
  absl::Time last_seen;
  std::vector<loom::v1::RunningRank> running;
};

// Totals over the registry, taken without copying any node.
struct NodeCounts {
  int live = 0;
  int cordoned = 0;
  std::map<std::string, int64_t> live_devices;  // by kind
  std::map<std::string, int64_t> all_devices;   // by kind, live or not
};

class NodeRegistry {
 public:
  // Where the liveness path records beats (liveness_board.h): the registry
  // tells it which session of each node counts, and a beat accepted there
  // makes its node heard as a message on the session does. Set before
  // serving; without one only the sessions are heard.
  void SetLivenessBoard(LivenessBoard* board) { board_ = board; }

  // A node came (back): replaces any earlier session of the same node.
  // Register, unless another session still holds this node id and has been
  // heard from within `alive` (a second session must not replace a live
  // node's; one silent that long is a half-open leftover and is replaced).
  // Returns whether it registered.
  bool RegisterIfFree(const loom::v1::RegisterNode& registration,
                      std::shared_ptr<NodeChannel> channel, absl::Time now, absl::Duration alive);
  void Register(const loom::v1::RegisterNode& registration, std::shared_ptr<NodeChannel> channel,
                absl::Time now);
  enum class HeartbeatResult {
    kAlive,     // the node's current session, live
    kRevived,   // the current session of a node lost for silence: live again
    kOrphaned,  // not the current session, but the current one is gone (another
                // session took the node over and left): this one may register again
    kStale,     // not the current session, and the current one is live: ignored
  };
  // A heartbeat on one of a node's sessions. A node lost for silence while its
  // session stayed open (the coordinator or the network had stalled) is live
  // again at the first heartbeat on that session.
  HeartbeatResult Heartbeat(const std::string& node_id, const NodeChannel* channel,
                            const loom::v1::Heartbeat& heartbeat, absl::Time now);
  // The session ended. The node is not lost for it: it stays live, without a
  // channel (commands to it are dropped), until ExpireSilent finds it silent
  // for the node timeout, unless its agent registers again first. Only the
  // channel that is still current counts, so a stale session closing after a
  // reconnect changes nothing. Returns true when the node's current session
  // ended.
  bool SessionClosed(const std::string& node_id, const NodeChannel* channel);
  // The coordinator read a message on the node's current session and is
  // handling it: the node was heard from now, and while the message is
  // handled (the session reads nothing else) its silence does not count.
  // MessageHandled: the session listens again; silence counts from now.
  // Messages on a session that is not the node's current one change nothing.
  void MessageRead(const std::string& node_id, const NodeChannel* channel, absl::Time now);
  void MessageHandled(const std::string& node_id, const NodeChannel* channel, absl::Time now);
  // A beat accepted on the liveness path counts as a message read then.
  // Nodes silent for longer than timeout plus the heartbeat backlog (or plus
  // their own last heartbeat's lag, if larger; at most a minute more) are
  // marked lost, whether their session is still open or ended; returns their
  // ids. The backlog (heartbeat_lag.h) is how late
  // heartbeats are being read: a node's newer heartbeats may wait unread
  // behind the coordinator's own work (a launch burst), and it is not lost
  // for that. Silence is the time the coordinator spent listening to the
  // node and hearing nothing: it starts at the node's last message or when
  // the session last finished handling one, whichever is later, and a node
  // whose message is being handled is not silent (for at most a minute: a
  // handler stuck longer is not the node's fault either, but a coordinator
  // that far behind cannot vouch for anyone).
  std::vector<std::string> ExpireSilent(absl::Time now, absl::Duration timeout);
  // The 90th percentile of the lags of the heartbeats read in the last 2 s.
  absl::Duration HeartbeatBacklog(absl::Time now);

  bool Send(const std::string& node_id, const loom::v1::CoordinatorMessage& message);
  std::optional<NodeInfo> Get(const std::string& node_id) const;
  std::vector<NodeInfo> LiveNodes() const;
  std::vector<NodeInfo> AllNodes() const;
  // What the node gauges and the scheduler's capacity need: copying every
  // node with its running ranks cost milliseconds per call at 2,048 nodes,
  // once per registration and per second (docs/scale.md).
  NodeCounts Counts() const;
  // Marks a node unfit for new ranks; returns true if it was not cordoned yet.
  bool Cordon(const std::string& node_id, const std::string& reason,
              absl::Time now = absl::Now());
  // Drains a known node: cordoned with the reason, draining. NOT_FOUND for
  // a node never seen.
  absl::Status Drain(const std::string& node_id, const std::string& reason,
                     absl::Time now = absl::Now());
  // Lifts a cordon (and a drain): NOT_FOUND for an unknown node, FAILED_PRECONDITION when
  // the node is not cordoned.
  absl::Status Uncordon(const std::string& node_id);
  // Lifts the cordons older than ttl; returns the nodes uncordoned.
  std::vector<std::string> ExpireCordons(absl::Time now, absl::Duration ttl);

 private:
  // The node's entry; NOT_FOUND naming it for a node never seen.
  absl::StatusOr<NodeInfo*> KnownLocked(const std::string& node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Not cordoned, not drained, no reason.
  static void ClearCordon(NodeInfo& info);
  struct Entry;
  // Tells the board whether the entry's session counts its beats: only the
  // current session of a live node.
  void SyncBoardLocked(const std::string& node_id, const Entry& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterLocked(const loom::v1::RegisterNode& registration,
                      std::shared_ptr<NodeChannel> channel, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Entry {
    NodeInfo info;
    std::shared_ptr<NodeChannel> channel;
    SessionLag lag;  // of the current session's heartbeats
    absl::Duration last_lag;  // of its last heartbeat
    // MessageRead/MessageHandled: since when a message of the current
    // session is being handled (InfinitePast: none), and when the session
    // last began listening again.
    absl::Time handling_since = absl::InfinitePast();
    absl::Time listening_since = absl::InfinitePast();
  };
  LivenessBoard* board_ = nullptr;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> nodes_ ABSL_GUARDED_BY(mu_);
  HeartbeatLag backlog_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator
