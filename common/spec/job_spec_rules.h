// The rules a job spec must satisfy, checked before anything is stored.
// Each broken rule becomes one message naming the field path, its value and the
// rule, e.g. "model.num_heads=12 must be divisible by parallelism.tp=5".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "common/spec/layout.h"

namespace loom::spec {

// Every broken rule, in field order; empty when the spec is valid.
std::vector<std::string> CheckJobSpec(const JobSpec& spec);

// OK, or INVALID_ARGUMENT whose message lists every broken rule ("; "-joined).
absl::Status ValidateJobSpec(const JobSpec& spec);

// What this engine runs, for a resolved layout (on top of CheckJobSpec): the
// one place its limits live. Submission checks the spec's layout
// (spec::LayoutOf), `parallelism: auto` searches only layouts that pass, and
// the trainer checks the layout of its parallel context. Every broken rule,
// each naming its field; empty when the engine runs the layout.
std::vector<std::string> CheckEngineRuns(const JobSpec& spec, const Layout& layout);
// OK, or INVALID_ARGUMENT listing every broken rule ("; "-joined).
absl::Status ValidateEngineRuns(const JobSpec& spec, const Layout& layout);

// The rules that cut a model along one axis, the same wherever a layout is
// checked: submission (CheckJobSpec for the axes the user gave,
// CheckEngineRuns for the resolved layout), the planner's search
// (planner/search.cc) and the engine (the TP plan, the trainer).
// Each returns the broken rules, each naming its field; empty when the axis
// can be cut that way.
struct AxisShape {
  int64_t num_heads = 1;
  int64_t num_kv_heads = 1;  // 0: num_heads
  int64_t ffn_hidden_size = 1;
  int64_t vocab_size = 1;
  int64_t num_layers = 1;
  int64_t seq_len = 1;
  int64_t num_experts = 0;  // model.moe.num_experts; 0: a dense model
};
AxisShape AxisShapeOf(const JobSpec& spec);
// Query heads, FFN columns and vocabulary rows split over tp; kv heads split
// when tp divides them, replicated when they divide tp.
std::vector<std::string> CheckTpSplit(const AxisShape& shape, int64_t tp);
// At least one layer per pipeline chunk (pp x virtual_stages chunks).
std::vector<std::string> CheckPpSplit(const AxisShape& shape, int64_t pp, int64_t virtual_stages);
// Load-balanced context parallelism cuts each sequence into 2 x cp chunks.
std::vector<std::string> CheckCpSplit(const AxisShape& shape, int64_t cp);
// Experts split over ep: ep divides the experts (a dense model: ep = 1).
std::vector<std::string> CheckEpSplit(const AxisShape& shape, int64_t ep);

// The rules on a layout's own numbers, the same wherever a layout is checked:
// CheckJobSpec (for the fields given), CheckEngineRuns and the planner's
// search. Each returns the broken rules, each naming its field.
// ZeRO stages 0 to 3.
std::vector<std::string> CheckZeroStage(int64_t zero_stage);
// The global batch splits evenly into micro-batches over the ranks that train
// on their own data, dp x ep (expert-parallel ranks route their own tokens,
// docs/moe.md): global_batch_size divisible by dp x ep x micro_batch_size.
std::vector<std::string> CheckBatchSplit(int64_t global_batch_size, const Layout& layout);
// The pipeline schedule when pp > 1: interleaved runs at least 2 virtual
// stages per rank (one would be 1f1b) and a multiple of pp micro-batches per
// step (grad_accum), which go through the chunks in groups of pp.
std::vector<std::string> CheckSchedule(const Layout& layout);

// Fills the parallel axes the user left out when only one layout is possible
// without the planner: every other axis defaults to 1 (zero_stage to 0) and dp
// takes the rest of the world size. Used where the planner is not consulted.
void FillTrivialLayout(JobSpec& spec);

}  // namespace loom::spec
