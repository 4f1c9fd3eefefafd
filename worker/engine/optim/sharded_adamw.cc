#include "worker/engine/optim/sharded_adamw.h"

#include "kernels/cpu/adamw.h"

namespace loom::engine {

ShardedAdamW::ShardedAdamW(int64_t state_size, const spec::TrainSpec& train)
    : m_(static_cast<size_t>(state_size), 0.0f),
      v_(static_cast<size_t>(state_size), 0.0f),
      train_(train) {}

void ShardedAdamW::Step(const std::vector<AdamWPiece>& pieces, double lr) {
  ++step_;
  for (const AdamWPiece& p : pieces) {
    kernels::cpu::AdamWStep(p.param, p.grad, m_.data() + p.state_offset,
                            v_.data() + p.state_offset, p.count, static_cast<float>(lr),
                            static_cast<float>(train_.beta1), static_cast<float>(train_.beta2),
                            static_cast<float>(train_.eps),
                            p.decay ? static_cast<float>(train_.weight_decay) : 0.0f, step_);
  }
}

}  // namespace loom::engine
