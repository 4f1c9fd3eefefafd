// The upper bounds of a job spec's sizes (job_spec_limits.h); the lower
// bounds and the cross-field rules are in job_spec_rules.cc.
#include "common/spec/job_spec_limits.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace loom::spec {
namespace {

class Bounds {
 public:
  template <typename T>
  void AtMost(const std::string& field, T value, T limit) {
    if (value > limit) errors_.push_back(absl::StrCat(field, "=", value, " must be at most ", limit));
  }
  void Within(const std::string& field, int64_t value, int64_t low, int64_t high) {
    if (value < low || value > high) {
      errors_.push_back(absl::StrCat(field, "=", value, " must be between ", low, " and ", high));
    }
  }
  void Axis(const char* name, const std::optional<int64_t>& value, int64_t limit) {
    if (value) AtMost(absl::StrCat("parallelism.", name), *value, limit);
  }
  void Path(const char* field, const std::string& path, int64_t limit) {
    if (static_cast<int64_t>(path.size()) > limit) {
      errors_.push_back(absl::StrCat(field, " is ", path.size(), " bytes long; it must be at most ",
                                     limit));
    }
  }
  std::vector<std::string> Take() { return std::move(errors_); }

 private:
  std::vector<std::string> errors_;
};

}  // namespace

const JobSpecLimits& DefaultJobSpecLimits() {
  static const JobSpecLimits limits;
  return limits;
}

std::vector<std::string> CheckJobSpecLimits(const JobSpec& s, const JobSpecLimits& l) {
  Bounds b;
  b.AtMost("model.vocab_size", s.model.vocab_size, l.max_vocab_size);
  b.AtMost("model.hidden_size", s.model.hidden_size, l.max_hidden_size);
  b.AtMost("model.num_layers", s.model.num_layers, l.max_num_layers);
  b.AtMost("model.num_heads", s.model.num_heads, l.max_num_heads);
  b.AtMost("model.num_kv_heads", s.model.num_kv_heads, l.max_num_heads);
  b.AtMost("model.ffn_hidden_size", s.model.ffn_hidden_size, l.max_ffn_hidden_size);
  b.AtMost("model.max_seq_len", s.model.max_seq_len, l.max_seq_len);
  const MoeSpec& e = s.model.moe;
  b.AtMost("model.moe.num_experts", e.num_experts, l.max_num_experts);
  b.AtMost("model.moe.top_k", e.top_k, l.max_num_experts);
  b.AtMost("model.moe.num_shared_experts", e.num_shared_experts, l.max_num_experts);
  b.AtMost("model.moe.expert_ffn_hidden_size", e.expert_ffn_hidden_size, l.max_ffn_hidden_size);
  b.AtMost("model.moe.first_dense_layers", e.first_dense_layers, l.max_num_layers);
  b.AtMost("model.moe.aux_loss_coef", e.aux_loss_coef, 1e6);
  b.AtMost("model.moe.bias_update_rate", e.bias_update_rate, 1e6);
  if (e.capacity_factor) b.AtMost("model.moe.capacity_factor", *e.capacity_factor, 1e6);
  b.AtMost("train.steps", s.train.steps, l.max_steps);
  b.AtMost("train.warmup_steps", s.train.warmup_steps, l.max_steps);
  b.AtMost("train.eval_interval", s.train.eval_interval, l.max_steps);
  b.AtMost("train.global_batch_size", s.train.global_batch_size, l.max_global_batch_size);
  b.AtMost("train.micro_batch_size", s.train.micro_batch_size, l.max_global_batch_size);
  b.AtMost("train.seq_len", s.train.seq_len, l.max_seq_len);
  b.AtMost("train.eval_windows", s.train.eval_windows, l.max_eval_windows);
  b.Path("data.train_path", s.data.train_path, l.max_path_bytes);
  b.Path("data.val_path", s.data.val_path, l.max_path_bytes);
  const ParallelismSpec& p = s.parallelism;
  b.Axis("dp", p.dp, l.max_ranks);
  b.Axis("tp", p.tp, l.max_ranks);
  b.Axis("pp", p.pp, l.max_ranks);
  b.Axis("cp", p.cp, l.max_ranks);
  b.Axis("ep", p.ep, l.max_ranks);
  b.AtMost("parallelism.virtual_stages", p.virtual_stages, l.max_virtual_stages);
  b.AtMost("parallelism.bucket_mb", p.bucket_mb, l.max_bucket_mb);
  const ResourcesSpec& r = s.resources;
  if (r.device == DeviceKind::kCpu) {
    b.AtMost("resources.ranks", r.ranks, l.max_ranks);
    b.AtMost("resources.memory_mb", r.memory_mb, int64_t{1} << 30);  // 1 PiB
  } else {
    b.AtMost("resources.gpus_per_node", r.gpus_per_node, l.max_gpus_per_node);
    b.AtMost("resources.host_memory_mb", r.host_memory_mb, int64_t{1} << 30);  // 1 PiB
    b.AtMost("resources.nodes", r.nodes, l.max_ranks);
    // Both factors are bounded above, so the product cannot overflow.
    if (r.nodes <= l.max_ranks && r.gpus_per_node <= l.max_gpus_per_node) {
      b.AtMost("resources.nodes x resources.gpus_per_node", r.world_size(), l.max_ranks);
    }
  }
  b.AtMost("resources.spares", r.spares, l.max_ranks);
  b.Path("checkpoint.dir", s.checkpoint.dir, l.max_path_bytes);
  b.AtMost("checkpoint.interval", s.checkpoint.interval, l.max_steps);
  b.AtMost("checkpoint.keep", s.checkpoint.keep, l.max_checkpoint_keep);
  const FaultToleranceSpec& f = s.fault_tolerance;
  b.AtMost("fault_tolerance.max_restarts", f.max_restarts, l.max_restarts);
  if (f.max_hang_restarts) {
    b.AtMost("fault_tolerance.max_hang_restarts", *f.max_hang_restarts, l.max_restarts);
  }
  if (f.max_node_restarts) {
    b.AtMost("fault_tolerance.max_node_restarts", *f.max_node_restarts, l.max_restarts);
  }
  b.AtMost("fault_tolerance.cordon_after", f.cordon_after, l.max_restarts);
  b.AtMost("fault_tolerance.hang_timeout_s", f.hang_timeout_s, l.max_seconds);
  b.AtMost("fault_tolerance.restart_backoff_s", f.restart_backoff_s, l.max_seconds);
  b.AtMost("fault_tolerance.snapshot_interval", f.snapshot_interval, l.max_steps);
  b.AtMost("fault_tolerance.abort_timeout_s", f.abort_timeout_s, l.max_seconds);
  b.AtMost("fault_tolerance.loss_spike_window", f.loss_spike_window, l.max_steps);
  b.AtMost("fault_tolerance.max_bad_steps", f.max_bad_steps, l.max_steps);
  b.Within("scheduling.priority", s.scheduling.priority, -l.max_priority, l.max_priority);
  b.AtMost("scheduling.max_runtime_s", s.scheduling.max_runtime_s, l.max_runtime_s);
  return b.Take();
}

}  // namespace loom::spec
