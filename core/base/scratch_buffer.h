// ScratchBuffer: per-batch working memory that grows to the largest batch seen and gives
// its pages back to the system when it grows, instead of leaving them in the heap.
#ifndef ATTNSERVE_CORE_BASE_SCRATCH_BUFFER_H_
#define ATTNSERVE_CORE_BASE_SCRATCH_BUFFER_H_

#include <cstddef>

namespace attnserve::core {

// Backed by its own anonymous mapping (page-aligned). Batches grow a few tokens at a
// time; from malloc, every new largest batch left its old blocks behind as holes too
// small for the next (a served encoder's heap grew by tens of MiB over a minute of
// mixed lengths). A mapping is returned whole on growth, and pages that no batch has
// touched take no memory. Not thread-safe; not copyable.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // At least `bytes` of uninitialised memory (aligned to a page), valid until the next
  // call that asks for more than capacity(); the contents do not survive growth.
  // Aborts when the system refuses the mapping (as operator new would throw).
  void* Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_BASE_SCRATCH_BUFFER_H_
