// flash_kernels.inc for AVX2 with FMA (compiled with -mavx2 -mfma; see
// core/CMakeLists.txt).
#include <immintrin.h>

#include "core/flash_kernels.h"

#define FLASH_NAMESPACE avx2
#define FLASH_VEC __m256
#define FLASH_WIDTH 8
#define FLASH_LOAD(p) _mm256_loadu_ps(p)
#define FLASH_STORE(p, v) _mm256_storeu_ps(p, v)
#define FLASH_SET1(x) _mm256_set1_ps(x)
#define FLASH_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define FLASH_ZERO() _mm256_setzero_ps()
#define FLASH_MUL(a, b) _mm256_mul_ps(a, b)
// 16 registers: 6 x 2 score sums, 6 x 2 context sums.
#define FLASH_SCORE_ROWS 6
#define FLASH_CONTEXT_ROWS 6
#define FLASH_CONTEXT_VECTORS 2
#include "core/flash_kernels.inc"
