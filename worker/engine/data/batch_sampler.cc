#include "worker/engine/data/batch_sampler.h"

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void CopyWindow(const TokenDataset& data, int64_t start, int64_t seq, int64_t row, Batch* out) {
  const uint16_t* src = data.data() + start;
  int32_t* in = out->inputs.data() + row * seq;
  int32_t* tg = out->targets.data() + row * seq;
  for (int64_t t = 0; t < seq; ++t) {
    in[t] = src[t];
    tg[t] = src[t + 1];
  }
}

void Resize(Batch* out, int64_t count, int64_t seq) {
  out->batch = count;
  out->seq = seq;
  out->inputs.resize(static_cast<size_t>(count * seq));
  out->targets.resize(static_cast<size_t>(count * seq));
}

}  // namespace

uint64_t WindowHash(uint64_t seed, int64_t step, int64_t index) {
  uint64_t h = Mix64(seed);
  h = Mix64(h ^ static_cast<uint64_t>(step));
  return Mix64(h ^ static_cast<uint64_t>(index));
}

TrainSampler::TrainSampler(const TokenDataset* data, uint64_t seed, int64_t seq_len)
    : data_(data), seed_(seed), seq_len_(seq_len) {}

int64_t TrainSampler::WindowStart(int64_t step, int64_t index) const {
  // size - seq_len valid starts; multiply-high maps the hash onto them.
  const uint64_t starts = static_cast<uint64_t>(data_->size() - seq_len_);
  const unsigned __int128 wide =
      static_cast<unsigned __int128>(WindowHash(seed_, step, index)) * starts;
  return static_cast<int64_t>(wide >> 64);
}

void TrainSampler::Fill(int64_t step, int64_t first, int64_t count, Batch* out) const {
  Resize(out, count, seq_len_);
  for (int64_t r = 0; r < count; ++r) {
    CopyWindow(*data_, WindowStart(step, first + r), seq_len_, r, out);
  }
}

int64_t MicroBatchFirst(int64_t global_batch, int64_t dp_size, int64_t dp_rank,
                        int64_t micro_batch, int64_t micro) {
  return dp_rank * (global_batch / dp_size) + micro * micro_batch;
}

void FillValidationWindows(const TokenDataset& data, int64_t seq_len, int64_t first,
                           int64_t count, Batch* out) {
  Resize(out, count, seq_len);
  for (int64_t r = 0; r < count; ++r) CopyWindow(data, (first + r) * seq_len, seq_len, r, out);
}

absl::Status CheckValidationSize(const TokenDataset& data, int64_t seq_len, int64_t windows) {
  const int64_t need = windows * seq_len + 1;
  if (data.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation data ", data.path(), ": ", data.size(), " tokens, but train.eval_windows=",
        windows, " windows of train.seq_len=", seq_len, " need ", need,
        " (use a longer file or fewer eval_windows)"));
  }
  return absl::OkStatus();
}

absl::Status CheckTrainSize(const TokenDataset& data, int64_t seq_len) {
  if (data.size() < seq_len + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training data ", data.path(), ": ", data.size(),
                     " tokens, but one window of train.seq_len=", seq_len, " needs ", seq_len + 1));
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
