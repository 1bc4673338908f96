#include "core/attention/primitive_cache.h"

#include "core/base/status_macros.h"

namespace attnserve::core {

absl::StatusOr<CachedPrimitive*> PrimitiveCache::GetOrCreate(
    const PrimitiveKey& key,
    absl::FunctionRef<absl::StatusOr<CachedPrimitive>()> create) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }
  ATTN_ASSIGN_OR_RETURN(CachedPrimitive created, create());
  ++creations_;
  if (entries_.size() >= capacity_) {
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
  entries_.emplace_front(key, std::move(created));
  index_[key] = entries_.begin();
  return &entries_.front().second;
}

}  // namespace attnserve::core
