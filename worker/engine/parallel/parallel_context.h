// One rank's place in the device mesh and the groups it talks over, built once
// (by the coordinated trainer from its assignment's groups, by standalone and
// test code from a layout) and handed to everything that communicates: the
// model (TP), the data-parallel engine (DP and its ZeRO stage), the pipeline
// executor (PP), gradient clipping and checkpoints. Each axis is one optional
// group; a combination of axes is a context with several of them set, never a
// code path of its own. docs/architecture.md draws it.
//
// A group of one rank is held as null ("no such axis"), so `ctx.tp != nullptr`
// means "tensor parallel". Context parallelism (docs/context_parallel.md) is
// the `cp` group plus `dp_cp`, the DP x CP group over which the gradients of
// the weights (replicated over both) are reduced and ZeRO shards.
//
// EP (docs/expert_parallel.md): `ep` splits each MoE layer's experts, and its
// ranks read different data, so for everything but the experts it is more
// data parallelism: the data rank is (dp_rank, ep_rank), dense gradients and
// the loss are summed over dp (DP x CP under CP) and then ep, expert gradients
// over dp alone (the expert-data-parallel group: the DP group holds the same
// experts). CP ranks share their sequences, so CP is not a data axis. A job
// does not combine CP with EP yet (CheckEngineRuns refuses it).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/comm/communicator.h"

namespace loom::engine {

struct ParallelContext {
  comm::Communicator* dp = nullptr;  // the ranks with the same model part, other data
  comm::Communicator* tp = nullptr;  // the ranks that split one layer's tensors
  comm::Communicator* pp = nullptr;  // the pipeline's stages (rank = stage)
  comm::Communicator* cp = nullptr;  // the ranks that split one sequence (rank = zigzag rank)
  comm::Communicator* dp_cp = nullptr;  // DP x CP; null without CP
  comm::Communicator* ep = nullptr;  // the ranks that split the experts (and read other data)
  int dp_rank = 0;
  int dp_size = 1;

  // Validates and normalizes: groups of one become null; dp_size > 1 needs a
  // DP group of that size (whose rank is then dp_rank); a CP group needs a
  // DP x CP group of dp_size x cp ranks whose rank 0 is DP rank 0 and CP
  // rank 0 (with dp_size 1 it may be omitted: it is then the CP group).
  // INVALID_ARGUMENT naming what is wrong.
  static absl::StatusOr<ParallelContext> Make(int dp_rank, int dp_size, comm::Communicator* dp,
                                              comm::Communicator* tp = nullptr,
                                              comm::Communicator* pp = nullptr,
                                              comm::Communicator* cp = nullptr,
                                              comm::Communicator* dp_cp = nullptr,
                                              comm::Communicator* ep = nullptr);

  int tp_size() const { return tp != nullptr ? tp->size() : 1; }
  int tp_rank() const { return tp != nullptr ? tp->rank() : 0; }
  int pp_size() const { return pp != nullptr ? pp->size() : 1; }
  int stage() const { return pp != nullptr ? pp->rank() : 0; }
  int ep_size() const { return ep != nullptr ? ep->size() : 1; }
  int ep_rank() const { return ep != nullptr ? ep->rank() : 0; }
  // Which share of the global batch this rank reads: DP and EP ranks all read
  // different micro-batches (the mesh's order, ep inside dp).
  int data_rank() const { return dp_rank * ep_size() + ep_rank(); }
  int data_size() const { return dp_size * ep_size(); }
  // The groups a sum over the data crosses (the loss), in this order; null
  // entries are axes this rank does not have.
  std::vector<comm::Communicator*> DataGroups() const { return {dp, ep}; }
  bool first_stage() const { return stage() == 0; }
  bool last_stage() const { return stage() == pp_size() - 1; }
  int cp_size() const { return cp != nullptr ? cp->size() : 1; }
  int cp_rank() const { return cp != nullptr ? cp->rank() : 0; }
  // The group over which the gradients of replicated weights are summed and
  // ZeRO partitions its shards: DP x CP under context parallelism, else DP.
  comm::Communicator* grad_group() const { return dp_cp != nullptr ? dp_cp : dp; }
  // The one rank of its DP x CP replicas that writes what they all hold
  // (CP ranks hold the same weights, as DP ranks do).
  bool replica_writer() const { return dp_rank == 0 && cp_rank() == 0; }

  // Whether this rank writes a checkpoint piece it holds: of the ranks that
  // hold the same values along a replicated axis, the lowest writes. DP and
  // CP replicate everything but what ZeRO shards over them (dp_sharded: the
  // shards are over grad_group(), DP x CP under CP, so every rank's is its
  // own); TP replicates a slice held by `tp_replicas` consecutive ranks (norm
  // weights, kv heads the TP size does not divide); EP replicates the dense
  // tensors and splits the routed experts (ep_sharded: each EP rank holds its
  // own, under their global names). A new replicated axis adds its term here.
  bool writes_shards(bool dp_sharded, int tp_replicas = 1, bool ep_sharded = false) const {
    return (dp_sharded || replica_writer()) && tp_rank() % tp_replicas == 0 &&
           (ep_sharded || ep_rank() == 0);
  }
  // Every axis's group, innermost first (null: an axis of one rank), in the
  // coordinator's rank order (pp x dp x ep x cp x tp, tp fastest): the mesh a
  // checkpoint's control values cross (checkpoint/distributed_save.h). Each
  // rank is in exactly one group of each, so dp_cp (DP x CP, the product of
  // two of them) is not one. A new axis adds its group here.
  std::vector<comm::Communicator*> MeshGroups() const { return {tp, cp, ep, dp, pp}; }

  // The groups whose ranks hold different parts of one gradient, over which
  // a norm's sums of squares add up: TP and PP always, DP (DP x CP under
  // CP) when the reduced gradient is sharded over it (ZeRO >= 2), EP always
  // (its ranks hold other experts; dense pieces then count 1/ep,
  // ep_gradients.h).
  std::vector<comm::Communicator*> GradientNormGroups(bool dp_sharded) const;
};

// The context agrees with the spec's layout: each group's size is the spec's
// parallelism.<axis> (when the spec gives it). INVALID_ARGUMENT naming the
// field otherwise. A context without a group ignores that axis of the spec
// (the standalone trainer runs any layout on one rank).
absl::Status CheckContextMatchesSpec(const ParallelContext& ctx, const spec::JobSpec& spec);

}  // namespace loom::engine
