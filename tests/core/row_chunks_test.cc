#include "core/base/row_chunks.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "core/base/scratch_buffer.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

std::vector<int64_t> Chunks(int64_t total) {
  std::vector<int64_t> sizes;
  int64_t next = 0;
  const absl::Status status = ForEachRowChunk(total, [&](int64_t first, int64_t rows) {
    EXPECT_EQ(first, next) << "chunks of " << total << " are not consecutive";
    next = first + rows;
    sizes.push_back(rows);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(next, total);
  return sizes;
}

TEST(RowChunksTest, CoverEveryRowOnceInFewSizesAndFewCalls) {
  std::set<int64_t> sizes;
  for (int64_t total = 1; total <= 8192; ++total) {
    const std::vector<int64_t> chunks = Chunks(total);
    // Powers of two from the floor up, then one remainder below the floor.
    EXPECT_LE(chunks.size(), 14u) << total;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int64_t rows = chunks[i];
      sizes.insert(rows);
      if (rows >= kRowChunkFloor) {
        EXPECT_EQ(rows & (rows - 1), 0) << rows << " in " << total;
      } else {
        EXPECT_EQ(i + 1, chunks.size()) << "a small chunk before the last, in " << total;
      }
    }
  }
  // 64, 128, ..., 8192 and 1..63: 71 sizes for 8192 token counts.
  EXPECT_EQ(sizes.size(), 8u + static_cast<size_t>(kRowChunkFloor - 1));
}

TEST(RowChunksTest, ShortAndPowerOfTwoCountsRunInOneChunk) {
  EXPECT_EQ(Chunks(37), std::vector<int64_t>({37}));
  EXPECT_EQ(Chunks(512), std::vector<int64_t>({512}));
  EXPECT_EQ(Chunks(1150), std::vector<int64_t>({1024, 64, 62}));
  EXPECT_TRUE(Chunks(0).empty());
}

TEST(RowChunksTest, StopsAtTheFirstError) {
  int calls = 0;
  const absl::Status status = ForEachRowChunk(1000, [&](int64_t, int64_t) {
    ++calls;
    return calls == 2 ? absl::InternalError("second") : absl::OkStatus();
  });
  EXPECT_EQ(status.message(), "second");
  EXPECT_EQ(calls, 2);
}

TEST(ScratchBufferTest, GrowsOnlyWhenAskedForMoreAndIsPageAligned) {
  ScratchBuffer buffer;
  EXPECT_EQ(buffer.capacity(), 0u);
  auto* first = static_cast<uint8_t*>(buffer.Reserve(1000));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 4096, 0u);
  EXPECT_GE(buffer.capacity(), 1000u);
  std::memset(first, 7, 1000);
  // Within the capacity: the same memory, its contents kept.
  EXPECT_EQ(buffer.Reserve(buffer.capacity()), first);
  EXPECT_EQ(buffer.Reserve(0), first);
  EXPECT_EQ(first[999], 7);
  const size_t before = buffer.capacity();
  auto* grown = static_cast<uint8_t*>(buffer.Reserve(before + 1));
  ASSERT_NE(grown, nullptr);
  EXPECT_GT(buffer.capacity(), before);
  // All of it writable.
  std::memset(grown, 1, buffer.capacity());
}

}  // namespace
}  // namespace attnserve::core
