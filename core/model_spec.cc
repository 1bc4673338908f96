#include "core/model_spec.h"

#include "absl/strings/str_cat.h"

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
  if (d_model % num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads must divide d_model: d_model=", d_model,
                     " is not a multiple of num_heads=", num_heads));
  }
  if (precision != Precision::kFp32 && precision != Precision::kBf16) {
    return absl::InvalidArgumentError("precision must be fp32 or bf16");
  }
  return absl::OkStatus();
}

std::string ModelSpec::DebugString() const {
  return absl::StrCat("d_model=", d_model, " num_heads=", num_heads,
                      " precision=", PrecisionName(precision));
}

}  // namespace attnserve::core
