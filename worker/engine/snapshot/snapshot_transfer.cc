#include "worker/engine/snapshot/snapshot_transfer.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <span>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

constexpr int64_t kMagic = 0x50414e534d4f4f4cLL;  // "LOOMSNAP" read as little-endian
constexpr int kHeaderInts = 8;
constexpr int kAckInts = 2;
constexpr int64_t kNone = -1;
constexpr int64_t kMaxHeldKeys = int64_t{1} << 22;

template <size_t N>
std::span<float> AsFloats(int64_t (&ints)[N]) {
  return {reinterpret_cast<float*>(ints), N * sizeof(int64_t) / sizeof(float)};
}

absl::Status Named(const absl::Status& s, const comm::Communicator& pair, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("snapshot ", what, " over ", pair.name(), ": ", s.message()));
}

struct ByteRange {
  int64_t at = 0;
  int64_t bytes = 0;
};

// Byte ranges of the image in chunks, at most two in flight; send or
// receive. Both ends split the same ranges alike, so their messages pair.
template <typename Post>
absl::Status Chunked(const std::vector<ByteRange>& ranges, int64_t chunk_bytes, Post post) {
  const int64_t chunk = std::max<int64_t>(4, chunk_bytes / 4 * 4);
  std::deque<std::unique_ptr<comm::Work>> in_flight;
  absl::Status status;
  for (const ByteRange& r : ranges) {
    for (int64_t at = r.at; at < r.at + r.bytes && status.ok(); at += chunk) {
      if (in_flight.size() >= 2) {
        status = in_flight.front()->Wait();
        in_flight.pop_front();
        if (!status.ok()) break;
      }
      in_flight.push_back(post(at, std::min(chunk, r.at + r.bytes - at)));
    }
  }
  for (auto& w : in_flight) {
    absl::Status s = w->Wait();
    if (status.ok()) status = s;
  }
  return status;
}

int64_t DataOffset(const Snapshot& s) {
  return reinterpret_cast<const std::byte*>(s.data()) - s.bytes().data();
}

// The floats to send of `s` when the receiver holds the pieces keyed `held`
// (adjacent pieces merged), and the pieces left out.
std::vector<ByteRange> PiecesToSend(const Snapshot& s, const std::unordered_set<uint64_t>& held,
                                    std::vector<size_t>* left_out) {
  std::vector<ByteRange> ranges;
  const int64_t base = DataOffset(s);
  const std::vector<SnapshotPiece>& pieces = s.manifest().pieces;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const SnapshotPiece& p = pieces[i];
    if (p.count == 0) continue;
    if (held.count(SnapshotPieceKey(p)) > 0) {
      left_out->push_back(i);
      continue;
    }
    const int64_t at = base + p.offset * static_cast<int64_t>(sizeof(float));
    const int64_t bytes = p.count * static_cast<int64_t>(sizeof(float));
    if (!ranges.empty() && ranges.back().at + ranges.back().bytes == at) {
      ranges.back().bytes += bytes;
    } else {
      ranges.push_back({at, bytes});
    }
  }
  return ranges;
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The receiver's keys of the pieces it holds (leave_out_held streams).
absl::StatusOr<std::unordered_set<uint64_t>> ReceiveHeldKeys(comm::Communicator& pair, int peer,
                                                              uint32_t tag) {
  int64_t head[2] = {0, 0};
  if (absl::Status s = pair.Recv(AsFloats(head), peer, tag); !s.ok()) return s;
  if (head[0] != kMagic || head[1] < 0 || head[1] > kMaxHeldKeys) {
    return absl::DataLossError(absl::StrCat("the receiver's list of the pieces it holds is "
                                            "malformed (", head[1], " keys)"));
  }
  std::vector<uint64_t> keys(static_cast<size_t>(head[1]));
  if (!keys.empty()) {
    std::span<float> as_floats(reinterpret_cast<float*>(keys.data()), keys.size() * 2);
    if (absl::Status s = pair.Recv(as_floats, peer, tag); !s.ok()) return s;
  }
  return std::unordered_set<uint64_t>(keys.begin(), keys.end());
}

absl::Status SendHeldKeys(comm::Communicator& pair, int peer, uint32_t tag,
                          std::span<const uint64_t> held) {
  int64_t head[2] = {kMagic, static_cast<int64_t>(held.size())};
  if (absl::Status s = pair.Send(AsFloats(head), peer, tag); !s.ok()) return s;
  if (held.empty()) return absl::OkStatus();
  return pair.Send(std::span<const float>(reinterpret_cast<const float*>(held.data()),
                                          held.size() * 2),
                   peer, tag);
}

}  // namespace

absl::Status SendSnapshot(comm::Communicator& pair, int64_t step, const Snapshot* snapshot,
                          const SnapshotTransferOptions& options, SnapshotTransferStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const int peer = comm::PairPeerOf(pair);
  const std::string what = absl::StrCat("copy of step ", step);
  std::unordered_set<uint64_t> held;
  if (options.leave_out_held) {
    absl::StatusOr<std::unordered_set<uint64_t>> keys = ReceiveHeldKeys(pair, peer, options.tag + 3);
    if (!keys.ok()) return Named(keys.status(), pair, what);
    held = *std::move(keys);
  }
  // A copy with pieces still borrowed is not this rank's to pass on whole.
  const bool have = snapshot != nullptr && !snapshot->empty() && snapshot->step() == step &&
                    snapshot->borrowed().empty();
  const int64_t bytes = have ? snapshot->size_bytes() : kNone;
  const int64_t data_offset = have ? DataOffset(*snapshot) : 0;
  int64_t header[kHeaderInts] = {kMagic, step, bytes, options.chunk_bytes, data_offset, 0, 0, 0};
  if (absl::Status s = pair.Send(AsFloats(header), peer, options.tag); !s.ok()) {
    return Named(s, pair, what);
  }
  if (!have) {
    return absl::NotFoundError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": this rank holds no snapshot of step ", step));
  }
  // The header and manifest, then the floats the receiver does not hold.
  std::vector<size_t> left_out;
  std::vector<ByteRange> ranges = {{0, data_offset}};
  for (const ByteRange& r : PiecesToSend(*snapshot, held, &left_out)) ranges.push_back(r);
  int64_t sent_bytes = 0;
  for (const ByteRange& r : ranges) sent_bytes += r.bytes;
  const std::byte* image = snapshot->bytes().data();
  absl::Status sent = Chunked(ranges, options.chunk_bytes, [&](int64_t at, int64_t n) {
    return pair.SendAsync(std::span<const float>(reinterpret_cast<const float*>(image + at),
                                                 static_cast<size_t>(n / 4)),
                          peer, options.tag + 1);
  });
  if (!sent.ok()) return Named(sent, pair, what);
  int64_t ack[kAckInts] = {0, 0};
  if (absl::Status s = pair.Recv(AsFloats(ack), peer, options.tag + 2); !s.ok()) {
    return Named(s, pair, absl::StrCat(what, " (waiting for the acknowledgement)"));
  }
  if (ack[0] != kMagic || ack[1] != 1) {
    return absl::DataLossError(
        absl::StrCat("snapshot ", what, " over ", pair.name(), ": the receiver refused the copy"));
  }
  if (stats != nullptr) {
    stats->bytes = sent_bytes;
    stats->seconds = Since(start);
  }
  return absl::OkStatus();
}

absl::Status ReceiveSnapshot(comm::Communicator& pair, int64_t step, Snapshot* into,
                             const SnapshotTransferOptions& options, SnapshotTransferStats* stats,
                             std::span<const uint64_t> held) {
  const auto start = std::chrono::steady_clock::now();
  const int peer = comm::PairPeerOf(pair);
  const std::string what = absl::StrCat("copy of step ", step);
  into->PrepareReceive(0);  // empty until the whole image is in and parsed
  if (options.leave_out_held) {
    if (absl::Status s = SendHeldKeys(pair, peer, options.tag + 3, held); !s.ok()) {
      return Named(s, pair, what);
    }
  }
  int64_t header[kHeaderInts] = {};
  if (absl::Status s = pair.Recv(AsFloats(header), peer, options.tag); !s.ok()) {
    return Named(s, pair, what);
  }
  if (header[0] != kMagic) {
    return absl::DataLossError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": the header is not a snapshot transfer's"));
  }
  const int64_t bytes = header[2];
  const int64_t data_offset = header[4];
  if (bytes == kNone) {
    return absl::NotFoundError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": the sender holds no snapshot of step ", header[1]));
  }
  if (bytes < 0 || bytes % 4 != 0 || data_offset < 0 || data_offset > bytes ||
      data_offset % 4 != 0) {
    return absl::DataLossError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": the header announces ", bytes,
                                            " bytes with floats at ", data_offset));
  }
  std::span<std::byte> image = into->PrepareReceive(bytes);
  auto receive = [&](const std::vector<ByteRange>& ranges) {
    return Chunked(ranges, header[3], [&](int64_t at, int64_t n) {
      return pair.RecvAsync(
          std::span<float>(reinterpret_cast<float*>(image.data() + at), static_cast<size_t>(n / 4)),
          peer, options.tag + 1);
    });
  };
  // The header and manifest first: they say where the floats sent go.
  absl::Status received = receive({{0, data_offset}});
  absl::Status parsed;
  std::vector<size_t> left_out;
  if (received.ok()) {
    parsed = into->Adopt();
    if (parsed.ok() && DataOffset(*into) != data_offset) {
      parsed = absl::DataLossError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                                ": the image's floats are not where its "
                                                "transfer header says"));
    }
    if (parsed.ok()) {
      const std::unordered_set<uint64_t> keys(held.begin(), held.end());
      received = receive(PiecesToSend(*into, keys, &left_out));
    }
  }
  if (!received.ok()) {
    into->PrepareReceive(0);
    return Named(received, pair, what);
  }
  if (parsed.ok() && into->step() != step) {
    parsed = absl::FailedPreconditionError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                                        ": the sender sent step ", into->step()));
  }
  // Refused or not, the receiver answers. (An image whose manifest does not
  // parse, which only a broken sender makes, leaves that sender's floats
  // unreceived: its copy thread waits until its pair group is aborted.)
  int64_t ack[kAckInts] = {kMagic, parsed.ok() ? 1 : 0};
  absl::Status acked = pair.Send(AsFloats(ack), peer, options.tag + 2);
  if (!parsed.ok() || !acked.ok()) {
    into->PrepareReceive(0);
    return parsed.ok() ? Named(acked, pair, absl::StrCat(what, " (acknowledging)")) : parsed;
  }
  into->set_borrowed(std::move(left_out));
  if (stats != nullptr) {
    int64_t got = data_offset;
    for (const SnapshotPiece& p : into->manifest().pieces) got += p.count * 4;
    for (size_t i : into->borrowed()) got -= into->manifest().pieces[i].count * 4;
    stats->bytes = got;
    stats->seconds = Since(start);
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
