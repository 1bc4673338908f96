#include "core/base/scratch_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace attnserve::core {

ScratchBuffer::~ScratchBuffer() {
  if (data_ != nullptr) munmap(data_, capacity_);
}

void* ScratchBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // An eighth more than asked, in whole pages: the next few larger batches fit without
  // a new mapping.
  const size_t wanted = std::max<size_t>(bytes + bytes / 8, 1);
  const size_t grown = (wanted + page - 1) / page * page;
  if (data_ != nullptr) munmap(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
  void* mapped =
      mmap(nullptr, grown, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    std::fprintf(stderr, "attnserve: out of memory mapping %zu bytes of scratch\n",
                 grown);
    std::abort();
  }
  data_ = mapped;
  capacity_ = grown;
  return data_;
}

}  // namespace attnserve::core
