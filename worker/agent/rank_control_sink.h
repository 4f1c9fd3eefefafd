// Where the rank manager sends what a rank must be told on its control stream
// (AgentService.Control: AbortRanks, EnterEpoch), by launch id, which stays
// the same across the rank's attempts. RankControlHub (rank_control.h) is the
// real implementation; the rank manager itself knows no gRPC.
#pragma once

#include <cstdint>

#include "loom/v1/node.pb.h"

namespace loom::agent {

class RankControlSink {
 public:
  virtual ~RankControlSink() = default;
  // The rank was launched: messages for it are kept from now on, also before
  // its stream opens.
  virtual void Open(uint64_t launch_id) = 0;
  // The rank ended: its stream ends and what waits for it is dropped.
  virtual void Close(uint64_t launch_id) = 0;
  // Queues a message for the rank, after those before it (dropped when the
  // rank is not open).
  virtual void Push(uint64_t launch_id, loom::v1::RankControl message) = 0;
};

}  // namespace loom::agent
