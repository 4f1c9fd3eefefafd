// An independent double-precision Llama forward for the model tests, written
// from the architecture (Hugging Face LlamaForCausalLM) on top of the plain
// reference ops, with parameters looked up by Hugging Face name. Used for the
// loss check and as the function the finite differences differentiate.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "kernels/reference/attention.h"
#include "kernels/reference/dense.h"
#include "kernels/reference/loss_optim.h"

namespace loom::engine::testing {

using ParamMap = std::map<std::string, std::vector<double>>;

// y[t, o] = sum_i x[t, i] * w[o, i]
inline std::vector<double> Linear(const std::vector<double>& x, const std::vector<double>& w,
                                  int64_t tokens, int64_t in, int64_t out) {
  std::vector<double> y(tokens * out, 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
  return y;
}

inline double ReferenceLlamaLoss(const spec::ModelSpec& c, const ParamMap& p,
                                 const std::vector<int32_t>& inputs,
                                 const std::vector<int32_t>& targets, int64_t batch, int64_t seq) {
  namespace ref = kernels::reference;
  const int64_t t = batch * seq, h = c.hidden_size, hd = c.head_dim();
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd, f = c.ffn_hidden_size;
  const double eps = c.norm_eps;
  std::vector<double> x(t * h), hn(t * h), rstd(t);
  ref::EmbeddingForward(inputs.data(), t, p.at("model.embed_tokens.weight").data(), h, x.data());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    ref::RmsNormForward(x.data(), p.at(pre + "input_layernorm.weight").data(), t, h, eps,
                        hn.data(), rstd.data());
    auto q = Linear(hn, p.at(pre + "self_attn.q_proj.weight"), t, h, qd);
    auto k = Linear(hn, p.at(pre + "self_attn.k_proj.weight"), t, h, kvd);
    auto v = Linear(hn, p.at(pre + "self_attn.v_proj.weight"), t, h, kvd);
    ref::Rope(q.data(), batch, seq, c.num_heads, hd, qd, c.rope_theta, 0, false);
    ref::Rope(k.data(), batch, seq, c.num_kv_heads, hd, kvd, c.rope_theta, 0, false);
    kernels::AttentionDims d;
    d.batch = batch;
    d.seq_q = d.seq_kv = seq;
    d.num_heads = c.num_heads;
    d.num_kv_heads = c.num_kv_heads;
    d.head_dim = hd;
    d.causal = true;
    d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    d.q_row_stride = d.o_row_stride = qd;
    d.k_row_stride = d.v_row_stride = kvd;
    std::vector<double> attn(t * qd), lse(batch * c.num_heads * seq);
    ref::AttentionForward(d, q.data(), k.data(), v.data(), attn.data(), lse.data());
    const auto o = Linear(attn, p.at(pre + "self_attn.o_proj.weight"), t, qd, h);
    for (int64_t i = 0; i < t * h; ++i) x[i] += o[i];
    ref::RmsNormForward(x.data(), p.at(pre + "post_attention_layernorm.weight").data(), t, h, eps,
                        hn.data(), rstd.data());
    const auto gate = Linear(hn, p.at(pre + "mlp.gate_proj.weight"), t, h, f);
    const auto up = Linear(hn, p.at(pre + "mlp.up_proj.weight"), t, h, f);
    std::vector<double> act(t * f);
    ref::SwiGluForward(t, f, gate.data(), up.data(), f, act.data(), f);
    const auto down = Linear(act, p.at(pre + "mlp.down_proj.weight"), t, f, h);
    for (int64_t i = 0; i < t * h; ++i) x[i] += down[i];
  }
  ref::RmsNormForward(x.data(), p.at("model.norm.weight").data(), t, h, eps, hn.data(),
                      rstd.data());
  const auto& head = c.tie_embeddings ? p.at("model.embed_tokens.weight") : p.at("lm_head.weight");
  const auto logits = Linear(hn, head, t, h, c.vocab_size);
  std::vector<double> row_loss(t);
  ref::CrossEntropy(logits.data(), targets.data(), t, c.vocab_size, 0.0, row_loss.data(),
                    static_cast<double*>(nullptr));
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < t; ++i) {
    sum += row_loss[i];
    count += targets[i] >= 0 ? 1 : 0;
  }
  return count > 0 ? sum / count : 0.0;
}

}  // namespace loom::engine::testing
