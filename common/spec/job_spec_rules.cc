// Range and cross-field rules of the job spec. Cross-field rules on parallel
// axes are checked only for axes the user set; the planner must respect the
// same rules for the axes it chooses (see planner/).
#include "common/spec/job_spec_rules.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_limits.h"
#include "common/text/safe_text.h"

namespace loom::spec {
namespace {

class Checker {
 public:
  template <typename T>
  void Require(bool ok, const std::string& field, const T& value, const std::string& rule) {
    if (!ok) errors_.push_back(absl::StrCat(field, "=", SafeText(absl::StrCat(value)), " ", rule));
  }
  void Add(std::vector<std::string> broken) {
    for (std::string& e : broken) errors_.push_back(std::move(e));
  }
  std::vector<std::string> Take() { return std::move(errors_); }

 private:
  std::vector<std::string> errors_;
};

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

std::string Axis(const char* name, int64_t v) { return absl::StrCat("parallelism.", name, "=", v); }

// The model's own shape: heads that divide hidden_size with an even head
// dimension (RoPE), kv heads that divide the heads.
void RequireModelShape(Checker& c, const ModelSpec& m) {
  if (m.num_heads >= 1 && m.hidden_size >= 1) {
    c.Require(m.hidden_size % m.num_heads == 0, "model.hidden_size", m.hidden_size,
              absl::StrCat("must be divisible by model.num_heads=", m.num_heads));
    if (m.hidden_size % m.num_heads == 0) {
      c.Require(m.head_dim() % 2 == 0, "model.hidden_size", m.hidden_size,
                absl::StrCat("must give an even head dimension for RoPE (hidden_size/num_heads=",
                             m.head_dim(), ")"));
    }
  }
  if (m.num_kv_heads >= 1 && m.num_heads >= 1) {
    c.Require(m.num_heads % m.num_kv_heads == 0, "model.num_heads", m.num_heads,
              absl::StrCat("must be divisible by model.num_kv_heads=", m.num_kv_heads));
  }

}

// model.moe (docs/moe.md); nothing is checked for a dense model.
void CheckMoe(Checker& c, const ModelSpec& m) {
  const MoeSpec& e = m.moe;
  c.Require(e.num_experts >= 0, "model.moe.num_experts", e.num_experts,
            "must not be negative (0: a dense model)");
  if (!e.enabled()) return;
  c.Require(e.top_k >= 1 && e.top_k <= e.num_experts, "model.moe.top_k", e.top_k,
            absl::StrCat("must be between 1 and model.moe.num_experts=", e.num_experts));
  c.Require(e.expert_ffn_hidden_size >= 0, "model.moe.expert_ffn_hidden_size",
            e.expert_ffn_hidden_size, "must not be negative (0: model.ffn_hidden_size)");
  c.Require(e.num_shared_experts >= 0, "model.moe.num_shared_experts", e.num_shared_experts,
            "must not be negative");
  c.Require(e.first_dense_layers >= 0 && e.first_dense_layers < m.num_layers,
            "model.moe.first_dense_layers", e.first_dense_layers,
            absl::StrCat("must be between 0 and model.num_layers-1=", m.num_layers - 1,
                         " (at least one layer is MoE)"));
  c.Require(e.aux_loss_coef >= 0, "model.moe.aux_loss_coef", e.aux_loss_coef,
            "must not be negative (0: no auxiliary loss)");
  c.Require(e.bias_update_rate >= 0, "model.moe.bias_update_rate", e.bias_update_rate,
            "must not be negative (0: no auxiliary-loss-free bias)");
  if (e.capacity_factor) {
    c.Require(*e.capacity_factor > 0, "model.moe.capacity_factor", *e.capacity_factor,
              "must be positive (leave it out for dropless routing)");
  }
}

}  // namespace

AxisShape AxisShapeOf(const JobSpec& s) {
  return {s.model.num_heads, s.model.num_kv_heads, s.model.ffn_hidden_size, s.model.vocab_size,
          s.model.num_layers, s.train.seq_len, s.model.moe.num_experts};
}

std::vector<std::string> CheckTpSplit(const AxisShape& m, int64_t tp) {
  Checker c;
  if (tp < 1) {
    c.Require(false, "parallelism.tp", tp, "must be positive");
    return c.Take();
  }
  if (tp == 1) return c.Take();
  c.Require(m.num_heads % tp == 0, "model.num_heads", m.num_heads,
            absl::StrCat("must be divisible by ", Axis("tp", tp)));
  c.Require(m.ffn_hidden_size % tp == 0, "model.ffn_hidden_size", m.ffn_hidden_size,
            absl::StrCat("must be divisible by ", Axis("tp", tp)));
  const int64_t kv = m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads;
  if (kv >= 1) {
    c.Require(kv % tp == 0 || tp % kv == 0, "model.num_kv_heads", kv,
              absl::StrCat("must divide or be divisible by ", Axis("tp", tp),
                           " (kv heads are split or replicated)"));
  }
  c.Require(m.vocab_size >= tp, "model.vocab_size", m.vocab_size,
            absl::StrCat("must be at least ", Axis("tp", tp), " (vocabulary-parallel embedding)"));
  return c.Take();
}

std::vector<std::string> CheckPpSplit(const AxisShape& m, int64_t pp, int64_t virtual_stages) {
  Checker c;
  if (pp < 1 || virtual_stages < 1) {
    c.Require(false, "parallelism.pp", pp, "and parallelism.virtual_stages must be positive");
    return c.Take();
  }
  if (pp == 1) return c.Take();
  c.Require(m.num_layers >= pp * virtual_stages, "model.num_layers", m.num_layers,
            absl::StrCat("must be at least ", Axis("pp", pp), " x parallelism.virtual_stages=",
                         virtual_stages, " (one layer per pipeline chunk)"));
  return c.Take();
}

std::vector<std::string> CheckCpSplit(const AxisShape& m, int64_t cp) {
  Checker c;
  if (cp < 1) {
    c.Require(false, "parallelism.cp", cp, "must be positive");
    return c.Take();
  }
  if (cp > 1) {
    c.Require(m.seq_len % (2 * cp) == 0, "train.seq_len", m.seq_len,
              absl::StrCat("must be divisible by 2 x ", Axis("cp", cp),
                           " (load-balanced context parallelism cuts each sequence into 2 x cp "
                           "chunks, rank r holding chunks r and 2 x cp - 1 - r)"));
  }
  return c.Take();
}

std::vector<std::string> CheckEpSplit(const AxisShape& m, int64_t ep) {
  Checker c;
  if (ep == 1) return c.Take();
  if (m.num_experts <= 0) {
    c.Require(false, "parallelism.ep", ep, "must be 1: the model has no experts (model.moe)");
  } else {
    c.Require(ep >= 1 && m.num_experts % ep == 0, "model.moe.num_experts", m.num_experts,
              absl::StrCat("must be divisible by ", Axis("ep", ep),
                           " (each rank holds num_experts / ep experts)"));
  }
  return c.Take();
}

std::vector<std::string> CheckZeroStage(int64_t zero_stage) {
  Checker c;
  if (zero_stage < 0 || zero_stage > 3) {  // (no strings built for a valid one: the search)
    c.Require(false, "parallelism.zero_stage", zero_stage, "must be 0, 1, 2 or 3");
  }
  return c.Take();
}

std::vector<std::string> CheckBatchSplit(int64_t global_batch_size, const Layout& l) {
  Checker c;
  const int64_t mbs = l.micro_batch_size;
  if (l.dp < 1 || l.ep < 1 || mbs < 1) {
    c.Require(mbs >= 1, "train.micro_batch_size", mbs, "must be positive");
    c.Require(l.dp >= 1, "parallelism.dp", l.dp, "must be positive");
    c.Require(l.ep >= 1, "parallelism.ep", l.ep, "must be positive");
    return c.Take();
  }
  if (global_batch_size % (l.dp * l.ep * mbs) == 0) return c.Take();
  if (l.ep == 1) {
    c.Require(false, "train.global_batch_size", global_batch_size,
              absl::StrCat("must be divisible by ", Axis("dp", l.dp),
                           " x train.micro_batch_size=", mbs));
  } else {
    c.Require(false, "train.global_batch_size", global_batch_size,
              absl::StrCat("must be divisible by ", Axis("dp", l.dp), " x ", Axis("ep", l.ep),
                           " x train.micro_batch_size=", mbs,
                           " (expert-parallel ranks train on their own sequences)"));
  }
  return c.Take();
}

std::vector<std::string> CheckSchedule(const Layout& l) {
  Checker c;
  if (l.pp <= 1 || l.schedule != Schedule::kInterleaved) return c.Take();
  if (l.virtual_stages < 2) {
    c.Require(false, "parallelism.virtual_stages", l.virtual_stages,
              absl::StrCat("must be at least 2 for parallelism.schedule=interleaved with ",
                           Axis("pp", l.pp), " (one virtual stage is 1f1b)"));
  }
  if (l.grad_accum % l.pp != 0) {
    c.Require(false, "parallelism.schedule", "interleaved",
              absl::StrCat("needs the micro-batches per step (", l.grad_accum,
                           " = train.global_batch_size / (train.micro_batch_size x "
                           "parallelism.dp x parallelism.ep)) to be a multiple of ",
                           Axis("pp", l.pp)));
  }
  return c.Take();
}

namespace {

// Elastic jobs (docs/fault_tolerance.md, "Elastic jobs"): spares and the
// size a job may shrink to. On GPUs a node is lost whole, so both count
// whole nodes' worth of ranks.
void CheckElastic(Checker& c, const JobSpec& s) {
  const ResourcesSpec& r = s.resources;
  const FaultToleranceSpec& f = s.fault_tolerance;
  const int64_t world = r.world_size();
  const bool gpu = r.device == DeviceKind::kGpu && r.gpus_per_node >= 1;
  c.Require(r.spares >= 0, "resources.spares", r.spares, "must not be negative (0: none)");
  if (gpu && r.spares > 0) {
    c.Require(r.spares % r.gpus_per_node == 0, "resources.spares", r.spares,
              absl::StrCat("must be whole nodes: a multiple of resources.gpus_per_node=",
                           r.gpus_per_node));
  }
  c.Require(f.min_ranks >= 0 && f.min_ranks <= world, "fault_tolerance.min_ranks", f.min_ranks,
            absl::StrCat("must be between 0 (never shrink) and the job's ", world, " ranks"));
  if (gpu && f.min_ranks > 0) {
    c.Require(f.min_ranks % r.gpus_per_node == 0, "fault_tolerance.min_ranks", f.min_ranks,
              absl::StrCat("must be whole nodes: a multiple of resources.gpus_per_node=",
                           r.gpus_per_node));
  }
  c.Require(f.min_resize_interval_s >= 0, "fault_tolerance.min_resize_interval_s",
            f.min_resize_interval_s, "must not be negative");
}

}  // namespace

std::vector<std::string> CheckJobSpec(const JobSpec& s) {
  // Sizes above their bounds are reported alone: the rules below multiply
  // fields, which is only safe once every field is bounded.
  if (std::vector<std::string> too_large = CheckJobSpecLimits(s); !too_large.empty()) {
    return too_large;
  }
  Checker c;
  c.Require(ValidName(s.name), "name", "'" + s.name + "'",
            "must be 1-63 characters of letters, digits, '-', '_' or '.'");

  const ModelSpec& m = s.model;
  c.Require(m.vocab_size >= 2, "model.vocab_size", m.vocab_size, "must be at least 2");
  c.Require(m.hidden_size >= 1, "model.hidden_size", m.hidden_size, "must be positive");
  c.Require(m.num_layers >= 1, "model.num_layers", m.num_layers, "must be positive");
  c.Require(m.num_heads >= 1, "model.num_heads", m.num_heads, "must be positive");
  c.Require(m.num_kv_heads >= 1, "model.num_kv_heads", m.num_kv_heads, "must be positive");
  c.Require(m.ffn_hidden_size >= 1, "model.ffn_hidden_size", m.ffn_hidden_size, "must be positive");
  c.Require(m.max_seq_len >= 1, "model.max_seq_len", m.max_seq_len, "must be positive");
  c.Require(m.rope_theta > 0, "model.rope_theta", m.rope_theta, "must be positive");
  c.Require(m.norm_eps > 0, "model.norm_eps", m.norm_eps, "must be positive");
  RequireModelShape(c, m);
  CheckMoe(c, m);

  const TrainSpec& t = s.train;
  c.Require(t.steps >= 1, "train.steps", t.steps, "must be positive");
  c.Require(t.global_batch_size >= 1, "train.global_batch_size", t.global_batch_size,
            "must be positive");
  c.Require(t.micro_batch_size >= 1, "train.micro_batch_size", t.micro_batch_size,
            "must be positive");
  c.Require(t.seq_len >= 1, "train.seq_len", t.seq_len, "must be positive");
  c.Require(t.seq_len <= m.max_seq_len, "train.seq_len", t.seq_len,
            absl::StrCat("must not exceed model.max_seq_len=", m.max_seq_len));
  c.Require(t.lr > 0, "train.lr", t.lr, "must be positive");
  c.Require(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1, "train.min_lr_ratio", t.min_lr_ratio,
            "must be between 0 and 1");
  c.Require(t.warmup_steps >= 0 && t.warmup_steps <= t.steps, "train.warmup_steps",
            t.warmup_steps, absl::StrCat("must be between 0 and train.steps=", t.steps));
  c.Require(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must not be negative");
  c.Require(t.beta1 >= 0 && t.beta1 < 1, "train.beta1", t.beta1, "must be in [0, 1)");
  c.Require(t.beta2 >= 0 && t.beta2 < 1, "train.beta2", t.beta2, "must be in [0, 1)");
  c.Require(t.eps > 0, "train.eps", t.eps, "must be positive");
  c.Require(t.grad_clip >= 0, "train.grad_clip", t.grad_clip,
            "must not be negative (0 disables clipping)");
  c.Require(t.eval_interval >= 0, "train.eval_interval", t.eval_interval,
            "must not be negative (0 disables evaluation)");
  c.Require(t.eval_windows >= 1, "train.eval_windows", t.eval_windows, "must be positive");
  if (t.global_batch_size >= 1 && t.micro_batch_size >= 1) {
    c.Require(t.global_batch_size % t.micro_batch_size == 0, "train.global_batch_size",
              t.global_batch_size,
              absl::StrCat("must be divisible by train.micro_batch_size=", t.micro_batch_size));
  }
  // Every precision runs on every device: on resources.device=cpu bf16 and fp8
  // are emulated (kernels/cpu/bf16_emulation_ops.h, fp8_emulation_ops.h).

  c.Require(!s.data.train_path.empty(), "data.train_path", "''", "is required");
  if (t.eval_interval > 0) {
    c.Require(!s.data.val_path.empty(), "data.val_path", "''",
              absl::StrCat("is required when train.eval_interval=", t.eval_interval,
                           " (set eval_interval: 0 to train without evaluation)"));
  }
  if (s.data.format == DataFormat::kText) {
    c.Require(m.vocab_size >= 256, "model.vocab_size", m.vocab_size,
              "must be at least 256 for data.format=text (one token per byte)");
  }

  const ParallelismSpec& p = s.parallelism;
  auto positive = [&c](const char* name, const std::optional<int64_t>& v) {
    if (v) c.Require(*v >= 1, absl::StrCat("parallelism.", name), *v, "must be positive");
  };
  positive("dp", p.dp);
  positive("tp", p.tp);
  positive("pp", p.pp);
  positive("cp", p.cp);
  positive("ep", p.ep);
  if (p.zero_stage) c.Add(CheckZeroStage(*p.zero_stage));
  c.Require(p.virtual_stages >= 1, "parallelism.virtual_stages", p.virtual_stages,
            "must be positive");
  if (p.virtual_stages > 1) {
    c.Require(p.schedule == Schedule::kInterleaved, "parallelism.virtual_stages", p.virtual_stages,
              absl::StrCat("needs parallelism.schedule=interleaved (got ", ScheduleName(p.schedule),
                           ")"));
  }
  c.Require(p.bucket_mb >= 1, "parallelism.bucket_mb", p.bucket_mb, "must be positive");
  const AxisShape shape = AxisShapeOf(s);
  if (p.tp && *p.tp >= 1) {
    const int64_t tp = *p.tp;
    c.Add(CheckTpSplit(shape, tp));
    c.Require(m.vocab_size % tp == 0, "model.vocab_size", m.vocab_size,
              absl::StrCat("must be divisible by ", Axis("tp", tp), " (vocabulary-parallel embedding)"));
    if (p.sequence_parallel) {
      c.Require(t.seq_len % tp == 0, "train.seq_len", t.seq_len,
                absl::StrCat("must be divisible by ", Axis("tp", tp),
                             " with parallelism.sequence_parallel=true"));
    }
  }
  if (p.pp && *p.pp >= 1 && p.virtual_stages >= 1) c.Add(CheckPpSplit(shape, *p.pp, p.virtual_stages));
  if (p.cp && *p.cp >= 1) c.Add(CheckCpSplit(shape, *p.cp));
  if (p.ep && *p.ep > 1) c.Add(CheckEpSplit(shape, *p.ep));
  if (p.dp && *p.dp >= 1 && t.micro_batch_size >= 1) {
    Layout given;
    given.dp = *p.dp;
    given.ep = p.ep && *p.ep > 1 ? *p.ep : 1;
    given.micro_batch_size = t.micro_batch_size;
    c.Add(CheckBatchSplit(t.global_batch_size, given));
  }

  const ResourcesSpec& r = s.resources;
  if (r.device == DeviceKind::kCpu) {
    c.Require(r.ranks >= 1, "resources.ranks", r.ranks, "must be positive");
    c.Require(r.memory_mb >= 0, "resources.memory_mb", r.memory_mb,
              "must not be negative (0: the CPU preset's 8 GiB)");
  } else {
    c.Require(r.nodes >= 1, "resources.nodes", r.nodes, "must be positive");
    c.Require(r.gpus_per_node >= 1, "resources.gpus_per_node", r.gpus_per_node, "must be positive");
    c.Require(r.host_memory_mb >= 0, "resources.host_memory_mb", r.host_memory_mb,
              "must not be negative (0: not checked)");
    c.Require(!r.gpu.empty(), "resources.gpu", "''",
              "is required for device=gpu (h100-sxm, h200 or a100-80gb)");
    if (p.tp && *p.tp >= 1 && r.gpus_per_node >= 1) {
      // A TP group larger than a node spans whole nodes of one NVLink domain
      // (loom-worker --labels; the placement keeps it there).
      c.Require(r.gpus_per_node % *p.tp == 0 || *p.tp % r.gpus_per_node == 0, "parallelism.tp",
                *p.tp,
                absl::StrCat("must divide resources.gpus_per_node=", r.gpus_per_node,
                             " (a TP group stays inside a node) or be a multiple of it (whole "
                             "nodes of one NVLink domain, loom-worker --labels)"));
    }
  }
  if (!p.auto_all && p.dp && p.tp && p.pp && p.cp && p.ep) {
    const int64_t product = *p.dp * *p.tp * *p.pp * *p.cp * *p.ep;
    c.Require(product == r.world_size(), "parallelism", absl::StrCat("dp*tp*pp*cp*ep=", product),
              absl::StrCat("must equal the number of ranks (", r.world_size(), ")"));
  } else if (!p.auto_all && r.world_size() >= 1) {
    int64_t given = 1;
    for (const auto& v : {p.dp, p.tp, p.pp, p.cp, p.ep}) given *= v.value_or(1);
    c.Require(given >= 1 && r.world_size() % given == 0, "parallelism",
              absl::StrCat("product of the given axes=", given),
              absl::StrCat("must divide the number of ranks (", r.world_size(), ")"));
  }

  c.Require(s.checkpoint.interval >= 0, "checkpoint.interval", s.checkpoint.interval,
            "must not be negative (0: only the final checkpoint)");
  c.Require(s.checkpoint.keep >= 1, "checkpoint.keep", s.checkpoint.keep, "must be positive");
  c.Require(s.fault_tolerance.max_restarts >= 0, "fault_tolerance.max_restarts",
            s.fault_tolerance.max_restarts, "must not be negative");
  for (const auto& [name, budget] :
       {std::pair{"fault_tolerance.max_hang_restarts", s.fault_tolerance.max_hang_restarts},
        std::pair{"fault_tolerance.max_node_restarts", s.fault_tolerance.max_node_restarts}}) {
    if (budget) c.Require(*budget >= 0, name, *budget, "must not be negative");
  }
  c.Require(s.fault_tolerance.restart_backoff_s >= 0, "fault_tolerance.restart_backoff_s",
            s.fault_tolerance.restart_backoff_s, "must not be negative");
  c.Require(s.fault_tolerance.cordon_after >= 1, "fault_tolerance.cordon_after",
            s.fault_tolerance.cordon_after, "must be positive");
  c.Require(s.fault_tolerance.hang_timeout_s >= 0, "fault_tolerance.hang_timeout_s",
            s.fault_tolerance.hang_timeout_s, "must not be negative (0: calibrated)");
  c.Require(s.fault_tolerance.snapshot_interval >= 0, "fault_tolerance.snapshot_interval",
            s.fault_tolerance.snapshot_interval, "must not be negative (0: no snapshots)");
  c.Require(s.fault_tolerance.abort_timeout_s > 0, "fault_tolerance.abort_timeout_s",
            s.fault_tolerance.abort_timeout_s, "must be positive");
  CheckElastic(c, s);
  const FaultToleranceSpec& f = s.fault_tolerance;
  c.Require(f.loss_spike_factor == 0 || f.loss_spike_factor > 1,
            "fault_tolerance.loss_spike_factor", f.loss_spike_factor,
            "must be 0 (off) or greater than 1 (a multiple of the recent median loss)");
  c.Require(f.loss_spike_factor == 0 || f.snapshot_interval > 0,
            "fault_tolerance.loss_spike_factor", f.loss_spike_factor,
            "needs fault_tolerance.snapshot_interval > 0 (a spike rolls back to a snapshot)");
  c.Require(f.loss_spike_window >= 3, "fault_tolerance.loss_spike_window", f.loss_spike_window,
            "must be at least 3 (the median of so many recent losses)");
  c.Require(f.max_bad_steps >= 1, "fault_tolerance.max_bad_steps", f.max_bad_steps,
            "must be positive");
  c.Require(s.scheduling.max_runtime_s >= 0, "scheduling.max_runtime_s",
            s.scheduling.max_runtime_s, "must not be negative (0: not promised)");
  return c.Take();
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  std::vector<std::string> errors = CheckJobSpec(spec);
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

std::vector<std::string> CheckEngineRuns(const JobSpec& s, const Layout& l) {
  Checker c;
  // What every layout needs (the trainer checked these itself before).
  const TrainSpec& t = s.train;
  const ModelSpec& m = s.model;
  c.Require(t.steps >= 1 && t.micro_batch_size >= 1 && t.global_batch_size >= 1 && t.seq_len >= 1,
            "train", "steps/global_batch_size/micro_batch_size/seq_len", "must be positive");
  c.Require(t.seq_len <= m.max_seq_len, "train.seq_len", t.seq_len,
            absl::StrCat("must not exceed model.max_seq_len=", m.max_seq_len));
  c.Require(m.num_heads >= 1, "model.num_heads", m.num_heads, "must be positive");
  c.Require(m.num_kv_heads >= 0, "model.num_kv_heads", m.num_kv_heads,
            "must not be negative (0: model.num_heads)");
  RequireModelShape(c, m);
  c.Require(s.parallelism.bucket_mb >= 1, "parallelism.bucket_mb", s.parallelism.bucket_mb,
            "must be positive");
  c.Add(CheckBatchSplit(t.global_batch_size, l));
  c.Add(CheckZeroStage(l.zero_stage));
  const AxisShape shape = AxisShapeOf(s);
  // Context parallelism: the zigzag split (worker/engine/context_parallel/).
  c.Add(CheckCpSplit(shape, l.cp));
  if (m.moe.enabled() && l.tp > 1) {  // the MoE layer: whole on every TP rank (docs/moe.md)
    c.Require(!l.sequence_parallel, "parallelism.sequence_parallel", "true",
              absl::StrCat("with model.moe and ", Axis("tp", l.tp),
                           " is not supported by this engine yet (the MoE layer needs the whole stream)"));
  }
  // Expert parallelism (worker/engine/expert_parallel/, docs/expert_parallel.md).
  c.Add(CheckEpSplit(shape, l.ep));
  // CP with EP: the expert exchange and the dense gradients' EP sum were
  // built and tested without a CP group (ranks of one sequence), so the two
  // axes are not combined yet.
  c.Require(l.cp == 1 || l.ep == 1, "parallelism.cp", l.cp,
            absl::StrCat("with ", Axis("ep", l.ep),
                         " is not supported by this engine yet (use parallelism.cp=1 or parallelism.ep=1)"));
  if (l.tp > 1) {  // the tensor-parallel model's splits (worker/engine/tensor_parallel/)
    c.Add(CheckTpSplit(shape, l.tp));
    if (l.sequence_parallel) {  // the token rows of a micro-batch are split over TP
      const int64_t rows = s.train.micro_batch_size * s.train.seq_len;
      c.Require(rows % l.tp == 0, "train.seq_len", s.train.seq_len,
                absl::StrCat("x train.micro_batch_size=", s.train.micro_batch_size, " = ", rows,
                             " token rows over tp=", l.tp,
                             " must divide evenly (parallelism.sequence_parallel=true)"));
    }
  }
  if (l.pp > 1) c.Add(CheckPpSplit(shape, l.pp, l.virtual_stages));
  c.Add(CheckSchedule(l));
  return c.Take();
}

absl::Status ValidateEngineRuns(const JobSpec& spec, const Layout& layout) {
  std::vector<std::string> errors = CheckEngineRuns(spec, layout);
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

void FillTrivialLayout(JobSpec& spec) {
  ParallelismSpec& p = spec.parallelism;
  p.auto_all = false;
  if (!p.tp) p.tp = 1;
  if (!p.pp) p.pp = 1;
  if (!p.cp) p.cp = 1;
  if (!p.ep) p.ep = 1;
  if (!p.zero_stage) p.zero_stage = 0;
  if (!p.dp) {
    const int64_t rest = *p.tp * *p.pp * *p.cp * *p.ep;
    p.dp = rest >= 1 ? spec.resources.world_size() / rest : 1;
  }
}

}  // namespace loom::spec
