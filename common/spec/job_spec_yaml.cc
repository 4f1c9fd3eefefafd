// Strict YAML reader and canonical writer for JobSpec. yaml-cpp throws; every
// exception is caught here and turned into an error naming the field path.
#include "common/spec/job_spec_yaml.h"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/precision_recipe.h"
#include "yaml-cpp/yaml.h"

namespace loom::spec {
namespace {

// Each section maps field names to a parser that stores the value or returns
// the reason it cannot.
using FieldParser = std::function<absl::Status(const YAML::Node&, const std::string& path)>;
using Section = std::vector<std::pair<std::string, FieldParser>>;

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsSequence()) return "[...]";
  if (node.IsMap()) return "{...}";
  return "null";
}

absl::Status TypeError(const std::string& path, const YAML::Node& node, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, "=", Describe(node), " must be ", want));
}

FieldParser Int(int64_t* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) return TypeError(path, n, "an integer");
    *out = v;
    return absl::OkStatus();
  };
}

FieldParser OptInt(std::optional<int64_t>* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (n.IsScalar() && n.Scalar() == "auto") {
      out->reset();
      return absl::OkStatus();
    }
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
      return TypeError(path, n, "an integer or auto");
    }
    *out = v;
    return absl::OkStatus();
  };
}

// An integer, or `auto` (sets *is_auto and stores `auto_value`).
FieldParser IntOrAuto(int64_t* out, bool* is_auto, int64_t auto_value) {
  return [out, is_auto, auto_value](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (n.IsScalar() && n.Scalar() == "auto") {
      *out = auto_value;
      *is_auto = true;
      return absl::OkStatus();
    }
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
      return TypeError(path, n, "an integer or auto");
    }
    *out = v;
    *is_auto = false;
    return absl::OkStatus();
  };
}

FieldParser Uint(uint64_t* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v) || v < 0) {
      return TypeError(path, n, "a non-negative integer");
    }
    *out = static_cast<uint64_t>(v);
    return absl::OkStatus();
  };
}

FieldParser Double(double* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    double v;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v)) return TypeError(path, n, "a number");
    *out = v;
    return absl::OkStatus();
  };
}

FieldParser Bool(bool* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    bool v;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) return TypeError(path, n, "true or false");
    *out = v;
    return absl::OkStatus();
  };
}

FieldParser OptDouble(std::optional<double>* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    double v;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v)) return TypeError(path, n, "a number");
    *out = v;
    return absl::OkStatus();
  };
}

FieldParser String(std::string* out) {
  return [out](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (!n.IsScalar()) return TypeError(path, n, "a string");
    *out = n.Scalar();
    return absl::OkStatus();
  };
}

template <typename E>
FieldParser Enum(E* out, std::vector<std::pair<const char*, E>> names) {
  return [out, names](const YAML::Node& n, const std::string& path) -> absl::Status {
    std::vector<std::string> allowed;
    for (const auto& [name, value] : names) {
      if (n.IsScalar() && n.Scalar() == name) {
        *out = value;
        return absl::OkStatus();
      }
      allowed.push_back(name);
    }
    return absl::InvalidArgumentError(absl::StrCat(path, "=", Describe(n), " must be one of ",
                                                   absl::StrJoin(allowed, " | ")));
  };
}

// train.precision's spellings, from the one descriptor (precision_recipe.h).
std::vector<std::pair<const char*, Precision>> PrecisionSpellings() {
  std::vector<std::pair<const char*, Precision>> out;
  for (const PrecisionRecipe& r : kPrecisionRecipes) out.emplace_back(r.name.data(), r.precision);
  return out;
}

absl::Status ParseSection(const YAML::Node& node, const std::string& path, const Section& fields) {
  if (!node.IsMap()) return TypeError(path, node, "a mapping");
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
    const FieldParser* parser = nullptr;
    for (const auto& [name, p] : fields) {
      if (name == key) parser = &p;
    }
    if (parser == nullptr) {
      std::vector<std::string> known;
      for (const auto& [name, p] : fields) known.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat("unknown field ", field_path, " (known fields",
                                                     path.empty() ? "" : " of " + path, ": ",
                                                     absl::StrJoin(known, ", "), ")"));
    }
    if (absl::Status s = (*parser)(item.second, field_path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

FieldParser Sub(Section fields) {
  return [fields](const YAML::Node& n, const std::string& path) {
    return ParseSection(n, path, fields);
  };
}

Section MoeFields(MoeSpec& e) {
  return {{"num_experts", Int(&e.num_experts)},
          {"top_k", Int(&e.top_k)},
          {"expert_ffn_hidden_size", Int(&e.expert_ffn_hidden_size)},
          {"num_shared_experts", Int(&e.num_shared_experts)},
          {"first_dense_layers", Int(&e.first_dense_layers)},
          {"router_score", Enum(&e.router_score, {{"softmax", RouterScoreKind::kSoftmax},
                                                  {"sigmoid", RouterScoreKind::kSigmoid}})},
          {"aux_loss_coef", Double(&e.aux_loss_coef)},
          {"bias_update_rate", Double(&e.bias_update_rate)},
          {"capacity_factor", OptDouble(&e.capacity_factor)}};
}

Section ModelFields(ModelSpec& m) {
  return {{"moe", Sub(MoeFields(m.moe))},{"vocab_size", Int(&m.vocab_size)},       {"hidden_size", Int(&m.hidden_size)},
          {"num_layers", Int(&m.num_layers)},       {"num_heads", Int(&m.num_heads)},
          {"num_kv_heads", Int(&m.num_kv_heads)},   {"ffn_hidden_size", Int(&m.ffn_hidden_size)},
          {"max_seq_len", Int(&m.max_seq_len)},     {"rope_theta", Double(&m.rope_theta)},
          {"tie_embeddings", Bool(&m.tie_embeddings)}, {"norm_eps", Double(&m.norm_eps)}};
}

Section TrainFields(TrainSpec& t) {
  return {{"steps", Int(&t.steps)},
          {"global_batch_size", Int(&t.global_batch_size)},
          {"micro_batch_size", IntOrAuto(&t.micro_batch_size, &t.micro_batch_size_auto, 1)},
          {"seq_len", Int(&t.seq_len)},
          {"lr", Double(&t.lr)},
          {"min_lr_ratio", Double(&t.min_lr_ratio)},
          {"warmup_steps", Int(&t.warmup_steps)},
          {"lr_schedule", Enum(&t.lr_schedule, {{"cosine", LrSchedule::kCosine},
                                                {"linear", LrSchedule::kLinear},
                                                {"constant", LrSchedule::kConstant}})},
          {"weight_decay", Double(&t.weight_decay)},
          {"beta1", Double(&t.beta1)},
          {"beta2", Double(&t.beta2)},
          {"eps", Double(&t.eps)},
          {"grad_clip", Double(&t.grad_clip)},
          {"seed", Uint(&t.seed)},
          {"precision", Enum(&t.precision, PrecisionSpellings())},
          {"eval_interval", Int(&t.eval_interval)},
          {"eval_windows", Int(&t.eval_windows)}};
}

Section DataFields(DataSpec& d) {
  return {{"train_path", String(&d.train_path)},
          {"val_path", String(&d.val_path)},
          {"format", Enum(&d.format, {{"text", DataFormat::kText}, {"bin", DataFormat::kBin}})}};
}

Section ParallelismFields(ParallelismSpec& p) {
  return {{"dp", OptInt(&p.dp)},
          {"tp", OptInt(&p.tp)},
          {"pp", OptInt(&p.pp)},
          {"cp", OptInt(&p.cp)},
          {"ep", OptInt(&p.ep)},
          {"zero_stage", OptInt(&p.zero_stage)},
          {"schedule", Enum(&p.schedule, {{"afab", Schedule::kAfab},
                                          {"1f1b", Schedule::k1F1B},
                                          {"interleaved", Schedule::kInterleaved}})},
          {"virtual_stages", Int(&p.virtual_stages)},
          {"sequence_parallel", Bool(&p.sequence_parallel)},
          {"recompute", Enum(&p.recompute, {{"none", Recompute::kNone},
                                            {"selective", Recompute::kSelective},
                                            {"full", Recompute::kFull}})},
          {"bucket_mb", Int(&p.bucket_mb)}};
}

Section ResourcesFields(ResourcesSpec& r) {
  return {{"device", Enum(&r.device, {{"cpu", DeviceKind::kCpu}, {"gpu", DeviceKind::kGpu}})},
          {"ranks", Int(&r.ranks)},
          {"memory_mb", Int(&r.memory_mb)},
          {"gpu", String(&r.gpu)},
          {"nodes", Int(&r.nodes)},
          {"gpus_per_node", Int(&r.gpus_per_node)},
          {"host_memory_mb", Int(&r.host_memory_mb)},
          {"spares", Int(&r.spares)}};
}

Section CheckpointFields(CheckpointSpec& c) {
  return {{"dir", String(&c.dir)},
          {"interval", Int(&c.interval)},
          {"keep", Int(&c.keep)},
          {"resume_from", String(&c.resume_from)}};
}

Section FaultToleranceFields(FaultToleranceSpec& f) {
  return {{"max_restarts", Int(&f.max_restarts)},
          {"max_hang_restarts", OptInt(&f.max_hang_restarts)},
          {"max_node_restarts", OptInt(&f.max_node_restarts)},
          {"hang_timeout_s", Double(&f.hang_timeout_s)},
          {"restart_backoff_s", Double(&f.restart_backoff_s)},
          {"cordon_after", Int(&f.cordon_after)},
          {"in_place", Bool(&f.in_place)},
          {"snapshot_interval", Int(&f.snapshot_interval)},
          {"abort_timeout_s", Double(&f.abort_timeout_s)},
          {"min_ranks", Int(&f.min_ranks)},
          {"min_resize_interval_s", Double(&f.min_resize_interval_s)},
          {"loss_spike_factor", Double(&f.loss_spike_factor)},
          {"loss_spike_window", Int(&f.loss_spike_window)},
          {"max_bad_steps", Int(&f.max_bad_steps)},
          {"straggler", Enum(&f.straggler, {{"report", StragglerAction::kReport},
                                            {"replace", StragglerAction::kReplace}})}};
}

Section SchedulingFields(SchedulingSpec& s) {
  return {{"priority", Int(&s.priority)}, {"max_runtime_s", Double(&s.max_runtime_s)}};
}

FieldParser ParallelismParser(ParallelismSpec& p) {
  FieldParser map_parser = Sub(ParallelismFields(p));
  return [&p, map_parser](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (n.IsScalar() && n.Scalar() == "auto") {
      p.auto_all = true;
      return absl::OkStatus();
    }
    return map_parser(n, path);
  };
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecYaml(std::string_view yaml, std::string_view source_name) {
  JobSpec spec;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source_name), ": not valid YAML: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source_name), ": a job spec must be a YAML mapping with name, model, train, ..."));
  }
  Section top = {{"name", String(&spec.name)},
                 {"model", Sub(ModelFields(spec.model))},
                 {"train", Sub(TrainFields(spec.train))},
                 {"data", Sub(DataFields(spec.data))},
                 {"parallelism", ParallelismParser(spec.parallelism)},
                 {"resources", Sub(ResourcesFields(spec.resources))},
                 {"checkpoint", Sub(CheckpointFields(spec.checkpoint))},
                 {"fault_tolerance", Sub(FaultToleranceFields(spec.fault_tolerance))},
                 {"scheduling", Sub(SchedulingFields(spec.scheduling))}};
  absl::Status status;
  try {
    status = ParseSection(root, "", top);
  } catch (const YAML::Exception& e) {
    status = absl::InvalidArgumentError(absl::StrCat("malformed YAML: ", e.what()));
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source_name), ": ", status.message()));
  }
  if (spec.model.num_kv_heads == 0) spec.model.num_kv_heads = spec.model.num_heads;
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("job spec ", path, ": cannot open the file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseJobSpecYaml(buffer.str(), path);
}

std::string ToYaml(const JobSpec& s) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << s.name;

  const ModelSpec& m = s.model;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "vocab_size" << YAML::Value << m.vocab_size;
  out << YAML::Key << "hidden_size" << YAML::Value << m.hidden_size;
  out << YAML::Key << "num_layers" << YAML::Value << m.num_layers;
  out << YAML::Key << "num_heads" << YAML::Value << m.num_heads;
  out << YAML::Key << "num_kv_heads" << YAML::Value << m.num_kv_heads;
  out << YAML::Key << "ffn_hidden_size" << YAML::Value << m.ffn_hidden_size;
  out << YAML::Key << "max_seq_len" << YAML::Value << m.max_seq_len;
  out << YAML::Key << "rope_theta" << YAML::Value << m.rope_theta;
  out << YAML::Key << "tie_embeddings" << YAML::Value << m.tie_embeddings;
  out << YAML::Key << "norm_eps" << YAML::Value << m.norm_eps;
  if (m.moe.enabled()) {
    const MoeSpec& e = m.moe;
    out << YAML::Key << "moe" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "num_experts" << YAML::Value << e.num_experts;
    out << YAML::Key << "top_k" << YAML::Value << e.top_k;
    out << YAML::Key << "expert_ffn_hidden_size" << YAML::Value << e.expert_ffn_hidden_size;
    out << YAML::Key << "num_shared_experts" << YAML::Value << e.num_shared_experts;
    out << YAML::Key << "first_dense_layers" << YAML::Value << e.first_dense_layers;
    out << YAML::Key << "router_score" << YAML::Value << RouterScoreName(e.router_score);
    out << YAML::Key << "aux_loss_coef" << YAML::Value << e.aux_loss_coef;
    out << YAML::Key << "bias_update_rate" << YAML::Value << e.bias_update_rate;
    if (e.capacity_factor) {
      out << YAML::Key << "capacity_factor" << YAML::Value << *e.capacity_factor;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  const TrainSpec& t = s.train;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "steps" << YAML::Value << t.steps;
  out << YAML::Key << "global_batch_size" << YAML::Value << t.global_batch_size;
  if (t.micro_batch_size_auto) {
    out << YAML::Key << "micro_batch_size" << YAML::Value << "auto";
  } else {
    out << YAML::Key << "micro_batch_size" << YAML::Value << t.micro_batch_size;
  }
  out << YAML::Key << "seq_len" << YAML::Value << t.seq_len;
  out << YAML::Key << "lr" << YAML::Value << t.lr;
  out << YAML::Key << "min_lr_ratio" << YAML::Value << t.min_lr_ratio;
  out << YAML::Key << "warmup_steps" << YAML::Value << t.warmup_steps;
  out << YAML::Key << "lr_schedule" << YAML::Value << LrScheduleName(t.lr_schedule);
  out << YAML::Key << "weight_decay" << YAML::Value << t.weight_decay;
  out << YAML::Key << "beta1" << YAML::Value << t.beta1;
  out << YAML::Key << "beta2" << YAML::Value << t.beta2;
  out << YAML::Key << "eps" << YAML::Value << t.eps;
  out << YAML::Key << "grad_clip" << YAML::Value << t.grad_clip;
  out << YAML::Key << "seed" << YAML::Value << t.seed;
  out << YAML::Key << "precision" << YAML::Value << PrecisionName(t.precision);
  out << YAML::Key << "eval_interval" << YAML::Value << t.eval_interval;
  out << YAML::Key << "eval_windows" << YAML::Value << t.eval_windows;
  out << YAML::EndMap;

  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "train_path" << YAML::Value << s.data.train_path;
  out << YAML::Key << "val_path" << YAML::Value << s.data.val_path;
  out << YAML::Key << "format" << YAML::Value << DataFormatName(s.data.format);
  out << YAML::EndMap;

  const ParallelismSpec& p = s.parallelism;
  out << YAML::Key << "parallelism" << YAML::Value;
  if (p.auto_all) {
    out << "auto";
  } else {
    out << YAML::BeginMap;
    auto axis = [&out](const char* name, const std::optional<int64_t>& v) {
      if (v.has_value()) out << YAML::Key << name << YAML::Value << *v;
    };
    axis("dp", p.dp);
    axis("tp", p.tp);
    axis("pp", p.pp);
    axis("cp", p.cp);
    axis("ep", p.ep);
    axis("zero_stage", p.zero_stage);
    out << YAML::Key << "schedule" << YAML::Value << ScheduleName(p.schedule);
    out << YAML::Key << "virtual_stages" << YAML::Value << p.virtual_stages;
    out << YAML::Key << "sequence_parallel" << YAML::Value << p.sequence_parallel;
    out << YAML::Key << "recompute" << YAML::Value << RecomputeName(p.recompute);
    out << YAML::Key << "bucket_mb" << YAML::Value << p.bucket_mb;
    out << YAML::EndMap;
  }

  const ResourcesSpec& r = s.resources;
  out << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "device" << YAML::Value << DeviceKindName(r.device);
  if (r.device == DeviceKind::kCpu) {
    out << YAML::Key << "ranks" << YAML::Value << r.ranks;
    if (r.memory_mb > 0) out << YAML::Key << "memory_mb" << YAML::Value << r.memory_mb;
  } else {
    out << YAML::Key << "gpu" << YAML::Value << r.gpu;
    out << YAML::Key << "nodes" << YAML::Value << r.nodes;
    out << YAML::Key << "gpus_per_node" << YAML::Value << r.gpus_per_node;
    if (r.host_memory_mb > 0) {
      out << YAML::Key << "host_memory_mb" << YAML::Value << r.host_memory_mb;
    }
  }
  if (r.spares > 0) out << YAML::Key << "spares" << YAML::Value << r.spares;
  out << YAML::EndMap;

  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "dir" << YAML::Value << s.checkpoint.dir;
  out << YAML::Key << "interval" << YAML::Value << s.checkpoint.interval;
  out << YAML::Key << "keep" << YAML::Value << s.checkpoint.keep;
  if (!s.checkpoint.resume_from.empty()) {
    out << YAML::Key << "resume_from" << YAML::Value << s.checkpoint.resume_from;
  }
  out << YAML::EndMap;

  out << YAML::Key << "fault_tolerance" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "max_restarts" << YAML::Value << s.fault_tolerance.max_restarts;
  if (s.fault_tolerance.max_hang_restarts) {
    out << YAML::Key << "max_hang_restarts" << YAML::Value << *s.fault_tolerance.max_hang_restarts;
  }
  if (s.fault_tolerance.max_node_restarts) {
    out << YAML::Key << "max_node_restarts" << YAML::Value << *s.fault_tolerance.max_node_restarts;
  }
  out << YAML::Key << "hang_timeout_s" << YAML::Value << s.fault_tolerance.hang_timeout_s;
  out << YAML::Key << "restart_backoff_s" << YAML::Value << s.fault_tolerance.restart_backoff_s;
  out << YAML::Key << "cordon_after" << YAML::Value << s.fault_tolerance.cordon_after;
  out << YAML::Key << "in_place" << YAML::Value << s.fault_tolerance.in_place;
  out << YAML::Key << "snapshot_interval" << YAML::Value << s.fault_tolerance.snapshot_interval;
  out << YAML::Key << "abort_timeout_s" << YAML::Value << s.fault_tolerance.abort_timeout_s;
  out << YAML::Key << "min_ranks" << YAML::Value << s.fault_tolerance.min_ranks;
  out << YAML::Key << "min_resize_interval_s" << YAML::Value
      << s.fault_tolerance.min_resize_interval_s;
  out << YAML::Key << "loss_spike_factor" << YAML::Value << s.fault_tolerance.loss_spike_factor;
  out << YAML::Key << "loss_spike_window" << YAML::Value << s.fault_tolerance.loss_spike_window;
  out << YAML::Key << "max_bad_steps" << YAML::Value << s.fault_tolerance.max_bad_steps;
  out << YAML::Key << "straggler" << YAML::Value << StragglerActionName(s.fault_tolerance.straggler);
  out << YAML::EndMap;

  // Only when set: the section is the coordinator's, and a trainer of the
  // version before it (a rolling upgrade) reads every other job's spec.
  if (s.scheduling.priority != 0 || s.scheduling.max_runtime_s != 0) {
    out << YAML::Key << "scheduling" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "priority" << YAML::Value << s.scheduling.priority;
    out << YAML::Key << "max_runtime_s" << YAML::Value << s.scheduling.max_runtime_s;
    out << YAML::EndMap;
  }

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace loom::spec
