#include "worker/trainer/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/commit_faults.h"

namespace loom::trainer {
namespace {

[[noreturn]] void Die(const std::string& where) {
  std::fprintf(stderr, "loom-trainer: LOOM_TEST_FAULT: killing this rank %s\n", where.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);
}

}  // namespace

absl::StatusOr<FaultPlan> ParseFaultPlan(const std::string& text) {
  const auto bad = [&text](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("LOOM_TEST_FAULT='", text, "': ", why,
                     " (expected POINT@STEP[#RANK][:always], see fault_injection.h)"));
  };
  FaultPlan plan;
  std::string rest = text;
  if (const size_t colon = rest.find(':'); colon != std::string::npos) {
    if (rest.substr(colon + 1) != "always") return bad("unknown suffix");
    plan.always = true;
    rest = rest.substr(0, colon);
  }
  const size_t at = rest.find('@');
  if (at == std::string::npos) return bad("missing @STEP");
  plan.point = rest.substr(0, at);
  std::string step = rest.substr(at + 1);
  if (const size_t hash = step.find('#'); hash != std::string::npos) {
    if (!absl::SimpleAtoi(step.substr(hash + 1), &plan.rank) || plan.rank < 0) {
      return bad("bad #RANK");
    }
    step = step.substr(0, hash);
  }
  if (!absl::SimpleAtoi(step, &plan.step) || plan.step < 1) return bad("bad STEP");
  const std::string points[] = {"after_step",    "files_written", "truncate_shard",
                                "before_metadata", "before_rename", "nan_grad",
                                "loss_spike"};
  bool known = false;
  for (const auto& p : points) known = known || p == plan.point;
  if (!known) return bad("unknown POINT");
  if (plan.point == "loss_spike" && plan.rank >= 0) {
    return bad("loss_spike takes no #RANK (the loss is the job's: every rank sees the spike)");
  }
  return plan;
}

absl::StatusOr<std::function<void(int64_t)>> InstallFaultPlan(int32_t rank, int32_t attempt) {
  const char* text = std::getenv("LOOM_TEST_FAULT");
  std::function<void(int64_t)> nothing = [](int64_t) {};
  if (text == nullptr || *text == '\0') return nothing;
  absl::StatusOr<FaultPlan> plan = ParseFaultPlan(text);
  if (!plan.ok()) return plan.status();
  if ((!plan->always && attempt != 1) || (plan->rank >= 0 && plan->rank != rank)) {
    // A rank that lives on into a later attempt (in-place recovery) drops
    // the hook its first attempt installed.
    engine::SetCommitFaultHook(nullptr);
    return nothing;
  }
  if (plan->point == "nan_grad" || plan->point == "loss_spike") {
    engine::SetCommitFaultHook(nullptr);  // set on the loop instead (StepFaultsFor)
    return nothing;
  }
  if (plan->point == "after_step") {
    const int64_t at = plan->step;
    return std::function<void(int64_t)>([at](int64_t step) {
      if (step == at) Die(absl::StrCat("after step ", step));
    });
  }
  const FaultPlan p = *plan;
  engine::SetCommitFaultHook([p](engine::CommitPoint point, int64_t step, const std::string& path) {
    if (step != p.step) return;
    const std::string name = engine::CommitPointName(point);
    if (p.point == "truncate_shard" && point == engine::CommitPoint::kFilesWritten) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(path, ec);
      if (!ec) std::filesystem::resize_file(path, size / 2, ec);
      Die(absl::StrCat("after truncating ", path, " in the commit of step ", step));
    }
    if (p.point == name) Die(absl::StrCat("at ", name, " in the commit of step ", step));
  });
  return nothing;
}

absl::StatusOr<engine::StepFaults> StepFaultsFor(int32_t rank, int32_t attempt) {
  engine::StepFaults faults;
  const char* text = std::getenv("LOOM_TEST_FAULT");
  if (text == nullptr || *text == '\0') return faults;
  absl::StatusOr<FaultPlan> plan = ParseFaultPlan(text);
  if (!plan.ok()) return plan.status();
  if ((!plan->always && attempt != 1) || (plan->rank >= 0 && plan->rank != rank)) return faults;
  if (plan->point == "nan_grad") faults.nan_gradient_step = plan->step;
  if (plan->point == "loss_spike") faults.loss_spike_step = plan->step;
  return faults;
}

}  // namespace loom::trainer
