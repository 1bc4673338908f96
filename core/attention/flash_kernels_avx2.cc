// flash_kernels.inc for AVX2 with FMA (compiled with -mavx2 -mfma; see
// core/CMakeLists.txt).
#include <immintrin.h>

#include "core/attention/flash_kernels.h"

#define FLASH_NAMESPACE avx2
#define FLASH_VEC __m256
#define FLASH_WIDTH 8
#define FLASH_LOAD(p) _mm256_loadu_ps(p)
#define FLASH_STORE(p, v) _mm256_storeu_ps(p, v)
#define FLASH_SET1(x) _mm256_set1_ps(x)
#define FLASH_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define FLASH_ZERO() _mm256_setzero_ps()
#define FLASH_MUL(a, b) _mm256_mul_ps(a, b)
#define FLASH_MAX(a, b) _mm256_max_ps(a, b)
#define FLASH_ADD(a, b) _mm256_add_ps(a, b)
#define FLASH_SUB(a, b) _mm256_sub_ps(a, b)
// 16 registers: 6 x 2 score sums, 6 x 2 context sums.
#define FLASH_SCORE_ROWS 6
#define FLASH_CONTEXT_ROWS 6
#define FLASH_CONTEXT_VECTORS 2

namespace attnserve::core::avx2 {
namespace {

// flash_kernels.h's exponential; 2^n through the exponent bits, and keys below
// kExpLowest (masked ones) exactly 0.
inline __m256 FlashExp(__m256 x) {
  const __m256 kept = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLowest), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpLowest));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC5);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), kept);
}

}  // namespace
}  // namespace attnserve::core::avx2

#include "core/attention/flash_kernels.inc"
