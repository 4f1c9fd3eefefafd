// The job spec: what a user asks Loom to train, as parsed from YAML.
// Shared by the coordinator (validation, planning), the trainer (standalone
// mode and the assignment it receives) and loomctl. Pure: no I/O beyond
// reading a file when asked to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom::spec {

enum class RouterScoreKind { kSoftmax, kSigmoid };

// model.moe (docs/moe.md): which FFNs are mixtures of experts and how tokens
// are routed to them. num_experts == 0 (the default) is a dense model.
struct MoeSpec {
  int64_t num_experts = 0;             // routed experts per MoE layer
  int64_t top_k = 2;                   // experts each token is routed to
  int64_t expert_ffn_hidden_size = 0;  // one expert's SwiGLU width; 0: model.ffn_hidden_size
  int64_t num_shared_experts = 0;      // always-on experts of the same width (DeepSeek-V3)
  int64_t first_dense_layers = 0;      // layers [0, k) keep the dense FFN
  RouterScoreKind router_score = RouterScoreKind::kSoftmax;
  double aux_loss_coef = 0.01;         // Switch/GShard load-balancing loss; 0: off
  double bias_update_rate = 0.0;       // DeepSeek-V3 auxiliary-loss-free bias; 0: off
  std::optional<double> capacity_factor;  // absent: dropless

  bool enabled() const { return num_experts > 0; }
};

struct ModelSpec {
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 0;  // 0 in YAML means "same as num_heads"; resolved by Parse
  int64_t ffn_hidden_size = 384;
  int64_t max_seq_len = 256;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  double norm_eps = 1e-5;
  MoeSpec moe;

  int64_t head_dim() const { return hidden_size / num_heads; }
  bool IsMoeLayer(int64_t layer) const { return moe.enabled() && layer >= moe.first_dense_layers; }
  int64_t expert_ffn() const {
    return moe.expert_ffn_hidden_size > 0 ? moe.expert_ffn_hidden_size : ffn_hidden_size;
  }
};

enum class Precision { kFp32, kBf16, kFp8 };
enum class LrSchedule { kCosine, kLinear, kConstant };

struct TrainSpec {
  int64_t steps = 50;
  int64_t global_batch_size = 16;  // sequences per optimizer step
  int64_t micro_batch_size = 2;    // sequences per forward/backward
  // `micro_batch_size: auto`: the planner chooses it at submission, even when
  // every parallel axis is given (spec::ApplyLayout writes the choice back and
  // clears this); micro_batch_size holds 1 until then (what a spec that no
  // planner resolves, --standalone, runs).
  bool micro_batch_size_auto = false;
  int64_t seq_len = 128;
  double lr = 3.0e-3;
  double min_lr_ratio = 0.1;  // cosine/linear decay floor as a fraction of lr
  int64_t warmup_steps = 5;
  LrSchedule lr_schedule = LrSchedule::kCosine;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  uint64_t seed = 1234;
  Precision precision = Precision::kFp32;
  int64_t eval_interval = 25;  // 0 disables evaluation
  int64_t eval_windows = 8;
};

enum class DataFormat { kText, kBin };

struct DataSpec {
  std::string train_path;
  std::string val_path;  // empty: no validation
  DataFormat format = DataFormat::kText;
};

enum class Schedule { kAfab, k1F1B, kInterleaved };
enum class Recompute { kNone, kSelective, kFull };

// An axis the user did not give is nullopt: the planner chooses it.
struct ParallelismSpec {
  bool auto_all = false;  // `parallelism: auto`
  std::optional<int64_t> dp, tp, pp, cp, ep;
  std::optional<int64_t> zero_stage;
  Schedule schedule = Schedule::k1F1B;
  int64_t virtual_stages = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  int64_t bucket_mb = 25;  // DP gradient bucket size in MiB
};

enum class DeviceKind { kCpu, kGpu };

struct ResourcesSpec {
  DeviceKind device = DeviceKind::kCpu;
  int64_t ranks = 1;        // cpu: number of rank processes
  // cpu: the memory one rank may use, in MiB, as the planner counts it (the
  // layout search rejects layouts above it); 0: the CPU preset's 8 GiB.
  int64_t memory_mb = 0;
  std::string gpu;          // gpu: preset name, e.g. h100-sxm
  int64_t nodes = 1;        // gpu
  int64_t gpus_per_node = 8;
  // gpu: the host memory of one node that the ranks' in-place recovery
  // snapshots may fill, in MiB, as the planner counts it (layouts above it are
  // rejected); 0: not known, not checked.
  int64_t host_memory_mb = 0;
  // Hot spares (docs/fault_tolerance.md, "Elastic jobs"): devices, in ranks,
  // placed with the job but idle, to which a rank on a lost node moves
  // without waiting for placement. 0: none.
  int64_t spares = 0;

  int64_t world_size() const { return device == DeviceKind::kCpu ? ranks : nodes * gpus_per_node; }
};

struct CheckpointSpec {
  std::string dir;        // empty: no checkpoints
  int64_t interval = 0;   // steps between checkpoints; 0: only the final one
  int64_t keep = 2;
  // A job of the same owner whose newest checkpoint this job starts from when
  // it has none of its own (coordinated jobs; read, never written). Empty: none.
  std::string resume_from;
};

// What the coordinator does with a rank its straggler detector flags
// (docs/observability.md): name it (status, metric, history), or also move
// it off its node through an in-place restart and cordon the node.
enum class StragglerAction { kReport, kReplace };

// Restart budgets are per failure kind: a crash (a rank exited or was
// killed), a hang, a lost node. Unset kinds get max_restarts.
struct FaultToleranceSpec {
  int64_t max_restarts = 3;
  std::optional<int64_t> max_hang_restarts;
  std::optional<int64_t> max_node_restarts;
  double hang_timeout_s = 0;  // 0: calibrated from observed step times
  double restart_backoff_s = 1.0;  // wait before attempt n+1, doubled per restart, at most 60 s
  int64_t cordon_after = 2;  // failures of one job on one node before the node is cordoned
  // In-place recovery (docs/fault_tolerance.md): healthy ranks keep their
  // processes and roll back to their in-memory snapshot; only failed ranks are
  // relaunched. false: every failure restarts the whole job from disk.
  bool in_place = true;
  // Every rank snapshots its whole training state in memory (and sends a copy
  // to its buddy on another node) after every this many steps; 0: never (no
  // in-place recovery, whole-job restarts only).
  int64_t snapshot_interval = 1;
  // How long the survivors of a failure have to abort their collectives and
  // report the snapshots they hold before the coordinator falls back to a
  // whole-job restart.
  double abort_timeout_s = 10;
  // Shrink (docs/fault_tolerance.md, "Elastic jobs"): a job that lost devices
  // and has no spare is re-planned onto the ranks it still has when they are
  // at least this many, and grows back when devices return. 0: never shrinks
  // (it waits for placement at its full size).
  int64_t min_ranks = 0;
  // The least time between two resizes of a job, so that a node that comes
  // and goes does not make the job thrash.
  double min_resize_interval_s = 300;
  // Bad steps (docs/fault_tolerance.md, "Bad steps"). A step whose gradients
  // are not finite is never applied. With loss_spike_factor > 0, a step whose
  // loss exceeds this many times the median of the last loss_spike_window
  // applied steps is rolled back to the snapshot before it and its batch
  // skipped (needs snapshot_interval > 0); 0: off.
  double loss_spike_factor = 0;
  int64_t loss_spike_window = 20;
  // This many bad steps in a row (skipped or rolled back) fail the job,
  // naming them.
  int64_t max_bad_steps = 5;
  StragglerAction straggler = StragglerAction::kReport;

  int64_t hang_budget() const { return max_hang_restarts.value_or(max_restarts); }
  int64_t node_budget() const { return max_node_restarts.value_or(max_restarts); }
};

// scheduling (docs/scheduling.md): where the job stands in a shared queue.
struct SchedulingSpec {
  // Higher first; a waiting job may preempt running jobs of lower priority.
  // An admin may cap what each user asks for (loomctl quota set --max_priority).
  int64_t priority = 0;
  // The most seconds the job runs, as promised by its owner: lets a job run in
  // a gap before a waiting job's start (backfill). 0: not promised (once it
  // runs, the trainer's estimate of the time left stands in). Not enforced.
  double max_runtime_s = 0;
};

struct JobSpec {
  std::string name;
  ModelSpec model;
  TrainSpec train;
  DataSpec data;
  ParallelismSpec parallelism;
  ResourcesSpec resources;
  CheckpointSpec checkpoint;
  FaultToleranceSpec fault_tolerance;
  SchedulingSpec scheduling;
};

const char* PrecisionName(Precision p);
const char* RouterScoreName(RouterScoreKind k);
const char* ScheduleName(Schedule s);
const char* RecomputeName(Recompute r);
const char* LrScheduleName(LrSchedule s);
const char* StragglerActionName(StragglerAction a);
const char* DataFormatName(DataFormat f);
const char* DeviceKindName(DeviceKind d);

}  // namespace loom::spec
