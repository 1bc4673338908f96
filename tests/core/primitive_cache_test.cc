#include "core/attention/primitive_cache.h"

#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

absl::StatusOr<CachedPrimitive> MakeEmpty(int& calls) {
  ++calls;
  return CachedPrimitive{};
}

PrimitiveKey Key(int64_t a) { return PrimitiveKey{PrimitiveKind::kScores, {1, a, a, 0}}; }

TEST(PrimitiveCacheTest, CreatesOncePerKey) {
  PrimitiveCache cache(4);
  int calls = 0;
  const auto create = [&] { return MakeEmpty(calls); };
  ASSERT_TRUE(cache.GetOrCreate(Key(1), create).ok());
  ASSERT_TRUE(cache.GetOrCreate(Key(1), create).ok());
  ASSERT_TRUE(cache.GetOrCreate(Key(2), create).ok());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.creations(), 2);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PrimitiveCacheTest, EvictsTheLeastRecentlyUsed) {
  PrimitiveCache cache(2);
  int calls = 0;
  const auto create = [&] { return MakeEmpty(calls); };
  ASSERT_TRUE(cache.GetOrCreate(Key(1), create).ok());
  ASSERT_TRUE(cache.GetOrCreate(Key(2), create).ok());
  ASSERT_TRUE(cache.GetOrCreate(Key(1), create).ok());  // 2 is now the oldest
  ASSERT_TRUE(cache.GetOrCreate(Key(3), create).ok());  // evicts 2
  EXPECT_EQ(calls, 3);
  ASSERT_TRUE(cache.GetOrCreate(Key(1), create).ok());
  EXPECT_EQ(calls, 3);
  ASSERT_TRUE(cache.GetOrCreate(Key(2), create).ok());
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PrimitiveCacheTest, DoesNotCacheFailures) {
  PrimitiveCache cache(2);
  int calls = 0;
  const auto fail = [&]() -> absl::StatusOr<CachedPrimitive> {
    ++calls;
    return absl::InternalError("boom");
  };
  EXPECT_EQ(cache.GetOrCreate(Key(1), fail).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cache.GetOrCreate(Key(1), fail).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace attnserve::core
