#include "worker/engine/model/llama_model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/rope_tables.h"
#include "worker/engine/model/llama_layer.h"
#include "worker/engine/model/normal_init.h"
#include "worker/engine/model/parameter_layout.h"

namespace loom::engine {
namespace {

using kernels::Buffer;
using kernels::Transpose;

[[noreturn]] void Fatal(const char* what, long long value, long long limit) {
  std::fprintf(stderr, "LlamaModel: %s %lld is outside [0, %lld)\n", what, value, limit);
  std::abort();
}

}  // namespace

struct LlamaModel::Impl {
  kernels::Ops* ops = nullptr;
  ParameterLayout layout;
  Buffer params, grads;
  Buffer rope_cos, rope_sin;
  int64_t rope_positions = 0;

  // Activation memory, sized for `capacity` tokens. x_in[l] is block l's input
  // (x_in[L] feeds the final norm) and is always kept; the rest of a block's
  // activations are per block or shared per the recompute mode.
  int64_t capacity = 0;
  std::vector<Buffer> pool;
  std::vector<BlockActivations> train_acts, eval_acts;
  float* rstd_final = nullptr;
  float* h_final = nullptr;
  float* logits = nullptr;
  float* row_loss = nullptr;
  float* dx = nullptr;
  int32_t* ids = nullptr;
  int32_t* targets = nullptr;
  BlockScratch scratch{};

  float* Alloc(int64_t floats) {
    pool.push_back(ops->AllocateFloats(floats));
    return pool.back().f32();
  }
  BlockWeights Weights(int64_t l) const {
    const float* p = params.f32();
    const LayerOffsets& o = layout.layers[l];
    return {p + o.input_norm, p + o.qkv, p + o.o, p + o.post_norm, p + o.gate_up, p + o.down};
  }
  void Prepare(const spec::ModelSpec& c, spec::Recompute mode, const BlockDims& d);
  int64_t Forward(const spec::ModelSpec& c, const BlockDims& d,
                  const std::vector<BlockActivations>& acts, const int32_t* inputs,
                  const int32_t* targets);
  float MeanLoss(int64_t tokens, int64_t count);

  BlockGrads Grads(int64_t l) const {
    float* g = grads.f32();
    const LayerOffsets& o = layout.layers[l];
    return {g + o.input_norm, g + o.qkv, g + o.o, g + o.post_norm, g + o.gate_up, g + o.down};
  }
};

LlamaModel::LlamaModel(const spec::ModelSpec& config, spec::Recompute recompute,
                       std::shared_ptr<kernels::Ops> ops)
    : config_(config), recompute_(recompute), ops_(std::move(ops)), impl_(new Impl) {
  if (!ops_) ops_ = kernels::cpu::MakeCpuOps();
  impl_->ops = ops_.get();
  impl_->layout = MakeParameterLayout(config_);
  impl_->params = ops_->AllocateFloats(impl_->layout.total);
  impl_->grads = ops_->AllocateFloats(impl_->layout.total);
  ops_->Fill(impl_->params.f32(), impl_->layout.total, 0.0f);
  ops_->Fill(impl_->grads.f32(), impl_->layout.total, 0.0f);
}

LlamaModel::~LlamaModel() = default;

void LlamaModel::InitParameters(uint64_t seed) {
  std::vector<float> host;
  for (size_t i = 0; i < impl_->layout.entries.size(); ++i) {
    const ParameterEntry& e = impl_->layout.entries[i];
    host.resize(static_cast<size_t>(e.numel));
    if (e.init_std == 0.0) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      NormalGenerator gen(TensorSeed(seed, i));
      for (float& x : host) x = static_cast<float>(gen.NextNormal() * e.init_std);
    }
    ops_->CopyHostToDevice(impl_->params.f32() + e.offset, host.data(),
                           e.numel * static_cast<int64_t>(sizeof(float)));
  }
}

std::vector<TensorView> LlamaModel::Parameters() {
  std::vector<TensorView> views;
  for (const ParameterEntry& e : impl_->layout.entries)
    views.push_back({e.name, e.shape, impl_->params.f32() + e.offset});
  return views;
}

std::vector<TensorView> LlamaModel::Gradients() {
  std::vector<TensorView> views;
  for (const ParameterEntry& e : impl_->layout.entries)
    views.push_back({e.name, e.shape, impl_->grads.f32() + e.offset});
  return views;
}

void LlamaModel::ZeroGradients() { ops_->Fill(impl_->grads.f32(), impl_->layout.total, 0.0f); }

int64_t LlamaModel::NumParameters() const { return impl_->layout.total; }

namespace {

BlockDims MakeBlockDims(const spec::ModelSpec& c, int64_t batch, int64_t seq) {
  BlockDims d;
  d.batch = batch;
  d.seq = seq;
  d.tokens = batch * seq;
  d.hidden = c.hidden_size;
  d.heads = c.num_heads;
  d.kv_heads = c.num_kv_heads;
  d.head_dim = c.head_dim();
  d.q_dim = d.heads * d.head_dim;
  d.kv_dim = d.kv_heads * d.head_dim;
  d.qkv_dim = d.q_dim + 2 * d.kv_dim;
  d.ffn = c.ffn_hidden_size;
  d.eps = static_cast<float>(c.norm_eps);
  return d;
}

// Allocates activations for `tokens` tokens (and the RoPE tables for `seq`
// positions) when the current ones do not fit.
}  // namespace

void LlamaModel::Impl::Prepare(const spec::ModelSpec& c, spec::Recompute mode,
                               const BlockDims& d) {
  Impl& m = *this;
  kernels::Ops& ops = *m.ops;
  if (d.seq > m.rope_positions) {
    const int64_t positions = std::max(d.seq, c.max_seq_len);
    const kernels::RopeTables t = kernels::MakeRopeTables(positions, d.head_dim, c.rope_theta);
    m.rope_cos = ops.AllocateFloats(static_cast<int64_t>(t.cos.size()));
    m.rope_sin = ops.AllocateFloats(static_cast<int64_t>(t.sin.size()));
    ops.CopyHostToDevice(m.rope_cos.data(), t.cos.data(), m.rope_cos.bytes());
    ops.CopyHostToDevice(m.rope_sin.data(), t.sin.data(), m.rope_sin.bytes());
    m.rope_positions = positions;
  }
  if (d.tokens <= m.capacity) return;
  m.pool.clear();
  m.capacity = d.tokens;
  const int64_t t = d.tokens, layers = c.num_layers;
  auto block_set = [&]() {
    BlockActivations a{};
    a.rstd1 = m.Alloc(t);
    a.h1 = m.Alloc(t * d.hidden);
    a.qkv = m.Alloc(t * d.qkv_dim);
    a.attn = m.Alloc(t * d.q_dim);
    a.lse = m.Alloc(t * d.heads);
    a.x_mid = m.Alloc(t * d.hidden);
    a.rstd2 = m.Alloc(t);
    a.h2 = m.Alloc(t * d.hidden);
    a.gu = m.Alloc(t * 2 * d.ffn);
    a.act = m.Alloc(t * d.ffn);
    return a;
  };
  const BlockActivations shared = block_set();
  m.train_acts.assign(layers, shared);
  m.eval_acts.assign(layers, shared);
  for (int64_t l = 0; l < layers; ++l) {
    if (mode != spec::Recompute::kFull) {
      BlockActivations own = block_set();
      if (mode == spec::Recompute::kSelective) {  // the attention core is recomputed
        own.attn = shared.attn;
        own.lse = shared.lse;
      }
      m.train_acts[l] = own;
    }
  }
  std::vector<float*> x_in(layers + 1);
  for (float*& x : x_in) x = m.Alloc(t * d.hidden);
  for (int64_t l = 0; l < layers; ++l) m.train_acts[l].x_in = m.eval_acts[l].x_in = x_in[l];
  m.h_final = m.Alloc(t * d.hidden);
  m.rstd_final = m.Alloc(t);
  m.logits = m.Alloc(t * c.vocab_size);
  m.row_loss = m.Alloc(t);
  m.dx = m.Alloc(t * d.hidden);
  m.scratch.dh = m.Alloc(t * d.hidden);
  m.scratch.d_act = m.Alloc(t * d.ffn);
  m.scratch.dgu = m.Alloc(t * 2 * d.ffn);
  m.scratch.d_attn = m.Alloc(t * d.q_dim);
  m.scratch.dqkv = m.Alloc(t * d.qkv_dim);
  m.pool.push_back(ops.Allocate(t * static_cast<int64_t>(sizeof(int32_t))));
  m.ids = m.pool.back().i32();
  m.pool.push_back(ops.Allocate(t * static_cast<int64_t>(sizeof(int32_t))));
  m.targets = m.pool.back().i32();
  // x_in[layers] is the final norm's input: kept alongside the pool.
  m.train_acts.push_back(BlockActivations{});
  m.train_acts.back().x_in = x_in[layers];
}

// Validates ids, uploads inputs and targets, runs embedding, every block and
// the final norm and LM head; leaves logits in m.logits. Returns the number of
// counted (non-negative) targets.
int64_t LlamaModel::Impl::Forward(const spec::ModelSpec& c, const BlockDims& d,
                                  const std::vector<BlockActivations>& acts,
                                  const int32_t* inputs, const int32_t* targets) {
  Impl& m = *this;
  kernels::Ops& ops = *m.ops;
  const int64_t t = d.tokens, layers = c.num_layers;
  int64_t count = 0;
  for (int64_t i = 0; i < t; ++i) {
    if (inputs[i] < 0 || inputs[i] >= c.vocab_size) Fatal("input token id", inputs[i], c.vocab_size);
    if (targets[i] >= c.vocab_size) Fatal("target token id", targets[i], c.vocab_size);
    count += targets[i] >= 0 ? 1 : 0;
  }
  ops.CopyHostToDevice(m.ids, inputs, t * static_cast<int64_t>(sizeof(int32_t)));
  ops.CopyHostToDevice(m.targets, targets, t * static_cast<int64_t>(sizeof(int32_t)));
  float* x_final = m.train_acts[layers].x_in;
  const float* p = m.params.f32();
  ops.EmbeddingForward(m.ids, t, p + m.layout.embed, c.vocab_size, d.hidden,
                       layers > 0 ? acts[0].x_in : x_final);
  const RopeView rope{m.rope_cos.f32(), m.rope_sin.f32()};
  for (int64_t l = 0; l < layers; ++l) {
    float* next = l + 1 < layers ? acts[l + 1].x_in : x_final;
    BlockForward(ops, d, m.Weights(l), rope, acts[l], next);
  }
  ops.RmsNormForward(x_final, p + m.layout.final_norm, t, d.hidden, d.eps, m.h_final,
                     m.rstd_final);
  ops.Gemm(Transpose::kNo, Transpose::kYes, t, c.vocab_size, d.hidden, 1.0f, m.h_final, d.hidden,
           p + m.layout.lm_head, d.hidden, 0.0f, m.logits, c.vocab_size);
  return count;
}

float LlamaModel::Impl::MeanLoss(int64_t tokens, int64_t count) {
  Impl& m = *this;
  std::vector<float> rows(static_cast<size_t>(tokens));
  m.ops->CopyDeviceToHost(rows.data(), m.row_loss, tokens * static_cast<int64_t>(sizeof(float)));
  double sum = 0.0;
  for (float r : rows) sum += r;
  return count > 0 ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
}

float LlamaModel::ForwardBackward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                                  int64_t seq, float loss_scale) {
  Impl& m = *impl_;
  kernels::Ops& ops = *ops_;
  const BlockDims d = MakeBlockDims(config_, batch, seq);
  m.Prepare(config_, recompute_, d);
  const int64_t layers = config_.num_layers, t = d.tokens, vocab = config_.vocab_size;
  const int64_t count = m.Forward(config_, d, m.train_acts, inputs, targets);
  const float grad_scale = count > 0 ? loss_scale / static_cast<float>(count) : 0.0f;
  ops.CrossEntropyForwardBackward(m.logits, m.targets, t, vocab, grad_scale, m.row_loss);

  const float* p = m.params.f32();
  float* g = m.grads.f32();
  const float* x_final = m.train_acts[layers].x_in;
  // m.logits now holds dLoss/dlogits. With tied embeddings lm_head == embed,
  // and the embedding's own gradient is added at the end.
  ops.Gemm(Transpose::kYes, Transpose::kNo, vocab, d.hidden, t, 1.0f, m.logits, vocab, m.h_final,
           d.hidden, 1.0f, g + m.layout.lm_head, d.hidden);
  ops.Gemm(Transpose::kNo, Transpose::kNo, t, d.hidden, vocab, 1.0f, m.logits, vocab,
           p + m.layout.lm_head, d.hidden, 0.0f, m.scratch.dh, d.hidden);
  ops.RmsNormBackward(m.scratch.dh, x_final, p + m.layout.final_norm, m.rstd_final, t, d.hidden,
                      m.dx, false, g + m.layout.final_norm);
  const RopeView rope{m.rope_cos.f32(), m.rope_sin.f32()};
  for (int64_t l = layers - 1; l >= 0; --l) {
    const BlockActivations& a = m.train_acts[l];
    if (recompute_ == spec::Recompute::kFull) {
      BlockForward(ops, d, m.Weights(l), rope, a, nullptr);
    } else if (recompute_ == spec::Recompute::kSelective) {
      BlockAttentionCore(ops, d, a);
    }
    BlockBackward(ops, d, m.Weights(l), m.Grads(l), rope, a, m.scratch, m.dx);
  }
  ops.EmbeddingBackward(m.ids, t, m.dx, vocab, d.hidden, g + m.layout.embed);
  return m.MeanLoss(t, count);
}

float LlamaModel::ForwardLoss(const int32_t* inputs, const int32_t* targets, int64_t batch,
                              int64_t seq) {
  Impl& m = *impl_;
  const BlockDims d = MakeBlockDims(config_, batch, seq);
  m.Prepare(config_, recompute_, d);
  const int64_t count = m.Forward(config_, d, m.eval_acts, inputs, targets);
  ops_->CrossEntropyForward(m.logits, m.targets, d.tokens, config_.vocab_size, m.row_loss);
  return m.MeanLoss(d.tokens, count);
}

}  // namespace loom::engine
