// loom-loadgen --jobs=N: the scheduling policies at scale through a real
// coordinator (docs/scale.md, "Scheduling a shared cluster at scale"). Fake
// nodes (sched_node.h, labelled by rack and NVLink domain) register over
// mutual TLS; an admin sets two users' GPU quotas through QuotaService; N jobs
// of mixed sizes and priorities (sched_workload.h) are submitted by 10 users,
// each with a certificate of its own, as fast as the coordinator takes them;
// their ranks run a short fake time and exit. When every job has ended, the
// run reads each job's history and checks every rule (sched_checks.h), and
// prints what it measured and a RESULT line.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tools/loadgen/node_certs.h"
#include "tools/loadgen/sched_workload.h"

namespace loom::loadgen {

struct SchedRunOptions {
  std::string coordinator;  // HOST:PORT
  int nodes = 256;
  int gpus_per_node = 8;
  int nodes_per_rack = 16;          // labels rack=r<i / nodes_per_rack>
  int nodes_per_nvlink_domain = 2;  // labels nvlink_domain=d<i / nodes_per_nvlink_domain>
  std::string node_prefix = "lg";
  SchedWorkloadOptions workload;               // devices is set from the nodes
  absl::Duration timeout = absl::Minutes(10);  // for every job to end
};

// 0: every rule held; 1: a violation or the run did not finish; 2: setup failed.
int RunScheduling(SchedRunOptions options, NodeCertFactory& certs,
                  std::shared_ptr<grpc::Channel> admin);

}  // namespace loom::loadgen
