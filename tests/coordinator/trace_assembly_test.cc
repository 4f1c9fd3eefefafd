// `loomctl trace`'s file (coordinator/service/trace_assembly.h): a process
// per rank named with its place and node, a thread per track, every event
// with its arguments, the ranks' clocks shifted to the earliest step start,
// dropped events counted in a marker.
#include "coordinator/service/trace_assembly.h"

#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::coordinator {
namespace {

using nlohmann::json;

loom::v1::TraceEvent Event(int track, int name, int64_t start, int64_t duration, int64_t bytes = 0,
                           int micro_batch = -1) {
  loom::v1::TraceEvent e;
  e.set_track(track);
  e.set_name(name);
  e.set_start_us(start);
  e.set_duration_us(duration);
  e.set_bytes(bytes);
  e.set_micro_batch(micro_batch);
  return e;
}

RankTrace Rank(int rank, int64_t start_unix_us) {
  RankTrace r;
  r.rank = rank;
  r.place = "TP(0)-PP(1)-DP(0)";
  r.node_id = "node-a";
  r.trace.set_step(7);
  r.trace.set_start_unix_us(start_unix_us);
  r.trace.set_end_us(1000);
  r.trace.add_tracks("compute");
  r.trace.add_tracks("tp[0,1]");
  r.trace.add_names("forward");
  r.trace.add_names("all_reduce");
  *r.trace.add_events() = Event(0, 0, 10, 300, 0, 2);
  *r.trace.add_events() = Event(1, 1, 120, 40, 4096);
  return r;
}

// The events of one phase type ("ph").
std::vector<json> Of(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(TraceAssembly, AProcessPerRankNamedWithItsPlaceAndNodeAndAThreadPerTrack) {
  const json doc = json::parse(
      ChromeTraceJson({"job-1", 7, {}}, {Rank(0, 1'000'000), Rank(3, 1'000'000)}));
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  for (const json& m : Of(doc, "M")) {
    if (m["name"] == "process_name") processes[m["pid"]] = m["args"]["name"];
    if (m["name"] == "thread_name") threads[{m["pid"], m["tid"]}] = m["args"]["name"];
  }
  ASSERT_EQ(processes.size(), 2u);
  EXPECT_EQ(processes[1], "rank 0 TP(0)-PP(1)-DP(0) on node-a");
  EXPECT_EQ(processes[4], "rank 3 TP(0)-PP(1)-DP(0) on node-a");
  EXPECT_EQ((threads[{1, 0}]), "compute");
  EXPECT_EQ((threads[{4, 1}]), "tp[0,1]");
  EXPECT_EQ(doc["otherData"]["step"], 7);
  EXPECT_EQ(doc["otherData"]["job"], "job-1");
}

TEST(TraceAssembly, EventsCarryTheirGroupOperationBytesAndMicroBatch) {
  const json doc = json::parse(ChromeTraceJson({"job-1", 7, {}}, {Rank(2, 5'000'000)}));
  const std::vector<json> spans = Of(doc, "X");
  ASSERT_EQ(spans.size(), 2u);
  const json& compute = spans[0];
  EXPECT_EQ(compute["name"], "forward mb2");
  EXPECT_EQ(compute["cat"], "compute");
  EXPECT_EQ(compute["pid"], 3);
  EXPECT_EQ(compute["tid"], 0);
  EXPECT_EQ(compute["ts"], 10);
  EXPECT_EQ(compute["dur"], 300);
  EXPECT_EQ(compute["args"]["micro_batch"], 2);
  const json& collective = spans[1];
  EXPECT_EQ(collective["name"], "all_reduce");
  EXPECT_EQ(collective["cat"], "collective");
  EXPECT_EQ(collective["tid"], 1);
  EXPECT_EQ(collective["args"]["group"], "tp[0,1]");
  EXPECT_EQ(collective["args"]["op"], "all_reduce");
  EXPECT_EQ(collective["args"]["bytes"], 4096);
}

TEST(TraceAssembly, EachRanksTimingSummaryTravelsAlong) {
  RankTrace r = Rank(1, 1'000'000);
  r.timing.set_compute_seconds(0.25);
  loom::v1::CollectiveTiming* c = r.timing.add_collectives();
  c->set_group("tp[0,1]");
  c->set_op("all_reduce");
  c->set_calls(1);
  const json doc = json::parse(ChromeTraceJson({"job-1", 7, {}}, {r}));
  const json& summary = doc["otherData"]["ranks"]["1"];
  EXPECT_EQ(summary["compute_seconds"], 0.25);
  ASSERT_EQ(summary["collectives"].size(), 1u);
  EXPECT_EQ(summary["collectives"][0]["group"], "tp[0,1]");
  EXPECT_EQ(summary["collectives"][0]["calls"], 1);
}

TEST(TraceAssembly, RanksAreAlignedOnTheirWallClocks) {
  // Rank 1's step began 250 us after rank 0's: its events shift by that much.
  const json doc = json::parse(
      ChromeTraceJson({"job-1", 7, {}}, {Rank(0, 1'000'000), Rank(1, 1'000'250)}));
  std::map<int, int64_t> first_ts;
  for (const json& e : Of(doc, "X")) {
    if (!first_ts.contains(e["pid"])) first_ts[e["pid"]] = e["ts"];
  }
  EXPECT_EQ(first_ts[1], 10);
  EXPECT_EQ(first_ts[2], 260);
  EXPECT_EQ(doc["otherData"]["origin_unix_us"], 1'000'000);
}

TEST(TraceAssembly, DroppedAndMalformedEventsAreCountedInAMarker) {
  RankTrace r = Rank(0, 1'000'000);
  r.trace.set_dropped_events(5);
  *r.trace.add_events() = Event(9, 0, 0, 1);  // no track 9
  const json doc = json::parse(ChromeTraceJson({"job-1", 7, {3}}, {r}));
  EXPECT_EQ(Of(doc, "X").size(), 2u);
  const std::vector<json> marks = Of(doc, "i");
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0]["name"], "6 events dropped");
  EXPECT_EQ(marks[0]["ts"], 1000);
  EXPECT_EQ(doc["otherData"]["missing_ranks"], json::array({3}));
}

TEST(TraceAssembly, NoTracesIsStillAValidDocument) {
  const json doc = json::parse(ChromeTraceJson({"job-1", 7, {0, 1}}, {}));
  EXPECT_TRUE(doc["traceEvents"].empty());
  EXPECT_EQ(doc["otherData"]["missing_ranks"].size(), 2u);
}

}  // namespace
}  // namespace loom::coordinator
