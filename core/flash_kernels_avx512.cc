// flash_kernels.inc for AVX-512 (compiled with -mavx512f -mfma; see core/CMakeLists.txt).
#include <immintrin.h>

#include "core/flash_kernels.h"

#define FLASH_NAMESPACE avx512
#define FLASH_VEC __m512
#define FLASH_WIDTH 16
#define FLASH_LOAD(p) _mm512_loadu_ps(p)
#define FLASH_STORE(p, v) _mm512_storeu_ps(p, v)
#define FLASH_SET1(x) _mm512_set1_ps(x)
#define FLASH_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define FLASH_ZERO() _mm512_setzero_ps()
#define FLASH_MUL(a, b) _mm512_mul_ps(a, b)
// 32 registers: 8 x 2 score sums, 6 x 4 context sums.
#define FLASH_SCORE_ROWS 8
#define FLASH_CONTEXT_ROWS 6
#define FLASH_CONTEXT_VECTORS 4
#include "core/flash_kernels.inc"
