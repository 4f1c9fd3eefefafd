#include "kernels/cuda/backend/caching_allocator.h"

#include <algorithm>
#include <utility>

namespace loom::kernels::cuda {
namespace {
constexpr int64_t kSmallLimit = int64_t{1} << 20;
constexpr int64_t kSmallRound = 512;
constexpr int64_t kLargeRound = int64_t{2} << 20;

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
}  // namespace

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
  for (auto& [ptr, size] : live_blocks_) raw_free_(ptr);
  live_blocks_.clear();
}

int64_t CachingAllocator::RoundSize(int64_t bytes) {
  if (bytes <= 0) return 0;
  return bytes < kSmallLimit ? RoundUp(bytes, kSmallRound) : RoundUp(bytes, kLargeRound);
}

void* CachingAllocator::Allocate(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  const int64_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.num_cache_hits;
  } else {
    ptr = raw_alloc_(size);
    if (ptr == nullptr) {
      // Out of memory with blocks of other sizes idle: give them back, retry.
      ++stats_.num_raw_alloc_failures;
      EmptyCacheLocked();
      ptr = raw_alloc_(size);
      if (ptr == nullptr) {
        ++stats_.num_raw_alloc_failures;
        return nullptr;
      }
    }
    ++stats_.num_raw_allocs;
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  live_blocks_.emplace(ptr, size);
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return ptr;
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_blocks_.find(ptr);
  if (it == live_blocks_.end()) return;  // not ours: never hand a foreign pointer out again
  const int64_t size = it->second;
  live_blocks_.erase(it);
  free_blocks_[size].push_back(ptr);
  stats_.allocated_bytes -= size;
  stats_.cached_bytes += size;
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* ptr : blocks) {
      raw_free_(ptr);
      stats_.reserved_bytes -= size;
      stats_.cached_bytes -= size;
    }
  }
  free_blocks_.clear();
}

void CachingAllocator::ResetPeaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace loom::kernels::cuda
