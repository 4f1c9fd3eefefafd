// A Store over files in one directory, so that forked processes (which share
// no memory) can meet for the multi-process tests. Test-only: it polls.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/comm/store.h"

namespace loom::comm::testing {

class FileStore : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key);
    const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      out << value;
      if (!out) return absl::InternalError(absl::StrCat("file store: cannot write ", tmp));
    }
    // The rename makes the value appear whole or not at all.
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("file store: cannot rename ", tmp));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      std::ifstream in(Path(key), std::ios::binary);
      if (in) {
        std::stringstream buffer;
        buffer << in.rdbuf();
        return buffer.str();
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("file store: key '", key, "' not set in time"));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    const int lock_fd = open(absl::StrCat(dir_, "/.lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (lock_fd < 0) return absl::InternalError("file store: cannot open the lock file");
    flock(lock_fd, LOCK_EX);
    int64_t value = 0;
    {
      std::ifstream in(Path(key));
      std::string text;
      if (in && std::getline(in, text) && !absl::SimpleAtoi(text, &value)) value = 0;
    }
    value += delta;
    absl::Status status = Set(key, absl::StrCat(value));
    flock(lock_fd, LOCK_UN);
    close(lock_fd);
    if (!status.ok()) return status;
    return value;
  }

 private:
  std::string Path(const std::string& key) const {
    std::string name;
    for (unsigned char c : key) {
      if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
        name += static_cast<char>(c);
      } else {
        name += absl::StrFormat("%%%02x", c);
      }
    }
    return absl::StrCat(dir_, "/", name);
  }

  std::string dir_;
};

}  // namespace loom::comm::testing
