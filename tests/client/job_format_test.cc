// loomctl status's recovery lines: each phase of the incident's path, the
// total, then how it recovered (in place with the relaunched ranks, or the
// whole job with the reason it fell back) and the steps recomputed.
#include "client/job_format.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::client {
namespace {

constexpr int64_t kT0 = 1'000'000'000'000'000;  // microseconds since the epoch
int64_t At(double seconds) { return kT0 + static_cast<int64_t>(seconds * 1e6); }

// The lines under "recoveries:" of a job holding these incidents.
std::vector<std::string> RecoveryLines(const std::vector<loom::v1::RecoveryIncident>& incidents) {
  loom::v1::Job job;
  job.set_id("job-1");
  for (const auto& in : incidents) *job.add_incidents() = in;
  const std::string status = FormatJobStatus(job);
  std::vector<std::string> lines;
  const size_t start = status.find("recoveries:\n");
  if (start == std::string::npos) return lines;
  size_t at = start + std::string("recoveries:\n").size();
  while (at < status.size() && status.compare(at, 2, "  ") == 0) {
    const size_t end = status.find('\n', at);
    lines.push_back(status.substr(at + 2, end - at - 2));
    at = end + 1;
  }
  return lines;
}

loom::v1::RecoveryIncident InPlaceCrash() {
  loom::v1::RecoveryIncident in;
  in.set_kind("crash");
  in.set_rank(2);
  in.set_node_id("node-a");
  in.set_failed_attempt(1);
  in.set_path("in_place");
  in.add_relaunched_ranks(2);
  in.set_cause_unix_us(At(0));
  in.set_declared_unix_us(At(0.25));
  in.set_aborted_unix_us(At(0.5));
  in.set_placed_unix_us(At(1));
  in.set_ready_unix_us(At(1.25));
  in.set_resumed_unix_us(At(1.5));
  in.set_first_step_unix_us(At(2));
  in.set_detection_seconds(0.25);
  in.set_abort_seconds(0.25);
  in.set_placement_seconds(0.5);
  in.set_rendezvous_seconds(0.25);
  in.set_checkpoint_load_seconds(0.25);
  in.set_first_step_seconds(0.5);
  in.set_total_seconds(2);
  in.set_steps_recomputed(1);
  in.set_complete(true);
  in.set_closed(true);
  return in;
}

TEST(JobFormatTest, AnInPlaceRecoveryNamesItsPhasesTheRelaunchedRanksAndTheStepsRecomputed) {
  EXPECT_EQ(RecoveryLines({InPlaceCrash()}),
            std::vector<std::string>{
                "crash rank 2 node node-a (attempt 1): detect 0.25s abort 0.25s relaunch 0.50s "
                "rendezvous 0.25s restore 0.25s first-step 0.50s total 2.00s; in place, "
                "relaunched rank 2, 1 step recomputed"});
}

TEST(JobFormatTest, AnInPlaceRecoveryUnderWayShowsWhatItRelaunches) {
  loom::v1::RecoveryIncident in = InPlaceCrash();
  in.set_kind("node_lost");
  in.set_rank(-1);
  in.set_node_id("node-b");
  in.clear_relaunched_ranks();
  for (int r : {4, 5, 6, 7}) in.add_relaunched_ranks(r);
  in.set_placed_unix_us(0);
  in.set_ready_unix_us(0);
  in.set_resumed_unix_us(0);
  in.set_first_step_unix_us(0);
  in.set_total_seconds(0.5);
  in.set_steps_recomputed(0);
  in.set_complete(false);
  in.set_closed(false);
  EXPECT_EQ(RecoveryLines({in}),
            std::vector<std::string>{
                "node_lost node node-b (attempt 1): detect 0.25s abort 0.25s relaunch - "
                "rendezvous - restore - first-step - total 0.50s (in progress); in place, "
                "relaunched ranks 4-7"});
}

TEST(JobFormatTest, AWholeJobRecoverySaysWhyItFellBack) {
  loom::v1::RecoveryIncident in;
  in.set_kind("node_lost");
  in.set_rank(-1);
  in.set_node_id("node-b");
  in.set_failed_attempt(2);
  in.set_path("whole_job");
  in.set_fallback_reason(
      "rank 5 and its buddy rank 1, which holds its snapshot copies, failed together");
  in.set_cause_unix_us(At(0));
  in.set_declared_unix_us(At(2));
  in.set_stopped_unix_us(At(2));
  in.set_placed_unix_us(At(3));
  in.set_ready_unix_us(At(3.5));
  in.set_resumed_unix_us(At(4));
  in.set_first_step_unix_us(At(4.5));
  in.set_detection_seconds(2);
  in.set_placement_seconds(1);
  in.set_rendezvous_seconds(0.5);
  in.set_checkpoint_load_seconds(0.5);
  in.set_first_step_seconds(0.5);
  in.set_total_seconds(4.5);
  in.set_steps_recomputed(7);
  in.set_complete(true);
  in.set_closed(true);
  EXPECT_EQ(RecoveryLines({in}),
            std::vector<std::string>{
                "node_lost node node-b (attempt 2): detect 2.00s stop 0.00s place 1.00s "
                "rendezvous 0.50s load 0.50s first-step 0.50s total 4.50s; whole job, 7 steps "
                "recomputed (rank 5 and its buddy rank 1, which holds its snapshot copies, failed "
                "together)"});
}

TEST(JobFormatTest, AnIncidentKeptFromBeforePathsKeepsItsLine) {
  loom::v1::RecoveryIncident in;
  in.set_kind("hang");
  in.set_rank(1);
  in.set_node_id("node-a");
  in.set_failed_attempt(1);
  in.set_cause_unix_us(At(0));
  in.set_declared_unix_us(At(4));
  in.set_detection_seconds(4);
  in.set_total_seconds(5);
  in.set_closed(true);
  EXPECT_EQ(RecoveryLines({in}),
            std::vector<std::string>{"hang rank 1 node node-a (attempt 1): detect 4.00s stop - "
                                     "place - rendezvous - load - first-step - total 5.00s (cut "
                                     "short)"});
}

TEST(JobFormatTest, TheNodeTableShowsLabelsInKeyOrder) {
  loom::v1::Node labeled;
  labeled.set_node_id("node-a");
  labeled.set_live(true);
  (*labeled.mutable_labels())["rack"] = "r1";
  (*labeled.mutable_labels())["nvlink_domain"] = "d0";
  loom::v1::Node plain;
  plain.set_node_id("node-b");
  plain.set_spare(true);
  const std::string table = FormatNodeTable({labeled, plain});
  EXPECT_NE(table.find("LABELS"), std::string::npos) << table;
  const size_t a = table.find("node-a"), b = table.find("node-b");
  ASSERT_NE(b, std::string::npos);
  EXPECT_NE(table.substr(a, b - a).find("nvlink_domain=d0,rack=r1"), std::string::npos) << table;
  EXPECT_NE(table.substr(b).find(" -  "), std::string::npos) << table;
  EXPECT_NE(table.substr(b).find("spare"), std::string::npos) << table;
}

}  // namespace
}  // namespace loom::client
