#include "worker/engine/snapshot/snapshot.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace loom::engine {
namespace {

using json = nlohmann::json;

// The image: header | manifest JSON | padding to kAlign | floats. Integers in
// the host's byte order: both ends of a copy are ranks of one job.
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'S', 'N', 'A', 'P'};
constexpr uint32_t kVersion = 2;  // 2: a piece says whether a checkpoint writes it
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t manifest_bytes;
  uint64_t data_offset;
  uint64_t data_floats;
};
static_assert(sizeof(Header) == 40);
constexpr size_t kAlign = 64;
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string RangeText(const SnapshotPiece& p) {
  return absl::StrCat(p.name, " (part ", p.part, ", shape [", absl::StrJoin(p.shape, ","), "] of [",
                      absl::StrJoin(p.global_shape, ","), "] at axis ", p.shard_axis, " offset ",
                      p.shard_offset, ", elements [", p.begin, ", ", p.begin + p.count, "))");
}

std::string OwnerText(const SnapshotOwner& o) {
  return absl::StrCat(o.rank >= 0 ? absl::StrCat("rank ", o.rank, ", ") : "", o.place, ", layout ",
                      o.layout);
}

json ManifestToJson(const SnapshotManifest& m) {
  json pieces = json::array();
  for (const SnapshotPiece& p : m.pieces) {
    pieces.push_back({p.name, p.part, p.shape, p.global_shape, p.shard_axis, p.shard_offset,
                      p.begin, p.count, p.offset, p.write});
  }
  return {{"rank", m.owner.rank},       {"layout", m.owner.layout},
          {"place", m.owner.place},     {"step", m.step},
          {"tokens", m.tokens},         {"optimizer_step", m.optimizer_step},
          {"pieces", std::move(pieces)}};
}

absl::Status ManifestFromJson(const std::string& text, SnapshotManifest* out) {
  try {
    const json j = json::parse(text);
    SnapshotManifest m;
    m.owner.rank = j.at("rank").get<int>();
    m.owner.layout = j.at("layout").get<std::string>();
    m.owner.place = j.at("place").get<std::string>();
    m.step = j.at("step").get<int64_t>();
    m.tokens = j.at("tokens").get<int64_t>();
    m.optimizer_step = j.at("optimizer_step").get<int64_t>();
    for (const json& e : j.at("pieces")) {
      if (!e.is_array() || e.size() != 10) {
        return absl::DataLossError("snapshot image: manifest: a piece is not 10 fields");
      }
      SnapshotPiece p;
      p.name = e[0].get<std::string>();
      p.part = e[1].get<int64_t>();
      p.shape = e[2].get<std::vector<int64_t>>();
      p.global_shape = e[3].get<std::vector<int64_t>>();
      p.shard_axis = e[4].get<int>();
      p.shard_offset = e[5].get<int64_t>();
      p.begin = e[6].get<int64_t>();
      p.count = e[7].get<int64_t>();
      p.offset = e[8].get<int64_t>();
      p.write = e[9].get<bool>();
      m.pieces.push_back(std::move(p));
    }
    *out = std::move(m);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("snapshot image: manifest: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

bool SamePiece(const SnapshotPiece& a, const SnapshotPiece& b) {
  return a.name == b.name && a.part == b.part && a.shape == b.shape &&
         a.global_shape == b.global_shape && a.shard_axis == b.shard_axis &&
         a.shard_offset == b.shard_offset && a.begin == b.begin && a.count == b.count;
}

uint64_t SnapshotPieceKey(const SnapshotPiece& p) {
  // FNV-1a over the fields SamePiece compares. A collision could only leave
  // a piece out that the holder cannot fill: FillBorrowed matches pieces by
  // SamePiece and refuses, so it is never silent.
  uint64_t h = 14695981039346656037ULL;
  auto mix = [&h](const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  };
  auto mix_int = [&mix](int64_t v) { mix(&v, sizeof(v)); };
  mix(p.name.data(), p.name.size());
  mix_int(static_cast<int64_t>(p.name.size()));
  mix_int(p.part);
  mix_int(static_cast<int64_t>(p.shape.size()));
  for (int64_t d : p.shape) mix_int(d);
  mix_int(static_cast<int64_t>(p.global_shape.size()));
  for (int64_t d : p.global_shape) mix_int(d);
  mix_int(p.shard_axis);
  mix_int(p.shard_offset);
  mix_int(p.begin);
  mix_int(p.count);
  return h;
}

int64_t SnapshotManifest::data_floats() const {
  int64_t end = 0;
  for (const SnapshotPiece& p : pieces) end = std::max(end, p.offset + p.count);
  return end;
}

void LayOutSnapshotPieces(SnapshotManifest* manifest) {
  int64_t at = 0;
  for (SnapshotPiece& p : manifest->pieces) {
    p.offset = at;
    at += p.count;
  }
}

absl::Status CheckSnapshotFits(const SnapshotManifest& want, const SnapshotManifest& got) {
  auto refuse = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot of step ", got.step, " refused: ", what, "; it was taken by ",
                     OwnerText(got.owner), ", this rank is ", OwnerText(want.owner)));
  };
  if (want.owner.rank >= 0 && got.owner.rank >= 0 && want.owner.rank != got.owner.rank) {
    return refuse(
        absl::StrCat("it is rank ", got.owner.rank, "'s state, not rank ", want.owner.rank, "'s"));
  }
  if (want.owner.layout != got.owner.layout) return refuse("its layout differs");
  if (want.owner.place != got.owner.place) return refuse("its place in the mesh differs");
  if (want.pieces.size() != got.pieces.size()) {
    return refuse(
        absl::StrCat("it holds ", got.pieces.size(), " pieces, this rank ", want.pieces.size()));
  }
  for (size_t i = 0; i < want.pieces.size(); ++i) {
    if (want.pieces[i] != got.pieces[i]) {
      return refuse(absl::StrCat("piece ", i, " is ", RangeText(got.pieces[i]),
                                 ", this rank holds ", RangeText(want.pieces[i])));
    }
  }
  return absl::OkStatus();
}

void Snapshot::Reserve(size_t bytes) {
  if (bytes <= capacity_ && buffer_ != nullptr) return;
  // Uninitialized: the capture or the transfer overwrites every byte used.
  buffer_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
  capacity_ = bytes;
}

void Snapshot::Reset(SnapshotManifest manifest) {
  valid_ = false;
  borrowed_.clear();
  const std::string text = ManifestToJson(manifest).dump();
  const int64_t floats = manifest.data_floats();
  data_offset_ = AlignUp(sizeof(Header) + text.size());
  size_ = data_offset_ + static_cast<size_t>(floats) * sizeof(float);
  Reserve(size_);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.manifest_bytes = text.size();
  h.data_offset = data_offset_;
  h.data_floats = static_cast<uint64_t>(floats);
  std::memcpy(buffer_.get(), &h, sizeof(h));
  std::memcpy(buffer_.get() + sizeof(h), text.data(), text.size());
  std::memset(buffer_.get() + sizeof(h) + text.size(), 0, data_offset_ - sizeof(h) - text.size());
  manifest_ = std::move(manifest);
  valid_ = true;
}

std::span<std::byte> Snapshot::PrepareReceive(int64_t bytes) {
  valid_ = false;
  borrowed_.clear();
  manifest_ = SnapshotManifest{};
  size_ = static_cast<size_t>(std::max<int64_t>(bytes, 0));
  Reserve(std::max<size_t>(size_, 1));
  return {buffer_.get(), size_};
}

absl::Status Snapshot::Adopt() {
  valid_ = false;
  if (size_ < sizeof(Header)) {
    return absl::DataLossError(
        absl::StrCat("snapshot image: ", size_, " bytes, shorter than its header"));
  }
  Header h;
  std::memcpy(&h, buffer_.get(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("snapshot image: not a Loom snapshot (bad magic)");
  }
  if (h.version != kVersion) {
    return absl::DataLossError(
        absl::StrCat("snapshot image: version ", h.version, ", this trainer reads ", kVersion));
  }
  if (h.manifest_bytes > kMaxManifestBytes || sizeof(Header) + h.manifest_bytes > h.data_offset ||
      h.data_offset > size_ || h.data_floats > (size_ - h.data_offset) / sizeof(float)) {
    return absl::DataLossError(absl::StrCat(
        "snapshot image: its header (manifest ", h.manifest_bytes, " bytes, floats at ",
        h.data_offset, ", ", h.data_floats, " floats) does not fit its ", size_, " bytes"));
  }
  SnapshotManifest m;
  const std::string text(reinterpret_cast<const char*>(buffer_.get()) + sizeof(Header),
                         h.manifest_bytes);
  if (absl::Status s = ManifestFromJson(text, &m); !s.ok()) return s;
  for (const SnapshotPiece& p : m.pieces) {
    const int64_t numel = Numel(p.shape);
    if (p.count < 0 || p.begin < 0 || p.offset < 0 || p.begin + p.count > numel ||
        static_cast<uint64_t>(p.offset + p.count) > h.data_floats) {
      return absl::DataLossError(absl::StrCat("snapshot image: piece ", RangeText(p), " at float ",
                                              p.offset,
                                              " lies outside its tensor "
                                              "or the image's ",
                                              h.data_floats, " floats"));
    }
  }
  data_offset_ = h.data_offset;
  manifest_ = std::move(m);
  valid_ = true;
  return absl::OkStatus();
}

absl::Status Snapshot::FillBorrowed(const Snapshot& holder) {
  if (borrowed_.empty()) return absl::OkStatus();
  if (empty() || holder.empty() || holder.step() != step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot copy of step ", step(), ": its ", borrowed_.size(),
        " pieces held by the buddy need the buddy's own snapshot of that step, which it does not "
        "hold", holder.empty() ? "" : absl::StrCat(" (it holds step ", holder.step(), ")")));
  }
  const std::vector<SnapshotPiece>& theirs = holder.manifest().pieces;
  for (size_t i : borrowed_) {
    const SnapshotPiece& want = manifest_.pieces[i];
    auto it = std::find_if(theirs.begin(), theirs.end(),
                           [&](const SnapshotPiece& p) { return SamePiece(p, want); });
    if (it == theirs.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot copy of step ", step(), ": piece ", RangeText(want),
                       " was left out as held by the buddy, whose own snapshot lacks it"));
    }
    std::memcpy(data() + want.offset, holder.data() + it->offset,
                static_cast<size_t>(want.count) * sizeof(float));
  }
  borrowed_.clear();
  return absl::OkStatus();
}

float* Snapshot::data() { return reinterpret_cast<float*>(buffer_.get() + data_offset_); }

const float* Snapshot::data() const {
  return reinterpret_cast<const float*>(buffer_.get() + data_offset_);
}

std::span<const std::byte> Snapshot::bytes() const { return {buffer_.get(), size_}; }

}  // namespace loom::engine
