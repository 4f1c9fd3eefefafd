// Stand-in for gloo/common/memory.h, which Debian's libgloo-dev (0.5.0,
// snapshot 2022-05-18) includes from gloo/transport/tcp/*.h but does not
// ship. Only gloo_state.cc includes those headers, to name the TCP context's
// failure signal; it never creates or touches these pointer types, so names
// are all that is needed. It is on the include path with -idirafter: a
// libgloo-dev that ships the real header takes precedence.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class NonOwningPtr {
 public:
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

template <typename T>
class WeakNonOwningPtr {
 private:
  std::weak_ptr<T*> ptr_;
};

template <typename T>
class ShareableNonOwningPtr {
 private:
  std::shared_ptr<T*> ptr_;
};

}  // namespace gloo
