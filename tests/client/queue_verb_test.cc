// loomctl queue's table (client/queue_verb.h).
#include "client/queue_verb.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;

TEST(FormatQueue, OneLinePerJobInOrderWithWhy) {
  loom::v1::ListQueueResponse queue;
  queue.set_total(3);
  loom::v1::QueuedJob* a = queue.add_jobs();
  a->set_id("job-7");
  a->set_owner("alice");
  a->set_position(1);
  a->set_priority(5);
  a->set_device_kind("gpu");
  a->set_devices(16);
  a->set_created_unix_ms(0);
  a->set_action("wait");
  a->set_reason("needs 16 gpu, 4 free");
  loom::v1::QueuedJob* b = queue.add_jobs();
  b->set_id("job-9");
  b->set_owner("alice");
  b->set_position(3);
  b->set_devices(2);
  b->set_device_kind("gpu");
  b->set_created_unix_ms(0);
  b->set_action("backfill");
  b->set_reason("backfills: ends before job-7's reserved start");
  const std::string out = FormatQueue(queue, 90'000);
  EXPECT_THAT(out, HasSubstr("POS"));
  EXPECT_THAT(out, HasSubstr("job-7"));
  EXPECT_THAT(out, HasSubstr("16 gpu"));
  EXPECT_THAT(out, HasSubstr("90s  needs 16 gpu, 4 free\n"));
  EXPECT_THAT(out, HasSubstr("backfill now: backfills"));
  EXPECT_THAT(out, HasSubstr("3 waiting in all"));
  EXPECT_LT(out.find("job-7"), out.find("job-9"));
}

TEST(FormatQueue, EmptyQueues) {
  loom::v1::ListQueueResponse queue;
  EXPECT_EQ(FormatQueue(queue, 0), "no job waits\n");
  queue.set_total(4);
  EXPECT_EQ(FormatQueue(queue, 0), "none of your jobs waits (4 waiting in all)\n");
}

}  // namespace
}  // namespace loom::client
