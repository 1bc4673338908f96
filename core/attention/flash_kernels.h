// The flash kernel's matrix products, register-blocked per ISA (flash_kernels.inc).
// Internal to flash_attention.cc.
#ifndef ATTNSERVE_CORE_ATTENTION_FLASH_KERNELS_H_
#define ATTNSERVE_CORE_ATTENTION_FLASH_KERNELS_H_

#include <cstdint>

namespace attnserve::core {

// exp(x) for x <= 0 (a score minus its row's maximum), in every unit: x = n ln2 + r with
// |r| <= ln2/2, e^r by a degree-5 polynomial (least-squares on Chebyshev nodes with p(0)
// = 1; relative error 1.1e-7, the float's own precision), 2^n through the exponent. Below
// -87 (masked keys are -inf) the result is exactly 0, never a denormal.
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpLowest = -87.0f;
inline constexpr float kC1 = 0.99999953147538780f;
inline constexpr float kC2 = 0.49999140736651565f;
inline constexpr float kC3 = 0.16668114578133697f;
inline constexpr float kC4 = 0.04189877223934420f;
inline constexpr float kC5 = 0.00826153401177056f;

// One ISA's kernels. All matrices are row-major f32 with the strides given.
//
// PackKeys: k[keys, head_dim] (stride k_stride) into panels of PanelKeys() keys (two
// vectors), each [head_dim, PanelKeys()], the last one padded with zero keys: the
// layout Scores reads contiguously (K^T read straight from the [L, width] plane would
// walk 4 KB strides that share one L1 set).
//
// Scores: s[rows, stride] = q[rows, head_dim] (stride q_stride) times the packed keys,
// stride a multiple of PanelKeys() (whole panels); row_max[r] = the largest of row r's
// first `keys` <= stride scores, found while they are still in registers (the softmax
// needs it, and a second pass over the scores cost 5% of the kernel).
//
// RowMax: the largest of s[0, n) (-inf for n = 0).
// ExpShift: s[j] = exp(s[j] - shift) for j < n (shift >= every s[j]); returns their sum.
//
// Context: o[rows, head_dim] (stride o_stride) = (first ? 0 : o * rescale[row]) +
// p[rows, keys] (stride p_stride) times v[keys, head_dim] (stride v_stride). head_dim
// must be a multiple of the vector width.
#define ATTNSERVE_FLASH_KERNELS(isa)                                                   \
  namespace isa {                                                                      \
  int64_t PanelKeys();                                                                 \
  float RowMax(const float* s, int64_t n);                                             \
  float ExpShift(float* s, int64_t n, float shift);                                    \
  void PackKeys(const float* k, int64_t k_stride, int64_t keys, int64_t head_dim,      \
                float* panels);                                                        \
  void Scores(const float* q, int64_t q_stride, const float* panels, int64_t stride,   \
              int64_t keys, int64_t rows, int64_t head_dim, float* s, float* row_max); \
  void Context(const float* p, int64_t p_stride, const float* v, int64_t v_stride,     \
               int64_t rows, int64_t keys, int64_t head_dim, const float* rescale,     \
               bool first, float* o, int64_t o_stride);                                \
  }
ATTNSERVE_FLASH_KERNELS(avx512)
ATTNSERVE_FLASH_KERNELS(avx2)
#undef ATTNSERVE_FLASH_KERNELS

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_FLASH_KERNELS_H_
