// A fresh directory for one test, under $TEST_TMPDIR, else $TMPDIR, else
// /tmp, removed with everything in it by the destructor.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace loom::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "loom_test") {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    // mkdtemp replaces the template's last six characters.
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/" + prefix + "_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // Empty when the directory could not be made.
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace loom::testing
