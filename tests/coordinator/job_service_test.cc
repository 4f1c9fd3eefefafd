// JobService over loopback gRPC (coordinator/service/job_service.h), its
// job manager on the real SQLite store with every write held at a gate:
// CancelJob and DeleteJob are answered once their change is stored while
// GetJob, ListJobs and WatchJob answer meanwhile; PlanJob runs on a bounded
// pool and is refused with RESOURCE_EXHAUSTED when it is full.
#include "coordinator/service/job_service.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/service/plan_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_store.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using loom::v1::JobState;

class JobServiceTest : public testing::JobManagerHarness {
 protected:
  JobServiceTest() : JobManagerHarness("loom_job_service") {}

  void Serve(PlanFunction plan, JobServiceOptions options = {}) {
    auto sqlite = SqliteJobStore::Open(state_dir());
    ASSERT_TRUE(sqlite.ok());
    auto gated = std::make_unique<testing::GatedJobStore>(*std::move(sqlite));
    gate_ = gated.get();
    StartWith({}, std::move(gated));
    service_ = std::make_unique<JobServiceImpl>(jobs_.get(), std::move(plan), &auth_, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Open();
    if (server_ != nullptr) server_->Shutdown();
  }
  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  const CallerAuth auth_ = CallerAuth::Insecure();
  testing::GatedJobStore* gate_ = nullptr;
  std::unique_ptr<JobServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<loom::v1::JobService::Stub> stub_;
};

TEST_F(JobServiceTest, CancelAndDeleteAreAnsweredOnceStoredWhileReadsGoOn) {
  Serve(PlanJob);
  auto running = jobs_->Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  auto ended = jobs_->Submit(testing::kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(running.ok() && ended.ok());
  ASSERT_TRUE(jobs_->Cancel(ended->id()).ok());

  gate_->Close();
  grpc::Status cancel_status, delete_status;
  loom::v1::Job cancelled;
  std::thread cancel([&] {
    loom::v1::CancelJobRequest request;
    request.set_id(running->id());
    cancel_status = stub_->CancelJob(Context().get(), request, &cancelled);
  });
  std::thread remove([&] {
    loom::v1::DeleteJobRequest request;
    request.set_id(ended->id());
    loom::v1::DeleteJobResponse response;
    delete_status = stub_->DeleteJob(Context().get(), request, &response);
  });
  gate_->AwaitWaiting();  // a write is held: neither call can be answered yet

  loom::v1::GetJobRequest get;
  get.set_id(running->id());
  loom::v1::Job job;
  ASSERT_TRUE(stub_->GetJob(Context().get(), get, &job).ok());
  EXPECT_EQ(job.state(), JobState::PENDING);  // what is stored
  loom::v1::ListJobsResponse list;
  ASSERT_TRUE(stub_->ListJobs(Context().get(), loom::v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 2);
  loom::v1::WatchJobRequest watch;
  watch.set_id(running->id());
  auto context = Context();
  auto stream = stub_->WatchJob(context.get(), watch);
  loom::v1::WatchJobResponse first;
  ASSERT_TRUE(stream->Read(&first));
  EXPECT_EQ(first.job().state(), JobState::PENDING);

  gate_->Open();
  cancel.join();
  remove.join();
  ASSERT_TRUE(cancel_status.ok()) << cancel_status.error_message();
  EXPECT_EQ(cancelled.state(), JobState::CANCELLED);
  ASSERT_TRUE(delete_status.ok()) << delete_status.error_message();
  // The watch hears the cancel, then ends.
  loom::v1::WatchJobResponse update;
  bool saw_cancel = false;
  while (stream->Read(&update)) saw_cancel |= update.event().state() == JobState::CANCELLED;
  EXPECT_TRUE(saw_cancel);
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(jobs_->Get(ended->id()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobServiceTest, PlansRunOnABoundedPool) {
  absl::Notification started, release;
  Serve(
      [&](const loom::v1::PlanJobRequest&) -> absl::StatusOr<loom::v1::PlanJobResponse> {
        started.Notify();
        release.WaitForNotification();
        loom::v1::PlanJobResponse response;
        response.set_text("planned");
        return response;
      },
      {.plan_threads = 1, .plan_queue = 0});
  grpc::Status first_status;
  loom::v1::PlanJobResponse first;
  std::thread planning([&] {
    first_status = stub_->PlanJob(Context().get(), loom::v1::PlanJobRequest(), &first);
  });
  started.WaitForNotification();
  loom::v1::PlanJobResponse second;
  const grpc::Status refused = stub_->PlanJob(Context().get(), loom::v1::PlanJobRequest(), &second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("loomctl plan --offline"), std::string::npos);
  // A read still answers while the pool is busy.
  loom::v1::ListJobsResponse list;
  EXPECT_TRUE(stub_->ListJobs(Context().get(), loom::v1::ListJobsRequest(), &list).ok());
  release.Notify();
  planning.join();
  ASSERT_TRUE(first_status.ok()) << first_status.error_message();
  EXPECT_EQ(first.text(), "planned");
}

}  // namespace
}  // namespace loom::coordinator
