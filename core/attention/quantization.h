// Dynamic int8 quantization for matrix products, as ONNX Runtime's and PyTorch's
// dynamically quantized Linear layers do it on CPUs:
//   weights W [out, in]: int8, symmetric, one scale per output channel, made once;
//   activations X [rows, in]: uint8, asymmetric, one scale and zero point per row
//   (token), made per call; X W^T is accumulated in int32 (oneDNN's u8s8 matmul), then
//   Y[i, j] = s_x[i] s_w[j] (acc[i, j] - z_x[i] sum_k Wq[j, k]) + b[j]  in f32.
// The loops here are plain C++ compiled for AVX-512, AVX2 and the baseline, picked at run
// time; they run over OpenMP's threads when the caller has more than one.
#ifndef ATTNSERVE_CORE_ATTENTION_QUANTIZATION_H_
#define ATTNSERVE_CORE_ATTENTION_QUANTIZATION_H_

#include <cstdint>
#include <vector>

namespace attnserve::core {

// The largest quantized magnitudes. Without VNNI, x86's u8 x s8 instruction
// (vpmaddubsw) adds two products into a saturating int16: 255 * 127 * 2 overflows it,
// 255 * 63 * 2 does not, so weights keep 7 bits there (as oneDNN advises).
struct Int8Levels {
  int activation = 255;  // uint8 codes are [0, activation]
  int weight = 127;      // int8 codes are [-weight, weight]
};
// The levels for this CPU: 255/127 with VNNI (oneDNN's ISA avx512_core_vnni, avx2_vnni or
// newer), else 255/63.
Int8Levels Int8LevelsForCpu();

// A weight matrix [out, in] quantized per output channel.
struct QuantizedMatrix {
  int64_t out = 0;
  std::vector<int8_t> values;      // [out, in], row-major
  std::vector<float> scales;       // [out]: W[j, k] ~ scales[j] * values[j, k]
  std::vector<float> column_sums;  // [out]: sum_k values[j, k], for the zero points
};

// `weights` [out, in] (row-major) quantized with codes in [-levels, levels]; a row of
// zeros gets scale 1. REQUIRES: weights has out * in finite values, levels in [1, 127].
QuantizedMatrix QuantizeWeights(const float* weights, int64_t out, int64_t in,
                                int levels);

// Rows [rows, width] of f32 into uint8 codes [rows, width] with per-row scales and zero
// points: the row's range [min(0, lo), max(0, hi)] maps onto [0, levels] so that 0 is
// exact. A NaN value quantizes to code 0; infinities saturate the row. REQUIRES: levels
// in [1, 255]; the outputs hold rows * width, rows and rows values.
void QuantizeRows(const float* in, int64_t rows, int64_t width, int levels, uint8_t* out,
                  float* scales, int32_t* zero_points);

// out[i, j] = row_scales[i] * weights.scales[j] *
//             (acc[i, j] - zero_points[i] * weights.column_sums[j]) + bias[j]
// for acc [rows, weights.out] (int32) and out [rows, weights.out] (f32); with
// `accumulate`, added to what `out` holds. `bias` may be null (no bias). `out` may not
// alias `acc`.
void Dequantize(const int32_t* acc, int64_t rows, const QuantizedMatrix& weights,
                const float* row_scales, const int32_t* zero_points, const float* bias,
                float* out, bool accumulate = false);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_QUANTIZATION_H_
