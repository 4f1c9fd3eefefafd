// loom-loadgen's fault: one rank crashed, or one node lost with its ranks,
// while the job runs; then how the coordinator recovered, as the simulated
// ranks lived it and as the job's incident records it:
//  * the path (in place or the whole job, and why), the relaunched ranks;
//  * the time from the detection (the coordinator's declaration, the
//    incident's declared_unix_us) to every rank of the next attempt past its
//    next step (its first step report past the attempt's base, as sent), and
//    to every rank resumed; the incident's own phases;
//  * the coordinator's CPU from the declaration to then (its /proc samples);
//  * the messages each way in that time, by kind;
//  * correctness: the recovery completed, no rank of the old attempt
//    reported after its node was told of the new one or is left behind, no
//    restore asked of a rank that cannot do it, no survivor skipped.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "loom/v1/job.pb.h"
#include "tools/loadgen/cluster_stats.h"
#include "tools/loadgen/coordinator_probe.h"
#include "tools/loadgen/fake_cluster.h"

namespace loom::loadgen {

struct FaultPlan {
  enum Kind { kCrash, kNode };
  Kind kind = kCrash;
  int rank = 0;  // the rank crashed, or a rank of the node lost
  std::string job_id;
  absl::Duration wait = absl::Seconds(120);  // for every rank past its next step
  bool expect_in_place = false;              // the run is wrong unless the path is in place
  // perf record -g of the coordinator from the fault until every rank is past
  // its next step, into this file (empty: none).
  std::string perf_out;
  int coordinator_pid = 0;
};

const char* FaultKindName(FaultPlan::Kind kind);

struct FaultOutcome {
  std::string lost_node;     // kNode: the node's id
  std::set<int32_t> failed;  // the ranks that died
  int32_t failed_attempt = 0;
  int32_t next_attempt = 0;
  bool recovered = false;  // every rank of a later attempt past its next step
  absl::Time fault_at;
  absl::Time all_resumed = absl::InfiniteFuture();
  absl::Time all_past_next_step = absl::InfiniteFuture();
  bool have_incident = false;
  loom::v1::RecoveryIncident incident;
  double cpu_seconds = -1;            // the coordinator's, declaration -> all past
  MessageCounts messages;             // fault -> all past
  int ranks_behind = 0;               // live ranks left in an older attempt at the end
  int64_t stale_reports = 0;          // ClusterStats::stale_reports, the whole run
  std::vector<std::string> failures;  // what was wrong

  absl::Time declared() const;
  // Seconds from the declaration (-1: unknown).
  double DeclaredTo(absl::Time t) const;
  // Seconds from the fault to the declaration (-1: unknown).
  double FaultToDeclared() const;
};

// Injects the fault and waits for the recovery; probe must be watching the
// job. Never fails the process: what was wrong is in failures.
FaultOutcome RunFault(FakeCluster& cluster, CoordinatorProbe& probe, const FaultPlan& plan);

// The outcome's lines for loadgen's report, and its RESULT fields.
void PrintFault(const FaultPlan& plan, const FaultOutcome& outcome, double steady_cpu_fraction);
std::string FaultResultFields(const FaultPlan& plan, const FaultOutcome& outcome);

}  // namespace loom::loadgen
