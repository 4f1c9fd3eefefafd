// NodeService: one bidirectional session per node agent (callback API).
// Registration, heartbeats, rank exits and the ranks' progress batches go to
// the NodeRegistry and the JobManager; launch and kill commands come back down
// the same stream. Only a node certificate may open a session, register only
// under its own name, and only while no other live session holds that name.
// A session that ends does not lose its node: the liveness tick does, once
// the node has been silent for the node timeout.
#pragma once

#include <atomic>

#include "absl/time/time.h"
#include "coordinator/cluster/node_limits.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/service/caller_identity.h"
#include "coordinator/service/log_relay.h"
#include "coordinator/service/trace_relay.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::coordinator {

class CoordinatorMetrics;

class NodeServiceImpl final : public loom::v1::NodeService::CallbackService {
 public:
  NodeServiceImpl(NodeRegistry* nodes, JobManager* jobs, CoordinatorMetrics* metrics,
                  absl::Duration heartbeat_interval, const CallerAuth* auth)
      : nodes_(nodes),
        jobs_(jobs),
        metrics_(metrics),
        heartbeat_interval_(heartbeat_interval),
        auth_(auth) {}

  grpc::ServerBidiReactor<loom::v1::NodeMessage, loom::v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

  // Publishes live nodes and devices to the metrics.
  void UpdateNodeGauges();
  // Counts progress reports refused for ranks a node does not run.
  void CountProgressRefused(int64_t reports);
  // What a registration may claim (docs/limits.md); set before serving.
  void SetNodeLimits(const NodeLimits& limits) { limits_ = limits; }
  const NodeLimits& node_limits() const { return limits_; }
  // The agents' lease (Registered.lease_ms; docs/fault_tolerance.md,
  // "Fencing"): the node timeout, so an agent cut off pauses its ranks before
  // its node can be declared lost. Zero (the default): no lease. Set before
  // serving.
  void SetAgentLease(absl::Duration lease) { agent_lease_ = lease; }
  absl::Duration agent_lease() const { return agent_lease_; }
  // How long a node may be silent (its session ended, or no heartbeat)
  // before it is lost; for log lines. Set before serving.
  void SetNodeTimeout(absl::Duration timeout) { node_timeout_ = timeout; }
  absl::Duration node_timeout() const { return node_timeout_; }
  // Where the agents' RankLogChunk answers go (`loomctl logs`); null: they
  // are dropped. Set before serving.
  void SetLogRelay(LogRelay* relay) { log_relay_ = relay; }
  LogRelay* log_relay() const { return log_relay_; }
  // Where the ranks' recorded steps go (`loomctl trace`); null: dropped.
  // Set before serving.
  void SetTraceRelay(TraceRelay* relay) { trace_relay_ = relay; }
  TraceRelay* trace_relay() const { return trace_relay_; }
  // The UDP port of the liveness path (liveness_listener.h), told to each
  // agent with a grant of its session's own; 0 (the default): none. Set
  // before serving.
  void SetLivenessPort(int port) { liveness_port_.store(port); }
  int liveness_port() const { return liveness_port_.load(); }

 private:
  NodeRegistry* nodes_;
  JobManager* jobs_;
  CoordinatorMetrics* metrics_;
  absl::Duration heartbeat_interval_;
  const CallerAuth* auth_;
  NodeLimits limits_;
  absl::Duration agent_lease_ = absl::ZeroDuration();
  absl::Duration node_timeout_ = absl::Seconds(5);
  LogRelay* log_relay_ = nullptr;
  TraceRelay* trace_relay_ = nullptr;
  std::atomic<int> liveness_port_{0};  // set once the listener is bound, while serving
};

}  // namespace loom::coordinator
