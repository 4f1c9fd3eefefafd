// A rank's whole training state at a step boundary, in host memory: the
// in-memory snapshot of in-place recovery (docs/fault_tolerance.md, "In-place
// recovery"). It holds every piece of state the rank holds, in every layout
// (parameters, AdamW moments, ZeRO's ranges, TP slices, EP experts, the
// replicated pieces a checkpoint would not write, MoE selection biases) and
// the step, tokens and optimizer step; the data position and every RNG are
// functions of the step (docs/engine.md). What a piece is comes from the
// training loop's list of pieces (TrainingLoop::CheckpointPieces), the same
// list checkpoints use.
//
// A snapshot is one contiguous image, which is also its serialized form: a
// fixed header, the manifest (JSON: owner, step counters, every piece's name,
// shapes and range) and the pieces' floats. Capturing writes into the image,
// a copy to another rank sends the image as it is, and a received image is
// parsed in place. The manifest lets a restore refuse a snapshot of another
// rank or layout with an error naming the difference (CheckSnapshotFits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loom::engine {

// One piece of state: elements [begin, begin + count) of a local tensor (a
// whole tensor, a TP slice of one, or ZeRO's range of that slice).
struct SnapshotPiece {
  // The parameter, one of its AdamW moments ("optimizer.exp_avg.<name>"), or
  // an MoE layer's selection bias ("moe_bias.<name>").
  std::string name;
  int64_t part = 0;                   // the model part (pipeline chunk) holding it
  std::vector<int64_t> shape;         // the local tensor's shape
  std::vector<int64_t> global_shape;  // the global tensor's (equal to shape when whole)
  int shard_axis = -1;                // the local tensor's place in the global one
  int64_t shard_offset = 0;
  int64_t begin = 0;
  int64_t count = 0;
  int64_t offset = 0;  // where its floats start among the snapshot's floats
  // A checkpoint of its rank writes it (the rank holds its only copy, or is
  // the one replica that writes it: ParallelContext::writes_shards): what a
  // snapshot written as a checkpoint step writes (snapshot_spill.h).
  bool write = false;

  bool operator==(const SnapshotPiece&) const = default;
};

// Whether two pieces are the same range of the same global tensor (their
// place in an image aside). Two ranks' pieces that are the same hold the
// same floats at the same step: a replicated piece (DP, CP, a TP-replicated
// norm) is updated alike everywhere, as checkpoints assume when they write
// it once (ParallelContext::writes_shards).
bool SamePiece(const SnapshotPiece& a, const SnapshotPiece& b);
// A 64-bit digest of what SamePiece compares: what a buddy tells its ward it
// holds, so the ward's copy leaves those pieces out (snapshot_transfer.h).
uint64_t SnapshotPieceKey(const SnapshotPiece& piece);

// Whose state it is: a restore accepts only its own rank's and layout's.
struct SnapshotOwner {
  int rank = -1;       // the global rank (-1: not given, not checked)
  std::string layout;  // "dp4 tp1 pp1 cp1 ep1 zero1 v1"
  std::string place;   // "dp 1/4 tp 0/1 pp 0/1 cp 0/1 ep 0/1"

  bool operator==(const SnapshotOwner&) const = default;
};

struct SnapshotManifest {
  SnapshotOwner owner;
  int64_t step = 0;  // optimizer steps completed
  int64_t tokens = 0;
  int64_t optimizer_step = 0;
  std::vector<SnapshotPiece> pieces;

  // Floats the pieces need (the end of the furthest one).
  int64_t data_floats() const;
};

// OK when a rank whose snapshot would be `want` may restore `got`; else
// FAILED_PRECONDITION naming the first difference: the rank, the layout, the
// place in the mesh, or a piece (name, part, shapes, range).
absl::Status CheckSnapshotFits(const SnapshotManifest& want, const SnapshotManifest& got);

class Snapshot {
 public:
  Snapshot() = default;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  // Lays the image out for `manifest` (its pieces' offsets must be laid out,
  // see SnapshotManifest::pieces), reusing the buffer when it is large
  // enough; the floats are left as they were (the capture overwrites them).
  void Reset(SnapshotManifest manifest);

  // Receiving an image: a buffer of `bytes` (reused when large enough) to
  // write it into, then Adopt() parses it in place. Until Adopt() succeeds
  // the snapshot is empty.
  std::span<std::byte> PrepareReceive(int64_t bytes);
  // DATA_LOSS naming what is wrong: magic, version, sizes, a malformed
  // manifest, a piece outside the floats.
  absl::Status Adopt();

  bool empty() const { return !valid_; }
  // A buddy's copy whose pieces that the buddy holds itself were left out
  // (snapshot_transfer.h): their indices, to be filled from the holder's
  // own snapshot of the same step before the copy is restored or passed on.
  const std::vector<size_t>& borrowed() const { return borrowed_; }
  void set_borrowed(std::vector<size_t> pieces) { borrowed_ = std::move(pieces); }
  // Fills the borrowed pieces from `holder` (a snapshot of the same step
  // holding the same pieces) and makes the copy whole; FAILED_PRECONDITION
  // naming the step or the piece that `holder` lacks.
  absl::Status FillBorrowed(const Snapshot& holder);
  const SnapshotManifest& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.step; }
  // The pieces' floats (piece i at manifest().pieces[i].offset).
  float* data();
  const float* data() const;
  // The whole image, the serialized form (a multiple of 4 bytes).
  std::span<const std::byte> bytes() const;
  int64_t size_bytes() const { return static_cast<int64_t>(size_); }

 private:
  void Reserve(size_t bytes);

  SnapshotManifest manifest_;
  std::unique_ptr<std::byte[]> buffer_;
  size_t capacity_ = 0;
  size_t size_ = 0;
  size_t data_offset_ = 0;
  bool valid_ = false;
  std::vector<size_t> borrowed_;
};

// Assigns each piece its offset, in order (what Snapshot::Reset expects).
void LayOutSnapshotPieces(SnapshotManifest* manifest);

}  // namespace loom::engine
