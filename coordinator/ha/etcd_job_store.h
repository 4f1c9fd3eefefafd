// The JobStore in etcd (--state=etcd://...): the same records as the SQLite
// store, one key per job (<prefix>/jobs/<id>, the serialized loom.v1.Job),
// plus <prefix>/meta/max_seq, and a job's steps one key per chunk
// (<prefix>/steps/<id>/<chunk, ten digits>, a loom.v1.JobSteps). Every write is
// one etcd transaction guarded by the writer's leadership
// (LeaderElection::Fence()): a coordinator whose term ended gets FencedError
// and changes nothing. A write acknowledged by etcd is on a majority of its
// members' disks.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/ha/etcd_client.h"
#include "coordinator/jobs/job_store.h"

namespace loom::coordinator::ha {

class EtcdJobStore final : public JobStore {
 public:
  // fence: the compare every write carries (LeaderElection::Fence()).
  EtcdJobStore(EtcdClient* etcd, std::string prefix, etcdserverpb::Compare fence);

  // One transaction when it fits etcd's limits per transaction (128
  // operations, 1.5 MiB by default); larger batches are split, each part all
  // or none.
  absl::Status Write(const JobWrite& write) override;
  absl::StatusOr<std::vector<loom::v1::Job>> LoadAll() override;
  absl::StatusOr<std::map<std::string, StoredSteps>> LoadSteps() override;
  absl::Status Delete(const std::vector<std::string>& ids) override;
  absl::StatusOr<int64_t> MaxSequence() override;

 private:
  // Runs ops in one transaction guarded by the fence.
  absl::Status Commit(std::vector<etcdserverpb::RequestOp> ops, const std::string& what);
  std::string JobKey(const std::string& id) const { return jobs_prefix_ + id; }
  std::string StepsPrefix(const std::string& id) const { return steps_prefix_ + id + "/"; }
  std::string ChunkKey(const std::string& id, int64_t index) const;

  EtcdClient* const etcd_;
  const std::string jobs_prefix_;    // <prefix>/jobs/
  const std::string steps_prefix_;   // <prefix>/steps/
  const std::string max_seq_key_;    // <prefix>/meta/max_seq
  const etcdserverpb::Compare fence_;
};

}  // namespace loom::coordinator::ha
