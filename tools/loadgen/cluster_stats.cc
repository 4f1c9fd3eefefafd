#include "tools/loadgen/cluster_stats.h"

namespace loom::loadgen {

MessageCounts MessageCounts::operator-(const MessageCounts& o) const {
  MessageCounts d;
  d.registered = registered - o.registered;
  d.launches = launches - o.launches;
  d.kills = kills - o.kills;
  d.aborts = aborts - o.aborts;
  d.enter_epochs = enter_epochs - o.enter_epochs;
  d.heartbeat_acks = heartbeat_acks - o.heartbeat_acks;
  d.resumes = resumes - o.resumes;
  d.heartbeats = heartbeats - o.heartbeats;
  d.exits = exits - o.exits;
  d.batches = batches - o.batches;
  d.reports = reports - o.reports;
  d.store_batches = store_batches - o.store_batches;
  d.store_ops = store_ops - o.store_ops;
  d.store_gets = store_gets - o.store_gets;
  return d;
}

MessageCounts ClusterStats::Messages() const {
  MessageCounts m;
  m.registered = registered.load();
  m.launches = launches.load();
  m.kills = kills.load();
  m.aborts = aborts.load();
  m.enter_epochs = enter_epochs.load();
  m.heartbeat_acks = heartbeat_acks.load();
  m.resumes = resumes.load();
  m.heartbeats = heartbeats_sent.load();
  m.exits = exits_sent.load();
  m.batches = batches_sent.load();
  m.reports = reports_sent.load();
  m.store_batches = store_batches.load();
  m.store_ops = store_ops.load();
  m.store_gets = store_gets.load();
  return m;
}

}  // namespace loom::loadgen
