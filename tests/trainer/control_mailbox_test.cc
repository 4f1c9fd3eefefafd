// The trainer's control mailbox: an abort of the armed attempt aborts its
// communicators (a blocked collective returns), one that came before they
// were armed aborts them as they are armed, other attempts' orders are
// ignored, and EnterEpoch is handed to the loop that waits for it (bounded).
#include "worker/trainer/control_mailbox.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/comm/rank_harness.h"
#include "worker/comm/in_process_store.h"

namespace loom::trainer {
namespace {

loom::v1::RankControl Abort(int attempt) {
  loom::v1::RankControl c;
  c.mutable_abort()->set_attempt(attempt);
  c.mutable_abort()->set_reason("rank 3 exited");
  return c;
}

loom::v1::RankControl Enter(int from, int to) {
  loom::v1::RankControl c;
  c.mutable_enter_epoch()->set_from_attempt(from);
  c.mutable_enter_epoch()->set_attempt(to);
  c.mutable_enter_epoch()->set_restore_step(5);
  return c;
}

TEST(ControlMailboxTest, AnAbortOfTheArmedAttemptEndsItsBlockedCollective) {
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, 2, absl::Seconds(60), "dp");
  auto set = std::make_shared<comm::CommunicatorSet>();
  comm::Communicator* dp = set->Add(std::move(comms[0]));
  ControlMailbox mailbox;
  mailbox.Arm(2, set);
  absl::Status result;
  std::thread blocked([&] {
    std::vector<float> x(16);
    result = dp->AllReduce(x);  // the peer never joins
  });
  mailbox.Post(Abort(1));  // an older attempt's: ignored
  EXPECT_FALSE(set->aborted());
  mailbox.Post(Abort(2));
  blocked.join();
  EXPECT_TRUE(absl::IsAborted(result)) << result;
  EXPECT_NE(result.message().find("attempt 2 aborted by the coordinator: rank 3 exited"),
            std::string::npos)
      << result;
  EXPECT_TRUE(mailbox.AbortOf(2).has_value());
  EXPECT_FALSE(mailbox.AbortOf(3).has_value());
  mailbox.Disarm();
}

TEST(ControlMailboxTest, AnAbortBeforeArmingAbortsWhatIsArmedLater) {
  ControlMailbox mailbox;
  mailbox.Post(Abort(4));
  auto set = std::make_shared<comm::CommunicatorSet>();
  mailbox.Arm(4, set);
  EXPECT_TRUE(set->aborted());
  auto next = std::make_shared<comm::CommunicatorSet>();
  mailbox.Arm(5, next);
  EXPECT_FALSE(next->aborted());
}

TEST(ControlMailboxTest, EnterEpochImpliesTheAbortAndIsHandedToTheWaiter) {
  ControlMailbox mailbox;
  auto set = std::make_shared<comm::CommunicatorSet>();
  mailbox.Arm(1, set);
  absl::StatusOr<ControlMailbox::NextAttempt> got;
  std::thread waiter([&] { got = mailbox.WaitForNext(1, absl::Seconds(60)); });
  mailbox.Post(Enter(7, 8));  // another attempt's: not this waiter's
  mailbox.Post(Enter(1, 2));
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->epoch.has_value());
  EXPECT_FALSE(got->spill.has_value());
  EXPECT_EQ(got->epoch->attempt(), 2);
  EXPECT_EQ(got->epoch->restore_step(), 5);
  EXPECT_TRUE(set->aborted());  // a survivor that missed the abort stops now
  EXPECT_NE(set->abort_reason().find("superseded by attempt 2"), std::string::npos);
}

TEST(ControlMailboxTest, NoEnterEpochInTimeIsADeadline) {
  ControlMailbox mailbox;
  mailbox.Post(Enter(2, 3));
  absl::StatusOr<ControlMailbox::NextAttempt> got = mailbox.WaitForNext(1, absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("no EnterEpoch moving on from attempt 1"),
            std::string::npos);
}

TEST(ControlMailboxTest, ASpillOrderEndsTheWaitAndIsNotAGracefulStop) {
  ControlMailbox mailbox;
  loom::v1::RankControl other, spill;
  other.mutable_stop()->set_attempt(3);  // another attempt's spill: not this waiter's
  other.mutable_stop()->set_spill_step(9);
  spill.mutable_stop()->set_job_id("job");
  spill.mutable_stop()->set_attempt(1);
  spill.mutable_stop()->set_spill_step(12);
  spill.mutable_stop()->add_failed_ranks(2);
  absl::StatusOr<ControlMailbox::NextAttempt> got;
  std::thread waiter([&] { got = mailbox.WaitForNext(1, absl::Seconds(60)); });
  mailbox.Post(other);
  mailbox.Post(spill);
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->epoch.has_value());
  ASSERT_TRUE(got->spill.has_value());
  EXPECT_EQ(got->spill->spill_step(), 12);
  EXPECT_EQ(got->spill->failed_ranks_size(), 1);
  EXPECT_FALSE(mailbox.StopRequested().has_value());
}

}  // namespace
}  // namespace loom::trainer
