#include "worker/engine/context_parallel/ring_attention.h"

#include <span>
#include <utility>

namespace loom::engine {
namespace {

// Tags of ring messages: one range per call, one tag per step and kind, so
// two calls' messages never match (the pipeline's tags stay below 2^24).
constexpr uint32_t kTagBase = 0x43500000u;
uint32_t Tag(uint32_t call, int step, int kind) {
  return kTagBase + ((call & 0xfffu) << 8) + static_cast<uint32_t>(step) * 2 +
         static_cast<uint32_t>(kind);
}

absl::Status Join(absl::Status a, std::unique_ptr<comm::Work>& w) {
  if (w == nullptr) return a;
  absl::Status s = w->Wait();
  w.reset();
  return a.ok() ? s : a;
}

}  // namespace

RingTraffic RingTrafficBytes(const RingDims& d, const ZigzagSplit& z) {
  const int64_t block = RingKvFloats(d, z) * static_cast<int64_t>(sizeof(float));
  if (z.cp <= 1) return {};
  return {(z.cp - 1) * block, (2 * z.cp - 1) * block};
}

RingAttention::RingAttention(kernels::Ops& ops, comm::Communicator& cp) : ops_(ops), cp_(cp) {}

RingFlops RingAttention::flops() const {
  RingFlops f = done_;
  if (blocks_ != nullptr) {
    f.forward += blocks_->flops().forward;
    f.backward += blocks_->flops().backward;
  }
  return f;
}

int64_t RingAttention::BufferBytes() const {
  int64_t bytes = q_.bytes() + dq_.bytes();
  for (int i = 0; i < 2; ++i) bytes += kv_[i].bytes() + dkv_[i].bytes();
  bytes += dkv_share_.bytes();
  if (blocks_ != nullptr) bytes += blocks_->ScratchBytes();
  return bytes;
}

void RingAttention::Prepare(const RingDims& d, const ZigzagSplit& z, const float* qkv,
                            int64_t qkv_stride) {
  const bool same = blocks_ != nullptr && d.batch == dims_.batch && d.heads == dims_.heads &&
                    d.kv_heads == dims_.kv_heads && d.head_dim == dims_.head_dim &&
                    d.causal == dims_.causal && d.scale == dims_.scale &&
                    z.seq_len == split_.seq_len && z.cp == split_.cp;
  if (!same) {
    if (blocks_ != nullptr) {
      done_.forward += blocks_->flops().forward;
      done_.backward += blocks_->flops().backward;
    }
    dims_ = d;
    split_ = z;
    blocks_ = std::make_unique<RingBlocks>(ops_, d, z, cp_.rank());
    q_ = ops_.AllocateFloats(RingQFloats(d, z));
    dq_ = ops_.AllocateFloats(RingQFloats(d, z));
    for (int i = 0; i < 2; ++i) {
      kv_[i] = ops_.AllocateFloats(RingKvFloats(d, z));
      dkv_[i] = ops_.AllocateFloats(RingKvFloats(d, z));
    }
    dkv_share_ = ops_.AllocateFloats(RingKvFloats(d, z));
  }
  const int64_t rows = d.batch * z.local_seq(), qw = d.q_width(), kw = d.kv_width();
  ops_.CopyRows(rows, qw, qkv, qkv_stride, q_.f32(), qw);
  ops_.CopyRows(rows, kw, qkv + qw, qkv_stride, kv_[0].f32(), kw);
  ops_.CopyRows(rows, kw, qkv + qw + kw, qkv_stride, kv_[0].f32() + rows * kw, kw);
}

absl::Status RingAttention::Exchange(kernels::Buffer& send, kernels::Buffer& recv,
                                     int64_t floats, uint32_t tag,
                                     std::unique_ptr<comm::Work>* sent,
                                     std::unique_ptr<comm::Work>* received) {
  const int n = cp_.size(), r = cp_.rank();
  // The communicator reads and writes backend memory the ops may still be
  // working on (on a device: the previous step's blocks read `recv`).
  ops_.Synchronize();
  *received = cp_.RecvAsync(std::span<float>(recv.f32(), static_cast<size_t>(floats)),
                            (r - 1 + n) % n, tag);
  *sent = cp_.SendAsync(std::span<const float>(send.f32(), static_cast<size_t>(floats)),
                        (r + 1) % n, tag);
  // Both halves of this rank's hop are posted: start them now, so that they
  // run while the step's blocks compute (NCCL would otherwise hold them until
  // the wait after the blocks).
  cp_.StartPosted();
  return absl::OkStatus();
}

absl::Status RingAttention::Forward(const RingDims& d, const ZigzagSplit& z, const float* qkv,
                                    int64_t qkv_stride, float* out, float* lse) {
  Prepare(d, z, qkv, qkv_stride);
  const int n = cp_.size(), r = cp_.rank();
  const uint32_t call = calls_++;
  const int64_t kv_floats = RingKvFloats(d, z);
  blocks_->BeginForward(out, lse);
  int cur = 0;
  absl::Status status;
  for (int step = 0; step < n && status.ok(); ++step) {
    std::unique_ptr<comm::Work> sent, received;
    if (step + 1 < n) {
      status = Exchange(kv_[cur], kv_[1 - cur], kv_floats, Tag(call, step, 0), &sent, &received);
    }
    blocks_->ForwardBlock(q_.f32(), kv_[cur].f32(), (r - step + n) % n, out, lse);
    status = Join(Join(status, sent), received);
    cur = 1 - cur;
  }
  return status;
}

absl::Status RingAttention::Backward(const RingDims& d, const ZigzagSplit& z, const float* qkv,
                                     int64_t qkv_stride, const float* out, const float* lse,
                                     const float* d_out, float* dqkv) {
  Prepare(d, z, qkv, qkv_stride);
  const int n = cp_.size(), r = cp_.rank();
  const uint32_t call = calls_++;
  const int64_t kv_floats = RingKvFloats(d, z);
  ops_.Fill(dq_.f32(), RingQFloats(d, z), 0.0f);
  int cur = 0, dcur = 0;
  absl::Status status;
  // The dK/dV accumulators' hop, posted at the end of one step and waited
  // for in the next, after its blocks: it overlaps them as the K/V hop does.
  std::unique_ptr<comm::Work> dsent, dreceived;
  for (int step = 0; step < n && status.ok(); ++step) {
    std::unique_ptr<comm::Work> sent, received;
    if (step + 1 < n) {
      status = Exchange(kv_[cur], kv_[1 - cur], kv_floats, Tag(call, step, 0), &sent, &received);
    }
    // This step's share of owner r - s's dK/dV (at step 0, this rank's own:
    // the accumulator starts from it).
    float* share = step == 0 ? dkv_[dcur].f32() : dkv_share_.f32();
    ops_.Fill(share, kv_floats, 0.0f);
    blocks_->BackwardBlock(q_.f32(), kv_[cur].f32(), (r - step + n) % n, out, lse, d_out,
                           dq_.f32(), share);
    if (n > 1 && status.ok()) {
      if (step > 0) {  // the owner's accumulator from the previous rank, plus this share
        status = Join(Join(status, dsent), dreceived);
        if (status.ok()) ops_.Axpy(kv_floats, 1.0f, share, dkv_[dcur].f32());
      }
      // On to the next rank; after the last step each reaches its owner
      // (r - (n - 1) = r + 1, the next rank), and this rank receives its own.
      if (status.ok()) {
        status = Exchange(dkv_[dcur], dkv_[1 - dcur], kv_floats, Tag(call, step, 1), &dsent,
                          &dreceived);
        dcur = 1 - dcur;
      }
    }
    status = Join(Join(status, sent), received);
    cur = 1 - cur;
  }
  status = Join(Join(status, dsent), dreceived);
  if (!status.ok()) return status;
  const int64_t rows = d.batch * z.local_seq(), qw = d.q_width(), kw = d.kv_width();
  ops_.CopyRows(rows, qw, dq_.f32(), qw, dqkv, qkv_stride);
  ops_.CopyRows(rows, kw, dkv_[dcur].f32(), kw, dqkv + qw, qkv_stride);
  ops_.CopyRows(rows, kw, dkv_[dcur].f32() + rows * kw, kw, dqkv + qw + kw, qkv_stride);
  return absl::OkStatus();
}

}  // namespace loom::engine
