// Pipeline instructions: what one pipeline stage executes, in order, for one
// optimizer step. The trainer runs the list literally with blocking send/recv;
// schedule.h builds the lists and simulator.h checks them.
//
// Chunk numbers are always the executing stage's own: SendActivation(to, mb, c)
// sends the output of this stage's chunk c, RecvActivation(from, mb, c) receives
// the input of this stage's chunk c (the sender labels it with its own chunk,
// which differs at the wrap from the last stage back to stage 0). Peers are
// pipeline stage indices, i.e. positions in the rank's pp group.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::topology {

enum class OpKind {
  kForward,         // run chunk's forward on micro-batch mb; stash its activations
  kBackward,        // run chunk's backward on mb; free its activations
  kRecvActivation,  // from peer: the input of (mb, chunk)
  kSendActivation,  // to peer: the output of (mb, chunk)
  kRecvGradient,    // from peer: the gradient of (mb, chunk)'s output
  kSendGradient,    // to peer: the gradient of (mb, chunk)'s input
  kReduceGradients, // every backward done: finish the data-parallel gradient reduction
  kOptimizerStep,   // apply the step
};

struct Instruction {
  OpKind op = OpKind::kForward;
  int64_t microbatch = 0;
  int64_t chunk = 0;
  int64_t peer = -1;  // send/recv only

  static Instruction Forward(int64_t mb, int64_t chunk) { return {OpKind::kForward, mb, chunk, -1}; }
  static Instruction Backward(int64_t mb, int64_t chunk) { return {OpKind::kBackward, mb, chunk, -1}; }
  static Instruction RecvActivation(int64_t from, int64_t mb, int64_t chunk) {
    return {OpKind::kRecvActivation, mb, chunk, from};
  }
  static Instruction SendActivation(int64_t to, int64_t mb, int64_t chunk) {
    return {OpKind::kSendActivation, mb, chunk, to};
  }
  static Instruction RecvGradient(int64_t from, int64_t mb, int64_t chunk) {
    return {OpKind::kRecvGradient, mb, chunk, from};
  }
  static Instruction SendGradient(int64_t to, int64_t mb, int64_t chunk) {
    return {OpKind::kSendGradient, mb, chunk, to};
  }
  static Instruction ReduceGradients() { return {OpKind::kReduceGradients, 0, 0, -1}; }
  static Instruction OptimizerStep() { return {OpKind::kOptimizerStep, 0, 0, -1}; }

  bool IsCompute() const { return op == OpKind::kForward || op == OpKind::kBackward; }
  bool IsSend() const { return op == OpKind::kSendActivation || op == OpKind::kSendGradient; }
  bool IsRecv() const { return op == OpKind::kRecvActivation || op == OpKind::kRecvGradient; }
  bool IsTransfer() const { return IsSend() || IsRecv(); }
  bool operator==(const Instruction&) const = default;
};

// Compact text, one token per instruction, separated by single spaces:
//   F3 / F3.1        Forward mb 3 (chunk 0 / chunk 1)
//   B3 / B3.1        Backward
//   rA3@0 / rA3.1@0  RecvActivation of mb 3 (chunk 1) from stage 0
//   sA3@2            SendActivation to stage 2
//   rG3@2, sG3@0     RecvGradient, SendGradient
//   RG, OPT          ReduceGradients, OptimizerStep
std::string FormatInstruction(const Instruction& instruction);
std::string FormatInstructions(const std::vector<Instruction>& instructions);
// The inverse of FormatInstructions; INVALID_ARGUMENT names the bad token.
absl::StatusOr<std::vector<Instruction>> ParseInstructions(std::string_view text);

}  // namespace loom::topology
