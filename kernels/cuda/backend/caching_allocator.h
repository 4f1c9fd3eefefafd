// A caching allocator for device memory: freed blocks are kept in free lists
// by size class and handed out again instead of returning to the driver, so a
// training step's many short-lived buffers cost no cudaMalloc/cudaFree (both
// synchronize the device). The raw allocate/release functions are injected, so
// this logic is std-only and testable without a GPU.
//
// Size classes: requests round up to 512 bytes below 1 MiB and to 2 MiB above;
// a block is reused only for a request of exactly its class (no splitting), so
// waste is bounded by the rounding. When the raw allocation fails the cache is
// released and the allocation retried once.
//
// Stream semantics: a block freed here may be reused at once by the next
// Allocate. That is safe only because every user enqueues on one stream (work
// on a freed block is ordered before work on its next owner); callers using
// several streams must synchronize before freeing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace loom::kernels::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // handed out now (rounded sizes)
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes
  int64_t cached_bytes = 0;          // free blocks held in the cache
  int64_t reserved_bytes = 0;        // allocated + cached: what the driver gave us
  int64_t peak_reserved_bytes = 0;
  int64_t num_raw_allocs = 0;        // calls to the raw allocator that succeeded
  int64_t num_cache_hits = 0;        // Allocates served from the cache
  int64_t num_raw_alloc_failures = 0;
};

class CachingAllocator {
 public:
  // raw_alloc returns nullptr on failure; raw_free releases what it returned.
  using RawAlloc = std::function<void*(int64_t bytes)>;
  using RawFree = std::function<void(void* ptr)>;

  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free);
  ~CachingAllocator();  // releases every block, cached or not
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nullptr when bytes <= 0 or the memory is exhausted even after emptying
  // the cache.
  void* Allocate(int64_t bytes);
  // ptr must come from Allocate (nullptr is ignored); the block joins the cache.
  void Free(void* ptr);
  // Returns every cached block to the raw allocator.
  void EmptyCache();
  // Resets the peaks to the current values.
  void ResetPeaks();
  AllocatorStats stats() const;

  static int64_t RoundSize(int64_t bytes);

 private:
  void EmptyCacheLocked();

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_blocks_;  // size class -> blocks
  std::unordered_map<void*, int64_t> live_blocks_;     // handed out -> size class
  AllocatorStats stats_;
};

}  // namespace loom::kernels::cuda
