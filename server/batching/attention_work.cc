#include "server/batching/attention_work.h"

#include <cstring>
#include <utility>

#include "core/base/bfloat16.h"

namespace attnserve::server {

InputTensor InputTensor::FromFloats(absl::Span<const float> values) {
  InputTensor tensor;
  tensor.owned_.assign(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(float));
  tensor.bytes_ = tensor.owned_;
  return tensor;
}

InputTensor& InputTensor::operator=(InputTensor&& other) noexcept {
  if (this == &other) return *this;
  bf16_ = other.bf16_;
  const bool owning = !other.owned_.empty() && other.bytes_.data() == other.owned_.data();
  owned_ = std::move(other.owned_);
  // A moved string may have new storage (short strings live inside the object).
  bytes_ = owning ? absl::string_view(owned_) : other.bytes_;
  other.bytes_ = {};
  return *this;
}

void InputTensor::CopyTo(float* out) const {
  const int64_t count = elements();
  if (!bf16_) {
    std::memcpy(out, bytes_.data(), static_cast<size_t>(count) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes_.data() + 2 * i, 2);
    out[i] = core::Bf16ToFloat(bits);
  }
}

void InputTensor::CopyBf16To(uint16_t* out) const {
  std::memcpy(out, bytes_.data(), bytes_.size());
}

absl::Span<const uint16_t> InputTensor::InPlaceBf16() const {
  if (!bf16_ || reinterpret_cast<uintptr_t>(bytes_.data()) % alignof(uint16_t) != 0) {
    return {};
  }
  return absl::MakeConstSpan(reinterpret_cast<const uint16_t*>(bytes_.data()),
                             static_cast<size_t>(elements()));
}

absl::Span<const float> InputTensor::InPlace() const {
  if (bf16_ || reinterpret_cast<uintptr_t>(bytes_.data()) % alignof(float) != 0)
    return {};
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes_.data()),
                             static_cast<size_t>(elements()));
}

absl::Span<float> AttentionWork::output_values() {
  return absl::MakeSpan(reinterpret_cast<float*>(output.data()), output.size() / 4);
}

absl::Span<float> AttentionWork::attention_values() {
  return absl::MakeSpan(reinterpret_cast<float*>(attention.data()), attention.size() / 4);
}

int64_t AttentionWork::tokens() const {
  int64_t total = 0;
  for (int64_t length : query_lengths) total += length;
  return total;
}

bool AttentionWork::SharesBatchWith(const AttentionWork& other) const {
  if (head_statistics || other.head_statistics) return this == &other;
  return memory_lengths.empty() == other.memory_lengths.empty() &&
         causal == other.causal && head_mask == other.head_mask &&
         return_attention == other.return_attention;
}

}  // namespace attnserve::server
