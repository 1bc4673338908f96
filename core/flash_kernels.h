// The flash kernel's matrix products, register-blocked per ISA (flash_kernels.inc).
// Internal to flash_attention.cc.
#ifndef ATTNSERVE_CORE_FLASH_KERNELS_H_
#define ATTNSERVE_CORE_FLASH_KERNELS_H_

#include <cstdint>

namespace attnserve::core {

// One ISA's kernels. All matrices are row-major f32 with the strides given.
//
// PackKeys: k[keys, head_dim] (stride k_stride) into panels of PanelKeys() keys (two
// vectors), each [head_dim, PanelKeys()], the last one padded with zero keys: the
// layout Scores reads contiguously (K^T read straight from the [L, width] plane would
// walk 4 KB strides that share one L1 set).
//
// Scores: s[rows, keys] (stride keys) = q[rows, head_dim] (stride q_stride) times the
// packed keys; keys a multiple of PanelKeys() (the padded count).
//
// Context: o[rows, head_dim] (stride o_stride) = (first ? 0 : o * rescale[row]) +
// p[rows, keys] (stride p_stride) times v[keys, head_dim] (stride v_stride). head_dim
// must be a multiple of the vector width.
#define ATTNSERVE_FLASH_KERNELS(isa)                                               \
  namespace isa {                                                                  \
  int64_t PanelKeys();                                                             \
  void PackKeys(const float* k, int64_t k_stride, int64_t keys, int64_t head_dim,  \
                float* panels);                                                    \
  void Scores(const float* q, int64_t q_stride, const float* panels, int64_t keys, \
              int64_t rows, int64_t head_dim, float* s);                           \
  void Context(const float* p, int64_t p_stride, const float* v, int64_t v_stride, \
               int64_t rows, int64_t keys, int64_t head_dim, const float* rescale, \
               bool first, float* o, int64_t o_stride);                            \
  }
ATTNSERVE_FLASH_KERNELS(avx512)
ATTNSERVE_FLASH_KERNELS(avx2)
#undef ATTNSERVE_FLASH_KERNELS

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FLASH_KERNELS_H_
