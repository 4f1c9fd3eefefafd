#include "common/topology/instruction.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::topology {
namespace {

const char* Prefix(OpKind op) {
  switch (op) {
    case OpKind::kForward: return "F";
    case OpKind::kBackward: return "B";
    case OpKind::kRecvActivation: return "rA";
    case OpKind::kSendActivation: return "sA";
    case OpKind::kRecvGradient: return "rG";
    case OpKind::kSendGradient: return "sG";
    case OpKind::kReduceGradients: return "RG";
    case OpKind::kOptimizerStep: return "OPT";
  }
  return "?";
}

bool ParseCount(absl::string_view s, int64_t* out) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(s, out);
}

}  // namespace

std::string FormatInstruction(const Instruction& in) {
  if (in.op == OpKind::kReduceGradients || in.op == OpKind::kOptimizerStep) return Prefix(in.op);
  std::string out = absl::StrCat(Prefix(in.op), in.microbatch);
  if (in.chunk != 0) absl::StrAppend(&out, ".", in.chunk);
  if (in.IsTransfer()) absl::StrAppend(&out, "@", in.peer);
  return out;
}

std::string FormatInstructions(const std::vector<Instruction>& instructions) {
  std::string out;
  for (const Instruction& in : instructions) {
    if (!out.empty()) out += ' ';
    out += FormatInstruction(in);
  }
  return out;
}

absl::StatusOr<std::vector<Instruction>> ParseInstructions(std::string_view text_in) {
  // This Abseil build's string_view is its own type, not std::string_view.
  const absl::string_view text(text_in.data(), text_in.size());
  std::vector<Instruction> out;
  for (absl::string_view token : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("instruction token '", token, "' (#", out.size(), "): ", why));
    };
    if (token == "RG") { out.push_back(Instruction::ReduceGradients()); continue; }
    if (token == "OPT") { out.push_back(Instruction::OptimizerStep()); continue; }
    Instruction in;
    absl::string_view rest = token;
    if (rest.substr(0, 2) == "rA") in.op = OpKind::kRecvActivation;
    else if (rest.substr(0, 2) == "sA") in.op = OpKind::kSendActivation;
    else if (rest.substr(0, 2) == "rG") in.op = OpKind::kRecvGradient;
    else if (rest.substr(0, 2) == "sG") in.op = OpKind::kSendGradient;
    else if (rest.substr(0, 1) == "F") in.op = OpKind::kForward;
    else if (rest.substr(0, 1) == "B") in.op = OpKind::kBackward;
    else return bad("unknown kind; expected F, B, rA, sA, rG, sG, RG or OPT");
    rest.remove_prefix(in.IsTransfer() ? 2 : 1);
    if (in.IsTransfer()) {
      const size_t at = rest.find('@');
      if (at == absl::string_view::npos) return bad("a send/recv needs '@<peer stage>'");
      if (!ParseCount(rest.substr(at + 1), &in.peer)) return bad("peer must be a number");
      rest = rest.substr(0, at);
    }
    const size_t dot = rest.find('.');
    if (dot != absl::string_view::npos) {
      if (!ParseCount(rest.substr(dot + 1), &in.chunk)) return bad("chunk must be a number");
      rest = rest.substr(0, dot);
    }
    if (!ParseCount(rest, &in.microbatch)) return bad("micro-batch must be a number");
    out.push_back(in);
  }
  return out;
}

}  // namespace loom::topology
