#include "server/batching/encoder_work.h"

#include <numeric>

namespace attnserve::server {

int64_t EncoderWork::tokens() const {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

bool EncoderWork::SharesBatchWith(const EncoderWork& other) const {
  return !head_statistics && !other.head_statistics &&
         token_ids.empty() == other.token_ids.empty() && head_mask == other.head_mask;
}

}  // namespace attnserve::server
