// Quotas (docs/scheduling.md): the devices of each kind a user or a group may
// hold at once, which group each user counts in, and the highest
// scheduling.priority each user may ask for. Set by admins (`loomctl quota
// set`), read by the scheduler on every pass and by admission. Kept the way
// the token list is (auth/user_tokens.h): the whole book as text in a file of
// the state directory, or in an etcd key every leader reads; a change is saved
// before it takes effect, and readers never wait for a save.
//
// The text, one entry a line:
//   user alice gpu 8        alice may hold 8 gpu
//   group ml gpu 16         the users of group ml together may hold 16 gpu
//   member alice ml         alice counts in group ml
//   max_priority alice 10   alice may submit scheduling.priority up to 10
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth/user_tokens.h"
#include "coordinator/jobs/scheduling_policy.h"

namespace loom::coordinator {

struct QuotaTable {
  sched::Quotas quotas;
  std::map<std::string, int64_t> max_priority;  // by user; absent: no cap

  bool operator==(const QuotaTable& other) const;
};

// The text form (above) and back; a line that breaks a rule is DATA_LOSS
// naming `source`, the line and the rule.
std::string FormatQuotaTable(const QuotaTable& table);
absl::StatusOr<QuotaTable> ParseQuotaTable(const std::string& text, const std::string& source);

// One change an admin asks for. Unset parts stay as they are.
struct QuotaChange {
  std::string user;   // exactly one of user and group
  std::string group;
  std::string device_kind;                // with devices: cpu | gpu
  std::optional<int64_t> devices;         // < 0: the limit is removed
  std::optional<std::string> member_of;   // user: "" leaves every group
  std::optional<int64_t> max_priority;    // user
  bool remove_max_priority = false;        // user
};

class QuotaBook {
 public:
  // Reads what persistence holds (nothing: no quotas).
  static absl::StatusOr<std::unique_ptr<QuotaBook>> Open(auth::TokenPersistence persistence);

  // Checks the change (INVALID_ARGUMENT naming the field and the rule), saves
  // the book with it, then makes it current; a failed save changes nothing
  // and is UNAVAILABLE naming why.
  absl::Status Apply(const QuotaChange& change);

  // The book in force (never waits for a save).
  std::shared_ptr<const QuotaTable> Current() const;
  // OK, or INVALID_ARGUMENT when `user` may not ask for `priority`.
  absl::Status CheckPriority(const std::string& user, int64_t priority) const;

 private:
  explicit QuotaBook(auth::TokenPersistence persistence) : persistence_(std::move(persistence)) {}

  const auth::TokenPersistence persistence_;
  absl::Mutex write_mu_;         // one change at a time, held across its save
  mutable absl::Mutex read_mu_;  // held only to read or swap the pointer
  std::shared_ptr<const QuotaTable> table_ ABSL_GUARDED_BY(read_mu_) =
      std::make_shared<const QuotaTable>();
};

}  // namespace loom::coordinator
