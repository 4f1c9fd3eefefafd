#include "tools/loadgen/coordinator_probe.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_settings.h"

extern char** environ;

namespace loom::loadgen {

absl::StatusOr<ProcSample> SampleProcess(int pid) {
  ProcSample sample;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) {
    return absl::NotFoundError(absl::StrCat("/proc/", pid, "/stat: no such process (--coordinator_pid)"));
  }
  // Fields after the command name, which may hold spaces, start after ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  if (fields.size() < 13) return absl::DataLossError(absl::StrCat("/proc/", pid, "/stat: too short"));
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  sample.cpu_seconds = (std::stod(fields[11]) + std::stod(fields[12])) / ticks;  // utime, stime
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      sample.rss_bytes = std::stoll(line.substr(6)) * 1024;
      break;
    }
  }
  std::error_code error;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::ifstream schedstat(task.path() / "schedstat");
    double on_cpu_ns = 0, waiting_ns = 0;
    if (schedstat >> on_cpu_ns >> waiting_ns) sample.run_delay_seconds += waiting_ns / 1e9;
  }
  return sample;
}

int PollJobOnly(std::shared_ptr<grpc::Channel> admin, const std::string& job_id) {
  auto stub = loom::v1::JobService::NewStub(admin);
  std::atomic<bool> stop{false};
  std::thread parent([&stop] {
    char c;
    while (read(0, &c, 1) > 0) {
    }
    stop = true;  // the parent closed our stdin, or went away
  });
  while (!stop) {
    auto context = rpc::UnaryContext();
    loom::v1::GetJobRequest request;
    request.set_id(job_id);
    loom::v1::Job job;
    const absl::Time start = absl::Now();
    grpc::Status status = stub->GetJob(context.get(), request, &job);
    if (status.ok()) {
      std::printf("%.3f\n", absl::ToDoubleMilliseconds(absl::Now() - start));
    } else {
      std::printf("fail\n");
    }
    std::fflush(stdout);
    absl::SleepFor(absl::Milliseconds(250));
  }
  parent.join();
  return 0;
}

CoordinatorProbe::CoordinatorProbe(ProbeOptions options)
    : options_(std::move(options)), stub_(loom::v1::JobService::NewStub(options_.admin)) {
  // The first CPU sample now: a window may start right after this (a submit).
  if (options_.coordinator_pid > 0) {
    if (absl::StatusOr<ProcSample> sample = SampleProcess(options_.coordinator_pid); sample.ok()) {
      absl::MutexLock lock(&mu_);
      cpu_samples_.emplace_back(absl::Now(), sample->cpu_seconds);
    }
  }
  poller_ = std::thread([this] { PollJobs(); });
  lister_ = std::thread([this] { RunLists(); });
}

CoordinatorProbe::~CoordinatorProbe() {
  stop_ = true;
  poller_.join();
  lister_.join();
  if (poll_stdin_ >= 0) close(poll_stdin_);
  if (poll_reader_.joinable()) poll_reader_.join();
  if (poll_pid_ > 0) {
    int status = 0;
    waitpid(poll_pid_, &status, 0);
  }
}

void CoordinatorProbe::Watch(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    job_id_ = job_id;
  }
  if (!options_.poll_command.empty() && poll_pid_ == 0) StartPollProcess(job_id);
}

void CoordinatorProbe::StartPollProcess(const std::string& job_id) {
  int in[2];
  int out[2];
  if (pipe(in) != 0) return;
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    return;
  }
  std::vector<std::string> args = options_.poll_command;
  args.push_back(absl::StrCat("--poll_job=", job_id));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  for (int fd : {in[0], in[1], out[0], out[1]}) posix_spawn_file_actions_addclose(&actions, fd);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (spawned != 0) {
    close(in[1]);
    close(out[0]);
    return;
  }
  poll_pid_ = pid;
  poll_stdin_ = in[1];
  const int fd = out[0];
  poll_reader_ = std::thread([this, fd] { ReadPollProcess(fd); });
}

void CoordinatorProbe::ReadPollProcess(int fd) {
  std::FILE* f = fdopen(fd, "r");
  if (f == nullptr) {
    close(fd);
    return;
  }
  char line[64];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    LatencyRecorder& get_job = own_get_job_[phase_.load()];
    double ms = 0;
    if (std::sscanf(line, "%lf", &ms) == 1) {
      get_job.Record(absl::Milliseconds(ms));
    } else {
      get_job.RecordFailure();
    }
  }
  std::fclose(f);
}

loom::v1::Job CoordinatorProbe::LastJob() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

void CoordinatorProbe::PollJobs() {
  while (!stop_) {
    if (options_.coordinator_pid > 0) {
      if (absl::StatusOr<ProcSample> s = SampleProcess(options_.coordinator_pid); s.ok()) {
        int64_t seen = max_rss_.load();
        while (s->rss_bytes > seen && !max_rss_.compare_exchange_weak(seen, s->rss_bytes)) {
        }
        absl::MutexLock lock(&mu_);
        cpu_samples_.emplace_back(absl::Now(), s->cpu_seconds);
      }
    }
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      id = job_id_;
    }
    if (!id.empty()) {
      auto context = rpc::UnaryContext();
      loom::v1::GetJobRequest request;
      request.set_id(id);
      loom::v1::Job job;
      const absl::Time start = absl::Now();
      grpc::Status status = stub_->GetJob(context.get(), request, &job);
      LatencyRecorder& get_job = get_job_latency(phase_.load());
      if (status.ok()) {
        get_job.Record(absl::Now() - start);
        absl::MutexLock lock(&mu_);
        last_ = std::move(job);
      } else {
        get_job.RecordFailure();
      }
    }
    if (double load = 0; std::FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf", &load) == 1) {
        absl::MutexLock lock(&mu_);
        load_sum_ += load;
        load_max_ = std::max(load_max_, load);
        ++load_samples_;
      }
      std::fclose(f);
    }
    const absl::Time asleep = absl::Now();
    absl::SleepFor(options_.get_job_interval);
    wake_[phase_.load()].Record(absl::Now() - asleep - options_.get_job_interval);
  }
}

double CoordinatorProbe::CpuSecondsBetween(absl::Time from, absl::Time to) const {
  absl::MutexLock lock(&mu_);
  // The CPU time at t, between the samples around it.
  auto at = [this](absl::Time t) -> double {
    for (size_t i = 1; i < cpu_samples_.size(); ++i) {
      const auto& [t1, c1] = cpu_samples_[i];
      if (t1 < t) continue;
      const auto& [t0, c0] = cpu_samples_[i - 1];
      if (t0 > t) return -1;
      const double span = absl::ToDoubleSeconds(t1 - t0);
      return span <= 0 ? c1 : c0 + (c1 - c0) * absl::ToDoubleSeconds(t - t0) / span;
    }
    return -1;
  };
  const double a = at(from);
  const double b = at(to);
  return a < 0 || b < 0 ? -1 : b - a;
}

double CoordinatorProbe::mean_load() const {
  absl::MutexLock lock(&mu_);
  return load_samples_ > 0 ? load_sum_ / static_cast<double>(load_samples_) : 0;
}

double CoordinatorProbe::max_load() const {
  absl::MutexLock lock(&mu_);
  return load_max_;
}

void CoordinatorProbe::RunLists() {
  while (!stop_) {
    absl::SleepFor(options_.list_interval);
    {
      absl::MutexLock lock(&mu_);
      if (job_id_.empty() || options_.loomctl.empty()) continue;
    }
    std::vector<std::string> args = {options_.loomctl};
    args.insert(args.end(), options_.loomctl_flags.begin(), options_.loomctl_flags.end());
    args.push_back("list");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    LatencyRecorder& list = list_latency(phase_.load());
    const absl::Time start = absl::Now();
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
      posix_spawn_file_actions_destroy(&actions);
      list.RecordFailure();
      continue;
    }
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      list.Record(absl::Now() - start);
    } else {
      list.RecordFailure();
    }
  }
}

}  // namespace loom::loadgen
