// Helpers for the tensor-parallel tests: tiny configs, random batches, and
// assembling global tensors from the ranks' shards (checking that replicas
// agree bit for bit).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine::testing {

using TensorMap = std::map<std::string, std::vector<float>>;

// A snapshot of one rank's view: the values copied, the sharding kept.
struct Shard {
  TensorView view;  // data is null; the values are in `values`
  std::vector<float> values;
};

inline std::vector<Shard> Snapshot(const std::vector<TensorView>& views) {
  std::vector<Shard> out;
  for (const TensorView& v : views) {
    Shard s{v, std::vector<float>(v.data, v.data + v.numel())};
    s.view.data = nullptr;
    out.push_back(std::move(s));
  }
  return out;
}

// Puts every rank's slice into its global tensor. A slice held by several
// ranks must be identical on all of them, and the slices must cover the
// tensor exactly once (up to those replicas).
inline TensorMap Assemble(const std::vector<std::vector<Shard>>& ranks) {
  TensorMap global;
  std::map<std::string, std::vector<int>> holders;  // per element: how many ranks wrote it
  for (const auto& shards : ranks) {
    for (const Shard& s : shards) {
      const TensorView& v = s.view;
      const std::vector<int64_t>& gs = v.GlobalShape();
      int64_t n = 1;
      for (int64_t d : gs) n *= d;
      std::vector<float>& g = global[v.name];
      std::vector<int>& h = holders[v.name];
      if (g.empty()) {
        g.assign(static_cast<size_t>(n), 0.0f);
        h.assign(static_cast<size_t>(n), 0);
      }
      const int64_t rows = v.shape[0];
      const int64_t cols = v.shape.size() > 1 ? v.shape[1] : 1;
      const int64_t gcols = gs.size() > 1 ? gs[1] : 1;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t gr = v.shard_axis == 0 ? r + v.shard_offset : r;
          const int64_t gc = v.shard_axis == 1 ? c + v.shard_offset : c;
          const size_t gi = static_cast<size_t>(gr * gcols + gc);
          const float x = s.values[static_cast<size_t>(r * cols + c)];
          if (h[gi] > 0) {
            EXPECT_EQ(g[gi], x) << v.name << " replicas differ at " << gi;
          }
          g[gi] = x;
          ++h[gi];
        }
      }
    }
  }
  // Every element is held, and by as many ranks as its views claim.
  for (const auto& shards : ranks) {
    for (const Shard& s : shards) {
      const std::vector<int>& h = holders[s.view.name];
      const int expect = s.view.replicas;
      EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](int c) { return c > 0; })) << s.view.name;
      // Spot-check: the element this view starts at is held `replicas` times.
      const std::vector<int64_t>& gs = s.view.GlobalShape();
      const int64_t gcols = gs.size() > 1 ? gs[1] : 1;
      const int64_t gr = s.view.shard_axis == 0 ? s.view.shard_offset : 0;
      const int64_t gc = s.view.shard_axis == 1 ? s.view.shard_offset : 0;
      EXPECT_EQ(h[static_cast<size_t>(gr * gcols + gc)], expect) << s.view.name;
    }
  }
  return global;
}

inline TensorMap ToMap(const std::vector<TensorView>& views) {
  TensorMap m;
  for (const TensorView& v : views) m[v.name].assign(v.data, v.data + v.numel());
  return m;
}

// max |a - b| over max |b| (floored), per tensor: relative to the tensor's
// scale, so entries near zero do not blow the ratio up.
inline double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

// ||a - b|| / ||b|| (L2, floored): the relative error of the tensor as a whole.
inline double NormRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    diff += d * d;
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-12);
}

// Every tensor of `got` within `tol` of `want`: by MaxRelDiff, or with
// in_norm by NormRelDiff.
inline void ExpectMapsNear(const TensorMap& got, const TensorMap& want, double tol,
                           const std::string& what, bool in_norm = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": " << name << " missing";
    ASSERT_EQ(it->second.size(), w.size()) << what << ": " << name;
    const double d = in_norm ? NormRelDiff(it->second, w) : MaxRelDiff(it->second, w);
    EXPECT_LE(d, tol) << what << ": " << name;
  }
}

inline spec::ModelSpec TinyModel(int64_t heads, int64_t kv_heads, bool tied) {
  spec::ModelSpec c;
  c.vocab_size = 37;  // uneven over 2 and 4 ranks
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.ffn_hidden_size = 48;
  c.max_seq_len = 64;
  c.tie_embeddings = tied;
  return c;
}

struct TokenBatch {
  std::vector<int32_t> inputs, targets;
  int64_t batch = 0, seq = 0;
};

inline TokenBatch RandomTokens(int64_t batch, int64_t seq, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  TokenBatch b;
  b.batch = batch;
  b.seq = seq;
  for (int64_t i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(dist(gen));
    b.targets.push_back(dist(gen));
  }
  b.targets[3] = -1;  // an ignored target
  return b;
}

}  // namespace loom::engine::testing
