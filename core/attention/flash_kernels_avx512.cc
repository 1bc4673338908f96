// flash_kernels.inc for AVX-512 (compiled with -mavx512f -mfma; see core/CMakeLists.txt).
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() (a self-initialised variable)
// as the unused merge source, which -Wmaybe-uninitialized (and, where the use is in a
// function that is not inlined, -Wuninitialized) reports at every use.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include "core/attention/flash_kernels.h"

#define FLASH_NAMESPACE avx512
#define FLASH_VEC __m512
#define FLASH_WIDTH 16
#define FLASH_LOAD(p) _mm512_loadu_ps(p)
#define FLASH_STORE(p, v) _mm512_storeu_ps(p, v)
#define FLASH_SET1(x) _mm512_set1_ps(x)
#define FLASH_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define FLASH_ZERO() _mm512_setzero_ps()
#define FLASH_MUL(a, b) _mm512_mul_ps(a, b)
#define FLASH_MAX(a, b) _mm512_max_ps(a, b)
#define FLASH_ADD(a, b) _mm512_add_ps(a, b)
#define FLASH_SUB(a, b) _mm512_sub_ps(a, b)
// 32 registers: 8 x 2 score sums, 6 x 4 context sums.
#define FLASH_SCORE_ROWS 8
#define FLASH_CONTEXT_ROWS 6
#define FLASH_CONTEXT_VECTORS 4

namespace attnserve::core::avx512 {
namespace {

// flash_kernels.h's exponential; 2^n by vscalefps, and keys below kExpLowest (masked
// ones) exactly 0.
inline __m512 FlashExp(__m512 x) {
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLowest), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC5);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kept, p, n);
}

}  // namespace
}  // namespace attnserve::core::avx512

#include "core/attention/flash_kernels.inc"
