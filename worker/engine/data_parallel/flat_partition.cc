#include "worker/engine/data_parallel/flat_partition.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::engine {

int64_t UnitOfParameter(const std::string& name, int64_t num_layers) {
  if (name.rfind("model.embed_tokens.", 0) == 0) return 0;
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) == 0) {
    const size_t dot = name.find('.', prefix.size());
    int64_t layer = 0;
    if (dot != std::string::npos &&
        absl::SimpleAtoi(name.substr(prefix.size(), dot - prefix.size()), &layer) && layer >= 0 &&
        layer < num_layers) {
      return 1 + layer;
    }
  }
  return num_layers + 1;
}

absl::StatusOr<FlatPartition> FlatPartition::Build(std::vector<FlatTensor> tensors,
                                                   int64_t num_units,
                                                   const PartitionOptions& options) {
  if (options.ranks < 1) return absl::InvalidArgumentError("partition: ranks must be positive");
  FlatPartition p;
  p.ranks_ = options.ranks;
  int64_t expect = 0;
  int64_t last_unit = 0;
  for (const FlatTensor& t : tensors) {
    if (t.offset != expect || t.numel < 0 || t.unit < last_unit || t.unit >= num_units) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: tensor ", t.name, " at offset ", t.offset, " (unit ", t.unit,
          ") breaks the contiguous, unit-ordered flat layout (expected offset ", expect, ")"));
    }
    expect += t.numel;
    last_unit = t.unit;
  }
  p.total_ = expect;
  p.tensors_ = std::move(tensors);
  const int64_t cap = std::max<int64_t>(1, options.bucket_floats);

  // From the end: backward finishes the last tensors first.
  FlatBucket current;
  bool open = false;
  int64_t current_unit = -1;
  for (int64_t i = static_cast<int64_t>(p.tensors_.size()) - 1; i >= 0; --i) {
    const FlatTensor& t = p.tensors_[i];
    if (t.numel == 0) continue;
    const bool unit_break = options.split_at_units && t.unit != current_unit;
    if (open && (current.size() + t.numel > cap || unit_break)) {
      p.buckets_.push_back(current);
      open = false;
    }
    if (!open) {
      current = FlatBucket{t.offset, t.offset + t.numel};
      current_unit = t.unit;
      open = true;
    } else {
      current.begin = t.offset;
    }
    current.ready_unit = t.unit;
  }
  if (open) p.buckets_.push_back(current);

  p.ready_.assign(num_units, {});
  p.inside_.assign(num_units, {});
  int64_t shard = 0;
  for (size_t b = 0; b < p.buckets_.size(); ++b) {
    FlatBucket& k = p.buckets_[b];
    k.chunk = (k.size() + p.ranks_ - 1) / p.ranks_;
    k.shard_offset = shard;
    shard += k.chunk;
    p.ready_[k.ready_unit].push_back(static_cast<int>(b));
    // The unit of the last element: equal to ready_unit when the bucket lies
    // inside one unit.
    int64_t end_unit = k.ready_unit;
    for (const FlatTensor& t : p.tensors_) {
      if (t.offset < k.end && t.offset + t.numel >= k.end && t.numel > 0) end_unit = t.unit;
    }
    if (end_unit == k.ready_unit) p.inside_[k.ready_unit].push_back(static_cast<int>(b));
  }
  p.shard_size_ = shard;
  return p;
}

int64_t FlatPartition::OwnedBegin(const FlatBucket& b, int rank) const {
  return std::min(b.end, b.begin + rank * b.chunk);
}
int64_t FlatPartition::OwnedEnd(const FlatBucket& b, int rank) const {
  return std::min(b.end, b.begin + (rank + 1) * b.chunk);
}

std::vector<OwnedPiece> FlatPartition::OwnedPieces(int rank) const {
  std::vector<OwnedPiece> out;
  for (const FlatBucket& b : buckets_) {
    const int64_t lo = OwnedBegin(b, rank), hi = OwnedEnd(b, rank);
    if (lo >= hi) continue;
    // Tensors are sorted by offset: find the first one that ends after lo.
    auto it = std::upper_bound(tensors_.begin(), tensors_.end(), lo,
                               [](int64_t x, const FlatTensor& t) { return x < t.offset + t.numel; });
    for (; it != tensors_.end() && it->offset < hi; ++it) {
      const int64_t a = std::max(lo, it->offset), z = std::min(hi, it->offset + it->numel);
      if (a >= z) continue;
      out.push_back({static_cast<int64_t>(it - tensors_.begin()), a, z - a,
                     b.shard_offset + (a - lo)});
    }
  }
  return out;
}

int64_t RectSlice::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// Appends the slices of [begin, end) (element offsets within the sub-tensor
// of dimensions dims[d:]) with the leading offsets already fixed in `prefix`.
void Cut(const std::vector<int64_t>& dims, size_t d, int64_t begin, int64_t end,
         std::vector<int64_t>& prefix, int64_t base, std::vector<RectSlice>& out) {
  if (begin >= end) return;
  if (d == dims.size()) {  // a scalar
    out.push_back({prefix, {}, base});
    return;
  }
  int64_t inner = 1;
  for (size_t i = d + 1; i < dims.size(); ++i) inner *= dims[i];
  auto emit_rows = [&](int64_t first, int64_t rows) {
    RectSlice s;
    s.offset = prefix;
    s.offset.push_back(first);
    s.shape.assign(prefix.size(), 1);
    s.shape.push_back(rows);
    for (size_t i = d + 1; i < dims.size(); ++i) {
      s.offset.push_back(0);
      s.shape.push_back(dims[i]);
    }
    s.flat_begin = base + first * inner;
    out.push_back(std::move(s));
  };
  const int64_t first_row = begin / inner, last_row = (end - 1) / inner;
  if (begin % inner == 0 && end % inner == 0) {
    emit_rows(first_row, last_row - first_row + 1);
    return;
  }
  auto partial = [&](int64_t row, int64_t lo, int64_t hi) {
    prefix.push_back(row);
    Cut(dims, d + 1, lo, hi, prefix, base + row * inner, out);
    prefix.pop_back();
  };
  if (first_row == last_row) {
    partial(first_row, begin - first_row * inner, end - first_row * inner);
    return;
  }
  int64_t full_from = first_row;
  if (begin % inner != 0) {
    partial(first_row, begin - first_row * inner, inner);
    full_from = first_row + 1;
  }
  const int64_t full_to = end % inner == 0 ? last_row + 1 : last_row;
  if (full_to > full_from) emit_rows(full_from, full_to - full_from);
  if (end % inner != 0) partial(last_row, 0, end - last_row * inner);
}

}  // namespace

std::vector<RectSlice> FlatRangeToSlices(const std::vector<int64_t>& shape, int64_t begin,
                                         int64_t count) {
  std::vector<RectSlice> out;
  std::vector<int64_t> prefix;
  Cut(shape, 0, begin, begin + count, prefix, 0, out);
  return out;
}

std::vector<RectSlice> ShardRangeToGlobalSlices(const std::vector<int64_t>& shape, int shard_axis,
                                                int64_t shard_offset, int64_t begin,
                                                int64_t count) {
  std::vector<RectSlice> rects = FlatRangeToSlices(shape, begin, count);
  if (shard_axis >= 0) {
    for (RectSlice& r : rects) r.offset[static_cast<size_t>(shard_axis)] += shard_offset;
  }
  return rects;
}

}  // namespace loom::engine
