#include "worker/engine/snapshot/snapshot_transfer.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <span>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

constexpr int64_t kMagic = 0x50414e534d4f4f4cLL;  // "LOOMSNAP" read as little-endian
constexpr int kHeaderInts = 8;
constexpr int kAckInts = 2;
constexpr int64_t kNone = -1;

template <size_t N>
std::span<float> AsFloats(int64_t (&ints)[N]) {
  return {reinterpret_cast<float*>(ints), N * sizeof(int64_t) / sizeof(float)};
}

absl::Status Named(const absl::Status& s, const comm::Communicator& pair, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("snapshot ", what, " over ", pair.name(), ": ", s.message()));
}

// The image in chunks, at most two in flight; send or receive.
template <typename Post>
absl::Status Chunked(int64_t bytes, int64_t chunk_bytes, Post post) {
  const int64_t chunk = std::max<int64_t>(4, chunk_bytes / 4 * 4);
  std::deque<std::unique_ptr<comm::Work>> in_flight;
  absl::Status status;
  for (int64_t at = 0; at < bytes && status.ok(); at += chunk) {
    if (in_flight.size() >= 2) {
      status = in_flight.front()->Wait();
      in_flight.pop_front();
      if (!status.ok()) break;
    }
    in_flight.push_back(post(at, std::min(chunk, bytes - at)));
  }
  for (auto& w : in_flight) {
    absl::Status s = w->Wait();
    if (status.ok()) status = s;
  }
  return status;
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::Status SendSnapshot(comm::Communicator& pair, int64_t step, const Snapshot* snapshot,
                          const SnapshotTransferOptions& options, SnapshotTransferStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const int peer = comm::PairPeerOf(pair);
  const bool have = snapshot != nullptr && !snapshot->empty() && snapshot->step() == step;
  const int64_t bytes = have ? snapshot->size_bytes() : kNone;
  int64_t header[kHeaderInts] = {kMagic, step, bytes, options.chunk_bytes, 0, 0, 0, 0};
  const std::string what = absl::StrCat("copy of step ", step);
  if (absl::Status s = pair.Send(AsFloats(header), peer, options.tag); !s.ok()) {
    return Named(s, pair, what);
  }
  if (!have) {
    return absl::NotFoundError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": this rank holds no snapshot of step ", step));
  }
  const std::byte* image = snapshot->bytes().data();
  absl::Status sent = Chunked(bytes, options.chunk_bytes, [&](int64_t at, int64_t n) {
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
    stats->bytes = bytes;
    stats->seconds = Since(start);
  }
  return absl::OkStatus();
}

absl::Status ReceiveSnapshot(comm::Communicator& pair, int64_t step, Snapshot* into,
                             const SnapshotTransferOptions& options, SnapshotTransferStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const int peer = comm::PairPeerOf(pair);
  const std::string what = absl::StrCat("copy of step ", step);
  int64_t header[kHeaderInts] = {};
  into->PrepareReceive(0);  // empty until the whole image is in and parsed
  if (absl::Status s = pair.Recv(AsFloats(header), peer, options.tag); !s.ok()) {
    return Named(s, pair, what);
  }
  if (header[0] != kMagic) {
    return absl::DataLossError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": the header is not a snapshot transfer's"));
  }
  const int64_t bytes = header[2];
  if (bytes == kNone) {
    return absl::NotFoundError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": the sender holds no snapshot of step ", header[1]));
  }
  if (bytes < 0 || bytes % 4 != 0) {
    return absl::DataLossError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                            ": the header announces ", bytes, " bytes"));
  }
  std::span<std::byte> image = into->PrepareReceive(bytes);
  absl::Status received = Chunked(bytes, header[3], [&](int64_t at, int64_t n) {
    return pair.RecvAsync(
        std::span<float>(reinterpret_cast<float*>(image.data() + at), static_cast<size_t>(n / 4)),
        peer, options.tag + 1);
  });
  if (!received.ok()) {
    into->PrepareReceive(0);
    return Named(received, pair, what);
  }
  absl::Status parsed = into->Adopt();
  if (parsed.ok() && into->step() != step) {
    parsed = absl::FailedPreconditionError(absl::StrCat("snapshot ", what, " over ", pair.name(),
                                                        ": the sender sent step ", into->step()));
  }
  int64_t ack[kAckInts] = {kMagic, parsed.ok() ? 1 : 0};
  absl::Status acked = pair.Send(AsFloats(ack), peer, options.tag + 2);
  if (!parsed.ok() || !acked.ok()) {
    into->PrepareReceive(0);
    return parsed.ok() ? Named(acked, pair, absl::StrCat(what, " (acknowledging)")) : parsed;
  }
  if (stats != nullptr) {
    stats->bytes = bytes;
    stats->seconds = Since(start);
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
