#include "worker/engine/model/llama_model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "kernels/rope_tables.h"
#include "worker/engine/context_parallel/ring_attention.h"
#include "worker/engine/context_parallel/zigzag.h"
#include "worker/engine/parallel/host_floats.h"
#include "worker/engine/model/llama_layer.h"
#include "worker/engine/model/moe_router.h"
#include "worker/engine/model/normal_init.h"
#include "worker/engine/model/parameter_layout.h"
#include "worker/engine/model/replicated_grads.h"
#include "worker/engine/tensor_parallel/tp_collectives.h"
#include "worker/engine/tensor_parallel/vocab_parallel_loss.h"

namespace loom::engine {
namespace {

using kernels::Buffer;
using kernels::Transpose;

[[noreturn]] void Fatal(const char* what, long long value, long long limit) {
  std::fprintf(stderr, "LlamaModel: %s %lld is outside [0, %lld)\n", what, value, limit);
  std::abort();
}

// The slice `e` describes of a global tensor generated whole (row-major).
std::vector<float> SliceOf(const std::vector<float>& global, const ParameterEntry& e) {
  if (e.shard_axis < 0) return global;
  std::vector<float> local(static_cast<size_t>(e.numel));
  const int64_t cols = e.global_shape[1];
  if (e.shard_axis == 0) {
    std::copy_n(global.begin() + e.shard_offset * cols, e.numel, local.begin());
  } else {
    const int64_t width = e.shape[1];
    for (int64_t r = 0; r < e.shape[0]; ++r) {
      std::copy_n(global.begin() + r * cols + e.shard_offset, width, local.begin() + r * width);
    }
  }
  return local;
}

TensorView ViewOf(const ParameterEntry& e, float* base) {
  TensorView v{e.name, e.shape, base + e.offset};
  v.global_shape = e.global_shape;
  v.shard_axis = e.shard_axis;
  v.shard_offset = e.shard_offset;
  v.replicas = e.replicas;
  return v;
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
  // Tensor parallelism; tp.active() is false (and the rest unused) on one rank.
  TpPlan tp;
  int64_t global_parameters = 0;
  std::unique_ptr<TpCollectives> coll;
  std::unique_ptr<VocabParallelLoss> vocab_loss;
  std::unique_ptr<ReplicatedGrads> replicated;
  BlockTp block_tp{};
  // Context parallelism; ring is null (and the rest unused) without it.
  comm::Communicator* cp = nullptr;
  std::unique_ptr<RingAttention> ring;
  BlockCp block_cp{};
  absl::Status cp_status;
  absl::Status status;
  // [pp] The part this model holds (the whole model by default).
  ModelPart part;
  int64_t num_layers = 0;  // layers held
  // [moe] One MoeLayer per held layer that is MoE (null for dense layers),
  // their selection biases (host), the shared backward scratch, the exchange.
  std::vector<std::unique_ptr<MoeLayer>> moe;
  std::vector<std::vector<float>> moe_bias;
  MoeScratch moe_scratch;
  std::unique_ptr<LocalExpertExchange> local_exchange;
  ExpertExchange* exchange = nullptr;
  MoeStepStats moe_stats;
  absl::Status moe_status;
  ModelHooks* hooks = nullptr;  // [hooks] null: no hooks
  ModelHooks& Hooks() {         // [hooks]
    static ModelHooks none;
    return hooks != nullptr ? *hooks : none;
  }

  float* Alloc(int64_t floats) {
    pool.push_back(ops->AllocateFloats(floats));
    return pool.back().f32();
  }
  BlockWeights Weights(int64_t l) const {
    const float* p = params.f32();
    const LayerOffsets& o = layout.layers[l];
    if (o.moe) return {p + o.input_norm, p + o.qkv, p + o.o, p + o.post_norm, nullptr, nullptr};
    return {p + o.input_norm, p + o.qkv, p + o.o, p + o.post_norm, p + o.gate_up, p + o.down};
  }
  // [moe] The MoE part of held layer l (null for a dense layer).
  const MoeBlock* Moe(const spec::ModelSpec& c, int64_t l, const BlockDims& d, double loss_scale,
                      MoeBlock* out) {
    if (moe[static_cast<size_t>(l)] == nullptr) return nullptr;
    const LayerOffsets& o = layout.layers[l];
    const float* p = params.f32();
    float* g = grads.f32();
    MoeBlock& b = *out;
    b.layer = moe[static_cast<size_t>(l)].get();
    b.dims.tokens = d.tokens;
    b.dims.hidden = d.hidden;
    b.dims.num_experts = c.moe.num_experts;
    b.dims.top_k = c.moe.top_k;
    b.dims.expert_ffn = c.expert_ffn();
    b.dims.shared_ffn = c.moe.num_shared_experts * c.expert_ffn();
    b.dims.score = c.moe.router_score == spec::RouterScoreKind::kSoftmax ? RouterScore::kSoftmax
                                                                         : RouterScore::kSigmoid;
    b.dims.aux_loss_coef = c.moe.aux_loss_coef;
    b.dims.capacity = ExpertCapacity(c.moe.capacity_factor.value_or(0.0), d.tokens,
                                     c.moe.top_k, c.moe.num_experts);
    b.w.router = p + o.router;
    b.w.bias = c.moe.bias_update_rate > 0 ? moe_bias[static_cast<size_t>(l)].data() : nullptr;
    b.w.experts = p + o.experts;
    b.w.shared_gate_up = o.shared_gate_up >= 0 ? p + o.shared_gate_up : nullptr;
    b.w.shared_down = o.shared_down >= 0 ? p + o.shared_down : nullptr;
    b.g.router = g + o.router;
    b.g.experts = g + o.experts;
    b.g.shared_gate_up = o.shared_gate_up >= 0 ? g + o.shared_gate_up : nullptr;
    b.g.shared_down = o.shared_down >= 0 ? g + o.shared_down : nullptr;
    b.scratch = &moe_scratch;
    b.loss_scale = loss_scale;
    b.status = &moe_status;
    return &b;
  }
  void Prepare(const spec::ModelSpec& c, spec::Recompute mode, const BlockDims& d);
  int64_t Forward(const spec::ModelSpec& c, const BlockDims& d,
                  const std::vector<BlockActivations>& acts, const int32_t* inputs,
                  const int32_t* targets, const float* x = nullptr, float* y = nullptr);
  // [pp] The shared forward-and-backward of ForwardBackward and PartForwardBackward.
  float ForwardBackward(const spec::ModelSpec& c, spec::Recompute recompute, const int32_t* inputs,
                        const float* x, const int32_t* targets, const float* dy, int64_t batch,
                        int64_t seq, float loss_scale, float* dx);
  float MeanLoss(int64_t tokens, int64_t count);
  const BlockTp* Tp() const { return tp.active() ? &block_tp : nullptr; }
  const BlockCp* Cp() const { return ring != nullptr ? &block_cp : nullptr; }
  int cp_size() const { return ring != nullptr ? cp->size() : 1; }
  // [cp] The zigzag split of this call's sequences (seq = the local length);
  // false (status set) when they cannot be split.
  bool StartCp(int64_t seq) {
    if (ring == nullptr) return true;
    cp_status = absl::OkStatus();
    auto split = ZigzagSplit::Make(seq * cp->size(), cp->size());
    if (!split.ok()) {
      status = split.status();
      return false;
    }
    block_cp.split = *split;
    return true;
  }
  // [cp] The sum of `x` over the CP group (x itself without CP).
  double SumOverCp(double x) {
    if (ring == nullptr || !cp_status.ok()) return x;
    // Through backend memory: NCCL takes no host pointers.
    float v = static_cast<float>(x);
    cp_status.Update(AllReduceHostFloats(*ops, cp, &v, 1));
    return v;
  }
  // [moe] Index of held layer l among the held MoE layers.
  int64_t MoeSlot(int64_t l) const {
    int64_t slot = 0;
    for (int64_t i = 0; i < l; ++i) slot += moe[static_cast<size_t>(i)] != nullptr ? 1 : 0;
    return slot;
  }
  // Clears the previous call's status; false (status set) when the token
  // rows cannot be split over the group.
  bool StartCall(int64_t tokens) {
    status = absl::OkStatus();
    moe_status = absl::OkStatus();
    if (coll != nullptr) coll->ResetStatus();
    if (tp.sequence_parallel && tokens % tp.size != 0) {
      status = absl::InvalidArgumentError(
          "sequence parallelism splits the batch * seq = " + std::to_string(tokens) +
          " token rows over the tensor-parallel group of " + std::to_string(tp.size) +
          ": they must divide evenly");
      return false;
    }
    return true;
  }
  // Why the call's result is meaningless, if it is (a failed TP collective).
  bool Failed() {
    if (coll != nullptr && !coll->status().ok()) status = coll->status();
    if (status.ok() && !cp_status.ok()) status = cp_status;
    if (status.ok() && !moe_status.ok()) status = moe_status;  // [moe] a failed exchange
    return !status.ok();
  }

  BlockGrads Grads(int64_t l) const {
    float* g = grads.f32();
    const LayerOffsets& o = layout.layers[l];
    BlockGrads b{g + o.input_norm, g + o.qkv, g + o.o, g + o.post_norm,
                 o.moe ? nullptr : g + o.gate_up, o.moe ? nullptr : g + o.down};
    if (replicated != nullptr) replicated->Redirect(l, &b);
    return b;
  }
};

LlamaModel::LlamaModel(const spec::ModelSpec& config, spec::Recompute recompute,
                       std::shared_ptr<kernels::Ops> ops, TensorParallelOptions parallel,
                       ModelPart part)
    : config_(config), recompute_(recompute), ops_(std::move(ops)), impl_(new Impl) {
  if (!ops_) {
    std::fprintf(stderr, "LlamaModel: no backend given (kernels::Ops; the engine's is chosen by "
                         "MakeOpsForJob, worker/engine/ops_selection.h)\n");
    std::abort();
  }
  impl_->ops = ops_.get();
  comm::Communicator* tp = parallel.tp;
  const int tp_size = tp != nullptr ? tp->size() : 1;
  if (absl::Status s = CheckTensorParallel(config_, tp_size); !s.ok()) {
    std::fprintf(stderr, "LlamaModel: %s\n", std::string(s.message()).c_str());
    std::abort();
  }
  impl_->tp = MakeTpPlan(config_, tp_size > 1 ? tp->rank() : 0, tp_size,
                         parallel.sequence_parallel);
  if (absl::Status s = CheckModelPart(config_, part); !s.ok()) {  // [pp]
    std::fprintf(stderr, "LlamaModel: %s\n", std::string(s.message()).c_str());
    std::abort();
  }
  if (part.num_layers < 0) part.num_layers = config_.num_layers - part.first_layer;
  impl_->part = part;
  impl_->num_layers = part.num_layers;
  impl_->layout = MakeParameterLayout(config_, impl_->tp, part);
  impl_->global_parameters = MakeParameterLayout(config_).total;
  if (parallel.cp != nullptr && parallel.cp->size() > 1) {  // [cp]
    impl_->cp = parallel.cp;
    impl_->ring = std::make_unique<RingAttention>(*ops_, *parallel.cp);
    impl_->block_cp.ring = impl_->ring.get();
    impl_->block_cp.rank = parallel.cp->rank();
    impl_->block_cp.status = &impl_->cp_status;
  }
  if (impl_->tp.active()) {
    impl_->coll = std::make_unique<TpCollectives>(tp, ops_.get(), impl_->tp.sequence_parallel);
    impl_->vocab_loss = std::make_unique<VocabParallelLoss>(
        ops_.get(), impl_->coll.get(), impl_->tp.vocab_first, impl_->tp.vocab);
    impl_->replicated = std::make_unique<ReplicatedGrads>(ops_.get(), impl_->coll.get(), config_,
                                                          impl_->tp, &impl_->layout);
    if (impl_->replicated->empty()) impl_->replicated.reset();
    impl_->block_tp.coll = impl_->coll.get();
  }
  // [moe] Under TP every rank runs the whole MoE layer on the replicated
  // stream (its tensors replicated); sequence parallelism splits the stream,
  // which the layer does not (spec::CheckEngineRuns refuses it).
  if (config_.moe.enabled() && tp_size > 1 && parallel.sequence_parallel) {
    std::fprintf(stderr, "LlamaModel: model.moe with sequence parallelism is not supported\n");
    std::abort();
  }
  impl_->local_exchange =
      std::make_unique<LocalExpertExchange>(ops_.get(), config_.moe.num_experts);
  impl_->exchange = impl_->local_exchange.get();
  for (int64_t l = 0; l < impl_->num_layers; ++l) {
    const bool is_moe = impl_->layout.layers[static_cast<size_t>(l)].moe;
    impl_->moe.push_back(is_moe ? std::make_unique<MoeLayer>(ops_.get(), impl_->exchange) : nullptr);
    impl_->moe_bias.emplace_back(is_moe ? config_.moe.num_experts : 0, 0.0f);
  }
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
    // A shard draws the whole tensor's stream and keeps its slice.
    int64_t global_numel = 1;
    for (int64_t d : e.global_shape.empty() ? e.shape : e.global_shape) global_numel *= d;
    host.resize(static_cast<size_t>(global_numel));
    if (e.init_std == 0.0) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      NormalGenerator gen(TensorSeed(seed, static_cast<uint64_t>(e.init_index)));
      for (float& x : host) x = static_cast<float>(gen.NextNormal() * e.init_std);
    }
    if (e.shard_axis >= 0) host = SliceOf(host, e);
    ops_->CopyHostToDevice(impl_->params.f32() + e.offset, host.data(),
                           e.numel * static_cast<int64_t>(sizeof(float)));
  }
}

std::vector<TensorView> LlamaModel::Parameters() {
  std::vector<TensorView> views;
  for (const ParameterEntry& e : impl_->layout.entries)
    views.push_back(ViewOf(e, impl_->params.f32()));
  return views;
}

std::vector<TensorView> LlamaModel::Gradients() {
  std::vector<TensorView> views;
  for (const ParameterEntry& e : impl_->layout.entries)
    views.push_back(ViewOf(e, impl_->grads.f32()));
  return views;
}

void LlamaModel::ZeroGradients() { ops_->Fill(impl_->grads.f32(), impl_->layout.total, 0.0f); }

int64_t LlamaModel::NumParameters() const { return impl_->layout.total; }

int64_t LlamaModel::NumGlobalParameters() const { return impl_->global_parameters; }

const absl::Status& LlamaModel::status() const { return impl_->status; }

const TpPlan& LlamaModel::tp_plan() const { return impl_->tp; }

namespace {

// This rank's dims: its heads and FFN columns, and its residual rows.
BlockDims MakeBlockDims(const spec::ModelSpec& c, const TpPlan& tp, int64_t batch, int64_t seq) {
  BlockDims d;
  d.batch = batch;
  d.seq = seq;
  d.tokens = batch * seq;
  d.rows = tp.sequence_parallel ? d.tokens / tp.size : d.tokens;
  d.hidden = c.hidden_size;
  d.heads = tp.heads;
  d.kv_heads = tp.kv_heads;
  d.head_dim = c.head_dim();
  d.q_dim = d.heads * d.head_dim;
  d.kv_dim = d.kv_heads * d.head_dim;
  d.qkv_dim = d.q_dim + 2 * d.kv_dim;
  d.ffn = tp.ffn;
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
  const int64_t seq_len = d.seq * m.cp_size();  // [cp] positions run over the whole sequence
  if (seq_len > m.rope_positions) {
    const int64_t positions = std::max(seq_len, c.max_seq_len);
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
  // The residual stream (x_in, x_mid, rstd, dx) has r rows, the rest t.
  const int64_t t = d.tokens, r = d.rows, layers = m.num_layers;
  auto block_set = [&]() {
    BlockActivations a{};
    a.rstd1 = m.Alloc(r);
    a.h1 = m.Alloc(t * d.hidden);
    a.qkv = m.Alloc(t * d.qkv_dim);
    a.attn = m.Alloc(t * d.q_dim);
    a.lse = m.Alloc(t * d.heads);
    a.x_mid = m.Alloc(r * d.hidden);
    a.rstd2 = m.Alloc(r);
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
  for (float*& x : x_in) x = m.Alloc(r * d.hidden);
  for (int64_t l = 0; l < layers; ++l) m.train_acts[l].x_in = m.eval_acts[l].x_in = x_in[l];
  m.h_final = m.Alloc(t * d.hidden);
  m.rstd_final = m.Alloc(r);
  m.logits = m.Alloc(t * m.tp.vocab);
  m.row_loss = m.Alloc(t);
  m.dx = m.Alloc(r * d.hidden);
  m.scratch.dh = m.Alloc(t * d.hidden);
  m.scratch.d_act = m.Alloc(t * d.ffn);
  m.scratch.dgu = m.Alloc(t * 2 * d.ffn);
  m.scratch.d_attn = m.Alloc(t * d.q_dim);
  m.scratch.dqkv = m.Alloc(t * d.qkv_dim);
  m.pool.push_back(ops.Allocate(t * static_cast<int64_t>(sizeof(int32_t))));
  m.ids = m.pool.back().i32();
  m.pool.push_back(ops.Allocate(t * static_cast<int64_t>(sizeof(int32_t))));
  m.targets = m.pool.back().i32();
  if (m.tp.active()) {
    m.block_tp.partial = m.Alloc(t * d.hidden);
    m.block_tp.rows = m.Alloc(r * d.hidden);
    m.block_tp.full = m.Alloc(t * d.hidden);
  }
  // x_in[layers] is the final norm's input: kept alongside the pool.
  m.train_acts.push_back(BlockActivations{});
  m.train_acts.back().x_in = x_in[layers];
}

// Validates ids, uploads inputs and targets, runs embedding, every block and
// the final norm and LM head; leaves logits in m.logits. Returns the number of
// counted (non-negative) targets.
int64_t LlamaModel::Impl::Forward(const spec::ModelSpec& c, const BlockDims& d,
                                  const std::vector<BlockActivations>& acts,
                                  const int32_t* inputs, const int32_t* targets, const float* x,
                                  float* y) {
  Impl& m = *this;
  kernels::Ops& ops = *m.ops;
  const int64_t t = d.tokens, layers = m.num_layers;
  int64_t count = 0;
  for (int64_t i = 0; i < t; ++i) {
    if (m.part.embedding && (inputs[i] < 0 || inputs[i] >= c.vocab_size)) {
      Fatal("input token id", inputs[i], c.vocab_size);
    }
    if (!m.part.head) continue;
    if (targets[i] >= c.vocab_size) Fatal("target token id", targets[i], c.vocab_size);
    count += targets[i] >= 0 ? 1 : 0;
  }
  if (m.part.embedding) ops.CopyHostToDevice(m.ids, inputs, t * static_cast<int64_t>(sizeof(int32_t)));
  if (m.part.head) ops.CopyHostToDevice(m.targets, targets, t * static_cast<int64_t>(sizeof(int32_t)));
  float* x_final = m.train_acts[layers].x_in;
  const float* p = m.params.f32();
  float* x_first = layers > 0 ? acts[0].x_in : x_final;
  if (!m.part.embedding) {  // [pp] the previous stage's output
    ops.CopyDeviceToDevice(x_first, x, d.rows * d.hidden * static_cast<int64_t>(sizeof(float)));
  } else {
  m.Hooks().BeforeUse(0, false);  // [hooks]
  if (!m.tp.active()) {
    ops.EmbeddingForward(m.ids, t, p + m.layout.embed, c.vocab_size, d.hidden, x_first);
  } else {
    // Vocabulary-parallel: each rank looks up its rows, the sum is the lookup.
    float* partial = m.tp.sequence_parallel ? m.block_tp.partial : x_first;
    ops.EmbeddingShardForward(m.ids, t, p + m.layout.embed, m.tp.vocab_first, m.tp.vocab,
                              d.hidden, partial);
    m.coll->ReduceRows(partial, t * d.hidden, x_first);
  }
  m.Hooks().AfterUse(0, false);  // [hooks]
  }
  const RopeView rope{m.rope_cos.f32(), m.rope_sin.f32()};
  for (int64_t l = 0; l < layers; ++l) {
    float* next = l + 1 < layers ? acts[l + 1].x_in : x_final;
    m.Hooks().BeforeUse(1 + l, false);  // [hooks]
    MoeBlock moe;
    BlockForward(ops, d, m.Weights(l), rope, acts[l], next, m.Tp(), m.Cp(),
                 m.Moe(c, l, d, 1.0, &moe));
    m.Hooks().AfterUse(1 + l, false);  // [hooks]
  }
  if (!m.part.head) {  // [pp] the next stage's input
    if (y != nullptr) ops.CopyDeviceToDevice(y, x_final, d.rows * d.hidden * static_cast<int64_t>(sizeof(float)));
    return 0;
  }
  m.Hooks().BeforeUse(layers + 1, false);  // [hooks]
  const bool sp = m.tp.sequence_parallel;
  ops.RmsNormForward(x_final, p + m.layout.final_norm, d.rows, d.hidden, d.eps,
                     sp ? m.block_tp.rows : m.h_final, m.rstd_final);
  if (sp) m.coll->AllGather(m.block_tp.rows, d.rows * d.hidden, m.h_final);
  // Under TP the logits are this rank's vocabulary columns.
  ops.Gemm(Transpose::kNo, Transpose::kYes, t, m.tp.vocab, d.hidden, 1.0f, m.h_final, d.hidden,
           p + m.layout.lm_head, d.hidden, 0.0f, m.logits, m.tp.vocab);
  m.Hooks().AfterUse(layers + 1, false);  // [hooks]
  return count;
}

float LlamaModel::Impl::MeanLoss(int64_t tokens, int64_t count) {
  Impl& m = *this;
  std::vector<float> rows(static_cast<size_t>(tokens));
  m.ops->CopyDeviceToHost(rows.data(), m.row_loss, tokens * static_cast<int64_t>(sizeof(float)));
  double sum = 0.0;
  for (float r : rows) sum += r;
  sum = m.SumOverCp(sum);  // [cp] count is already the whole sequence's
  return count > 0 ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
}

float LlamaModel::ForwardBackward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                                  int64_t seq, float loss_scale) {
  return impl_->ForwardBackward(config_, recompute_, inputs, nullptr, targets, nullptr, batch, seq,
                                loss_scale, nullptr);
}

float LlamaModel::Impl::ForwardBackward(const spec::ModelSpec& config_, spec::Recompute recompute_,
                                        const int32_t* inputs, const float* x,
                                        const int32_t* targets, const float* dy, int64_t batch,
                                        int64_t seq, float loss_scale, float* dx) {
  Impl& m = *this;
  kernels::Ops& ops = *m.ops;
  if (!m.StartCall(batch * seq) || !m.StartCp(seq)) return std::numeric_limits<float>::quiet_NaN();
  const BlockDims d = MakeBlockDims(config_, m.tp, batch, seq);
  m.Prepare(config_, recompute_, d);
  const int64_t layers = m.num_layers, t = d.tokens, vocab = m.tp.vocab;
  int64_t count = m.Forward(config_, d, m.train_acts, inputs, targets, x, nullptr);
  // [cp] The mean runs over the whole sequence: every CP rank's targets.
  if (m.part.head) count = static_cast<int64_t>(m.SumOverCp(static_cast<double>(count)));
  const float grad_scale = count > 0 ? loss_scale / static_cast<float>(count) : 0.0f;
  double tp_loss_sum = 0.0;
  const float* p = m.params.f32();
  float* g = m.grads.f32();
  if (m.replicated != nullptr) m.replicated->Zero();
  if (!m.part.head) {  // [pp] the next stage's gradient of this part's output
    ops.CopyDeviceToDevice(m.dx, dy, d.rows * d.hidden * static_cast<int64_t>(sizeof(float)));
  } else {
  if (!m.tp.active()) {
    ops.CrossEntropyForwardBackward(m.logits, m.targets, t, vocab, grad_scale, m.row_loss);
  } else {
    tp_loss_sum = m.vocab_loss->Run(m.logits, m.targets, targets, t, true, grad_scale);
  }
  // With sequence parallelism the LM head's input gradient is a partial sum
  // over the vocabulary shards, reduce-scattered to this rank's rows.
  float* dh_full = m.tp.sequence_parallel ? m.block_tp.partial : m.scratch.dh;

  const float* x_final = m.train_acts[layers].x_in;
  // m.logits now holds dLoss/dlogits. With tied embeddings lm_head == embed,
  // and the embedding's own gradient is added at the end.
  m.Hooks().BeforeUse(layers + 1, true);  // [hooks]
  ops.Gemm(Transpose::kYes, Transpose::kNo, vocab, d.hidden, t, 1.0f, m.logits, vocab, m.h_final,
           d.hidden, 1.0f, g + m.layout.lm_head, d.hidden);
  ops.Gemm(Transpose::kNo, Transpose::kNo, t, d.hidden, vocab, 1.0f, m.logits, vocab,
           p + m.layout.lm_head, d.hidden, 0.0f, dh_full, d.hidden);
  if (m.tp.active()) m.coll->ReduceRows(dh_full, t * d.hidden, m.scratch.dh);
  float* g_final_norm = m.replicated != nullptr ? m.replicated->FinalNorm(g) : g + m.layout.final_norm;
  ops.RmsNormBackward(m.scratch.dh, x_final, p + m.layout.final_norm, m.rstd_final, d.rows,
                      d.hidden, m.dx, false, g_final_norm);
  if (m.replicated != nullptr) m.replicated->ReduceFinal(g);
  m.Hooks().AfterUse(layers + 1, true);    // [hooks]
  m.Hooks().GradientsReady(layers + 1);    // [hooks]
  }
  const RopeView rope{m.rope_cos.f32(), m.rope_sin.f32()};
  for (int64_t l = layers - 1; l >= 0; --l) {
    const BlockActivations& a = m.train_acts[l];
    m.Hooks().BeforeUse(1 + l, true);  // [hooks]
    MoeBlock moe_block;
    const MoeBlock* moe = m.Moe(config_, l, d, loss_scale, &moe_block);
    if (recompute_ == spec::Recompute::kFull) {
      BlockForward(ops, d, m.Weights(l), rope, a, nullptr, m.Tp(), m.Cp(), moe);
    } else if (recompute_ == spec::Recompute::kSelective) {
      BlockAttentionCore(ops, d, a, m.Cp());
    }
    BlockBackward(ops, d, m.Weights(l), m.Grads(l), rope, a, m.scratch, m.dx, m.Tp(), m.Cp(),
                  moe);
    if (moe != nullptr) moe->layer->AddStats(m.MoeSlot(l), &m.moe_stats);  // [moe]
    if (m.replicated != nullptr) m.replicated->ReduceLayer(l, g);
    m.Hooks().AfterUse(1 + l, true);  // [hooks]
    m.Hooks().GradientsReady(1 + l);  // [hooks]
  }
  if (!m.part.embedding) {  // [pp] the previous stage's output gradient
    ops.CopyDeviceToDevice(dx, m.dx, d.rows * d.hidden * static_cast<int64_t>(sizeof(float)));
  } else if (!m.tp.active()) {
    ops.EmbeddingBackward(m.ids, t, m.dx, vocab, d.hidden, g + m.layout.embed);
  } else {
    const float* dy_rows = m.coll->GatherRows(m.dx, d.rows * d.hidden, m.block_tp.full);
    ops.EmbeddingShardBackward(m.ids, t, dy_rows, m.tp.vocab_first, m.tp.vocab, d.hidden,
                               g + m.layout.embed);
  }
  if (m.part.embedding) m.Hooks().GradientsReady(0);  // [hooks]
  if (m.Failed()) return std::numeric_limits<float>::quiet_NaN();
  if (!m.part.head) return 0.0f;
  if (m.tp.active()) {
    tp_loss_sum = m.SumOverCp(tp_loss_sum);  // [cp]
    if (m.Failed()) return std::numeric_limits<float>::quiet_NaN();
    return count > 0 ? static_cast<float>(tp_loss_sum / count) : 0.0f;
  }
  const float loss = m.MeanLoss(t, count);
  return m.Failed() ? std::numeric_limits<float>::quiet_NaN() : loss;
}

float LlamaModel::ForwardLoss(const int32_t* inputs, const int32_t* targets, int64_t batch,
                              int64_t seq) {
  return PartForwardLoss(inputs, nullptr, targets, batch, seq);
}

// ---- [pp] pipeline parts ---------------------------------------------------------

void LlamaModel::PartForward(const int32_t* inputs, const float* x, int64_t batch, int64_t seq,
                             float* y) {
  Impl& m = *impl_;
  if (m.part.head) {
    std::fprintf(stderr, "LlamaModel: PartForward on a part with the head (use PartForwardLoss)\n");
    std::abort();
  }
  if (!m.StartCall(batch * seq) || !m.StartCp(seq)) return;
  const BlockDims d = MakeBlockDims(config_, m.tp, batch, seq);
  m.Prepare(config_, recompute_, d);
  m.Forward(config_, d, m.eval_acts, inputs, nullptr, x, y);
  m.Failed();
}

float LlamaModel::PartForwardBackward(const int32_t* inputs, const float* x,
                                      const int32_t* targets, const float* dy, int64_t batch,
                                      int64_t seq, float loss_scale, float* dx) {
  return impl_->ForwardBackward(config_, recompute_, inputs, x, targets, dy, batch, seq,
                                loss_scale, dx);
}

int64_t LlamaModel::PartActivationFloats(int64_t batch, int64_t seq) const {
  return MakeBlockDims(config_, impl_->tp, batch, seq).rows * config_.hidden_size;
}

const ModelPart& LlamaModel::part() const { return impl_->part; }

float LlamaModel::PartForwardLoss(const int32_t* inputs, const float* x, const int32_t* targets,
                                  int64_t batch, int64_t seq) {
  Impl& m = *impl_;
  if (!m.part.head) {
    std::fprintf(stderr, "LlamaModel: PartForwardLoss on a part without the head\n");
    std::abort();
  }
  if (!m.StartCall(batch * seq) || !m.StartCp(seq)) return std::numeric_limits<float>::quiet_NaN();
  const BlockDims d = MakeBlockDims(config_, m.tp, batch, seq);
  m.Prepare(config_, recompute_, d);
  int64_t count = m.Forward(config_, d, m.eval_acts, inputs, targets, x, nullptr);
  count = static_cast<int64_t>(m.SumOverCp(static_cast<double>(count)));  // [cp]
  if (m.tp.active()) {
    const double sum =
        m.SumOverCp(m.vocab_loss->Run(m.logits, m.targets, targets, d.tokens, false, 0.0f));
    if (m.Failed()) return std::numeric_limits<float>::quiet_NaN();
    return count > 0 ? static_cast<float>(sum / count) : 0.0f;
  }
  ops_->CrossEntropyForward(m.logits, m.targets, d.tokens, config_.vocab_size, m.row_loss);
  const float loss = m.MeanLoss(d.tokens, count);
  return m.Failed() ? std::numeric_limits<float>::quiet_NaN() : loss;
}

int64_t LlamaModel::ContextParallelAttentionFlops() const {  // [cp]
  if (impl_->ring == nullptr) return 0;
  const RingFlops f = impl_->ring->flops();
  return f.forward + f.backward;
}

// ---- [moe] mixture-of-experts state --------------------------------------------

MoeStepStats LlamaModel::TakeMoeStats() {
  MoeStepStats out = std::move(impl_->moe_stats);
  impl_->moe_stats = MoeStepStats{};
  return out;
}

void LlamaModel::UpdateExpertBias(const std::vector<double>& tokens_per_expert) {
  const double rate = config_.moe.bias_update_rate;
  if (rate <= 0) return;
  const int64_t e_count = config_.moe.num_experts;
  int64_t slot = 0;
  for (size_t l = 0; l < impl_->moe.size(); ++l) {
    if (impl_->moe[l] == nullptr) continue;
    const size_t at = static_cast<size_t>(slot * e_count);
    if (tokens_per_expert.size() >= at + static_cast<size_t>(e_count)) {
      UpdateSelectionBias(tokens_per_expert.data() + at, e_count, rate, impl_->moe_bias[l].data());
    }
    ++slot;
  }
}

std::vector<TensorView> LlamaModel::ExpertBiases() {
  std::vector<TensorView> views;
  for (size_t l = 0; l < impl_->moe.size(); ++l) {
    if (impl_->moe[l] == nullptr) continue;
    const int64_t global = impl_->part.first_layer + static_cast<int64_t>(l);
    views.push_back({"model.layers." + std::to_string(global) + ".mlp.gate.e_score_correction_bias",
                     {config_.moe.num_experts},
                     impl_->moe_bias[l].data()});
  }
  return views;
}

void LlamaModel::SetExpertExchange(ExpertExchange* exchange) {
  impl_->exchange = exchange != nullptr ? exchange : impl_->local_exchange.get();
  for (auto& layer : impl_->moe) {
    if (layer != nullptr) layer = std::make_unique<MoeLayer>(ops_.get(), impl_->exchange);
  }
}

// [hooks] The data-parallel engine's hooks and memory accounting.
void LlamaModel::SetHooks(ModelHooks* hooks) { impl_->hooks = hooks; }

int64_t LlamaModel::ActivationBytes() const {
  int64_t bytes = impl_->rope_cos.bytes() + impl_->rope_sin.bytes();
  for (const Buffer& b : impl_->pool) bytes += b.bytes();
  if (impl_->ring != nullptr) bytes += impl_->ring->BufferBytes();  // [cp]
  for (const auto& layer : impl_->moe) bytes += layer != nullptr ? layer->ActivationBytes() : 0;
  return bytes;
}

}  // namespace loom::engine
