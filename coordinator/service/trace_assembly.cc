#include "coordinator/service/trace_assembly.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom::coordinator {
namespace {

using nlohmann::json;

json Metadata(const char* name, int pid, int tid, json args) {
  json e = {{"name", name}, {"ph", "M"}, {"pid", pid}, {"args", std::move(args)}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

}  // namespace

std::string ChromeTraceJson(const TraceFileInfo& info, const std::vector<RankTrace>& ranks) {
  // The earliest step start is time 0: every rank's times are its own wall
  // clock's, shifted by the same amount.
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const RankTrace& r : ranks) origin = std::min(origin, r.trace.start_unix_us());
  if (ranks.empty()) origin = 0;
  json events = json::array();
  json summaries = json::object();
  for (const RankTrace& r : ranks) {
    json collectives = json::array();
    for (const loom::v1::CollectiveTiming& c : r.timing.collectives()) {
      collectives.push_back({{"group", c.group()}, {"op", c.op()}, {"calls", c.calls()}});
    }
    summaries[std::to_string(r.rank)] = {{"compute_seconds", r.timing.compute_seconds()},
                                         {"wait_seconds", r.timing.wait_seconds()},
                                         {"collectives", std::move(collectives)}};
    const loom::v1::StepTrace& t = r.trace;
    const int pid = r.rank + 1;  // pid 0 reads as "no process" in some viewers
    std::string label = absl::StrCat("rank ", r.rank);
    if (!r.place.empty()) absl::StrAppend(&label, " ", r.place);
    if (!r.node_id.empty()) absl::StrAppend(&label, " on ", r.node_id);
    events.push_back(Metadata("process_name", pid, -1, {{"name", label}}));
    events.push_back(Metadata("process_sort_index", pid, -1, {{"sort_index", r.rank}}));
    for (int i = 0; i < t.tracks_size(); ++i) {
      events.push_back(Metadata("thread_name", pid, i, {{"name", t.tracks(i)}}));
      events.push_back(Metadata("thread_sort_index", pid, i, {{"sort_index", i}}));
    }
    const int64_t shift = t.start_unix_us() - origin;
    int64_t dropped = t.dropped_events();
    for (const loom::v1::TraceEvent& e : t.events()) {
      if (e.track() < 0 || e.track() >= t.tracks_size() || e.name() < 0 ||
          e.name() >= t.names_size()) {
        ++dropped;
        continue;
      }
      const bool compute = e.track() == 0;
      json args = json::object();
      if (compute) {
        if (e.micro_batch() >= 0) args["micro_batch"] = e.micro_batch();
        if (e.chunk() > 0) args["chunk"] = e.chunk();
      } else {
        args["group"] = t.tracks(e.track());
        args["op"] = t.names(e.name());
        args["bytes"] = e.bytes();
        args["blocked_us"] = e.blocked_us();
      }
      std::string name = t.names(e.name());
      if (compute && e.micro_batch() >= 0) absl::StrAppend(&name, " mb", e.micro_batch());
      events.push_back({{"name", name},
                        {"cat", compute ? "compute" : "collective"},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", e.track()},
                        {"ts", shift + e.start_us()},
                        {"dur", e.duration_us()},
                        {"args", std::move(args)}});
    }
    if (dropped > 0) {
      events.push_back({{"name", absl::StrCat(dropped, " events dropped")},
                        {"ph", "i"},
                        {"s", "p"},
                        {"pid", pid},
                        {"tid", 0},
                        {"ts", shift + t.end_us()},
                        {"args", {{"dropped_events", dropped}}}});
    }
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"job", info.job_id},
                {"step", info.step},
                {"origin_unix_us", origin},
                {"missing_ranks", info.missing_ranks},
                {"ranks", std::move(summaries)},
                {"clock", "each rank's wall clock at its step's start; time 0 is the earliest"}}}};
  // Strings were checked printable (report_bounds.h); replace anything else anyway.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace loom::coordinator
