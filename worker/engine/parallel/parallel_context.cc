#include "worker/engine/parallel/parallel_context.h"

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

comm::Communicator* NullIfAlone(comm::Communicator* group) {
  return group != nullptr && group->size() > 1 ? group : nullptr;
}

}  // namespace

absl::StatusOr<ParallelContext> ParallelContext::Make(int dp_rank, int dp_size,
                                                      comm::Communicator* dp,
                                                      comm::Communicator* tp,
                                                      comm::Communicator* pp,
                                                      comm::Communicator* cp,
                                                      comm::Communicator* dp_cp,
                                                      comm::Communicator* ep) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dp rank ", dp_rank, " of ", dp_size, " is not a valid data-parallel coordinate"));
  }
  if (dp_size > 1 && (dp == nullptr || dp->size() != dp_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp size ", dp_size, " needs a DP communicator of that size"));
  }
  if (dp_size > 1 && dp->rank() != dp_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dp rank ", dp_rank, " but the DP communicator's rank is ", dp->rank()));
  }
  ParallelContext ctx;
  cp = NullIfAlone(cp);
  if (cp != nullptr) {  // [cp] gradients are reduced over DP x CP
    if (dp_cp == nullptr && dp_size == 1) dp_cp = cp;
    if (dp_cp == nullptr || dp_cp->size() != dp_size * cp->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cp size ", cp->size(), " with dp size ", dp_size, " needs a DP x CP communicator of ",
          dp_size * cp->size(), " ranks", dp_cp == nullptr ? " (none given)" : ""));
    }
    // Its rank 0 is the replicas' writer, which the checkpoint's broadcasts
    // take as their root.
    if ((dp_cp->rank() == 0) != (dp_rank == 0 && cp->rank() == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the DP x CP communicator's rank 0 must be dp rank 0 and cp rank 0 (this rank: dp ",
          dp_rank, ", cp ", cp->rank(), ", dp_cp ", dp_cp->rank(), ")"));
    }
    ctx.cp = cp;
    ctx.dp_cp = dp_cp;
  }
  ctx.dp = dp_size > 1 ? dp : nullptr;
  ctx.tp = NullIfAlone(tp);
  ctx.pp = NullIfAlone(pp);
  ctx.ep = NullIfAlone(ep);
  ctx.dp_rank = dp_rank;
  ctx.dp_size = dp_size;
  return ctx;
}

std::vector<comm::Communicator*> ParallelContext::GradientNormGroups(bool dp_sharded) const {
  std::vector<comm::Communicator*> groups;
  if (dp_sharded && grad_group() != nullptr) groups.push_back(grad_group());
  if (tp != nullptr) groups.push_back(tp);
  if (pp != nullptr) groups.push_back(pp);
  if (ep != nullptr) groups.push_back(ep);
  return groups;
}

absl::Status CheckContextMatchesSpec(const ParallelContext& ctx, const spec::JobSpec& spec) {
  const spec::ParallelismSpec& p = spec.parallelism;
  const struct {
    const char* axis;
    const char* group_name;
    comm::Communicator* group;
    int64_t want;
  } axes[] = {{"tp", "tensor-parallel", ctx.tp, p.tp.value_or(1)},
              {"pp", "pipeline-parallel", ctx.pp, p.pp.value_or(1)},
              {"cp", "context-parallel", ctx.cp, p.cp.value_or(1)},
              {"ep", "expert-parallel", ctx.ep, p.ep.value_or(1)}};
  for (const auto& a : axes) {
    if (a.group != nullptr && a.want != a.group->size()) {
      return absl::InvalidArgumentError(absl::StrCat("parallelism.", a.axis, "=", a.want, " but the ",
                                                     a.group_name, " group has ", a.group->size(),
                                                     " ranks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
