#include "worker/engine/checkpoint/resume_state.h"

namespace loom::engine {
namespace {

constexpr char kSamplerName[] = "splitmix64-window-v1";

}  // namespace

nlohmann::json ResumeState(const spec::JobSpec& spec, const WrittenLayout& layout,
                           const StepCounters& counters) {
  return {{"tokens", counters.tokens},
          {"optimizer_step", counters.optimizer_step},
          {"data", {{"sampler", kSamplerName}, {"seed", spec.train.seed},
                    {"next_step", counters.step + 1}, {"seq_len", spec.train.seq_len},
                    {"global_batch_size", spec.train.global_batch_size}}},
          {"rng", {{"seed", spec.train.seed}, {"counter", counters.step}}},
          {"layout", {{"dp", layout.dp}, {"tp", layout.tp}, {"pp", layout.pp}, {"cp", layout.cp},
                      {"ep", layout.ep}, {"zero_stage", layout.zero_stage}}}};
}

}  // namespace loom::engine
