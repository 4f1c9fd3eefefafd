#include "worker/engine/optim/sharded_adamw.h"

namespace loom::engine {

ShardedAdamW::ShardedAdamW(kernels::Ops& ops, int64_t state_size, const spec::TrainSpec& train)
    : ops_(ops), state_size_(state_size), train_(train) {
  const int64_t bytes = state_size * static_cast<int64_t>(sizeof(float));
  m_ = ops.Allocate(bytes);
  v_ = ops.Allocate(bytes);
  if (state_size > 0) {
    ops.Fill(m_.f32(), state_size, 0.0f);
    ops.Fill(v_.f32(), state_size, 0.0f);
  }
}

void ShardedAdamW::Step(const std::vector<AdamWPiece>& pieces, double lr) {
  ++step_;
  for (const AdamWPiece& p : pieces) {
    if (p.count <= 0) continue;
    ops_.AdamW(p.param, p.grad, m_.f32() + p.state_offset, v_.f32() + p.state_offset, p.count,
               static_cast<float>(lr), static_cast<float>(train_.beta1),
               static_cast<float>(train_.beta2), static_cast<float>(train_.eps),
               p.decay ? static_cast<float>(train_.weight_decay) : 0.0f, step_);
  }
}

}  // namespace loom::engine
