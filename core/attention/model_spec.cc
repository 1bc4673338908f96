#include "core/attention/model_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve::core {

namespace {
constexpr int64_t kMaxDModel = 65536;
}  // namespace

absl::string_view PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kInt8:
      return "int8";
  }
  return "unknown";
}

absl::Status ModelSpec::Validate() const {
  if (d_model < 1 || d_model > kMaxDModel) {
    return absl::InvalidArgumentError(
        absl::StrCat("d_model must be in [1, ", kMaxDModel, "], got ", d_model));
  }
  if (num_heads < 1 || num_heads > d_model) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads must be in [1, d_model=", d_model, "], got ", num_heads));
  }
  if (head_size < 0 || head_size > kMaxDModel) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_size must be in [0, ", kMaxDModel,
                     "] (0: d_model / num_heads), got ", head_size));
  }
  if (head_size == 0 && d_model % num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads must divide d_model: d_model=", d_model,
                     " is not a multiple of num_heads=", num_heads));
  }
  if (num_kv_heads < 0 || num_kv_heads > num_heads ||
      (num_kv_heads > 0 && num_heads % num_kv_heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_kv_heads must be 0 (one per query head) or divide num_heads=", num_heads,
        ", got ", num_kv_heads));
  }
  if (qk_norm && !(qk_norm_eps > 0.0f && std::isfinite(qk_norm_eps))) {
    return absl::InvalidArgumentError(
        absl::StrCat("qk_norm_eps must be finite and > 0, got ", qk_norm_eps));
  }
  // int8 sums of 255 * 127 per term stay within int32 up to this many terms: the
  // out-projection sums over the heads' width.
  constexpr int64_t kMaxInt8Terms = 65536;
  if (precision == Precision::kInt8 && head_size > 0 &&
      num_heads * head_size > kMaxInt8Terms) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads * head_size must be at most ", kMaxInt8Terms,
                     " for int8 precision (int32 sums), got ", num_heads * head_size));
  }
  if (precision != Precision::kFp32 && precision != Precision::kBf16 &&
      precision != Precision::kInt8) {
    return absl::InvalidArgumentError("precision must be fp32, bf16 or int8");
  }
  for (size_t i = 0; i < pruned_heads.size(); ++i) {
    const int64_t head = pruned_heads[i];
    if (head < 0 || head >= num_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pruned_heads[", i, "] must be in [0, ", num_heads, "), got ", head));
    }
    if (i > 0 && head <= pruned_heads[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("pruned_heads must be ascending without repeats, got ",
                       absl::StrJoin(pruned_heads, ",")));
    }
  }
  if (static_cast<int64_t>(pruned_heads.size()) >= num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruned_heads must leave at least one of the ", num_heads,
                     " heads, got ", pruned_heads.size(), " pruned"));
  }
  return absl::OkStatus();
}

bool ModelSpec::IsPruned(int64_t head) const {
  return std::binary_search(pruned_heads.begin(), pruned_heads.end(), head);
}

std::string ModelSpec::DebugString() const {
  std::string text = absl::StrCat("d_model=", d_model, " num_heads=", num_heads,
                                  " precision=", PrecisionName(precision));
  if (head_size > 0) absl::StrAppend(&text, " head_size=", head_size);
  if (num_kv_heads > 0) absl::StrAppend(&text, " num_kv_heads=", num_kv_heads);
  if (qk_norm) absl::StrAppend(&text, " qk_norm");
  if (!pruned_heads.empty()) {
    absl::StrAppend(&text, " pruned_heads=", absl::StrJoin(pruned_heads, ","));
  }
  return text;
}

}  // namespace attnserve::core
