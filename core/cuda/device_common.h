// What the CUDA backend's model classes (core/cuda/cuda_attention.cc,
// core/cuda/cuda_encoder.cc) share: CUDA and cuBLAS errors as statuses, cuBLAS opened at
// run time, device and pinned buffers that grow and keep their size, the device
// check, the weights of one attention layer as the GPU takes them, and the products.
// Internal to core/cuda/: it includes CUDA's headers.
#ifndef ATTNSERVE_CORE_CUDA_DEVICE_COMMON_H_
#define ATTNSERVE_CORE_CUDA_DEVICE_COMMON_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/attention/attention_weights.h"
#include "core/attention/model_spec.h"
#include "core/base/status_macros.h"
#include "core/cuda/kernels.h"

namespace attnserve::core::cuda {

// OK for cudaSuccess; ResourceExhausted for out of memory; else Internal naming `what`
// and CUDA's error.
absl::Status CudaError(cudaError_t error, absl::string_view what);

#define ATTN_CUDA(expr, what) ATTN_RETURN_IF_ERROR(CudaError((expr), (what)))
#define ATTN_CUBLAS(expr, what) ATTN_RETURN_IF_ERROR(CublasError((expr), (what)))

// cuBLAS, opened at run time rather than linked: libcublasLt's static thread-local
// storage (about 95 KiB) would otherwise be added to every thread of the process,
// and libraries that start threads with small fixed stacks (Debian's civetweb, behind
// /metrics) then fail pthread_create with EINVAL. Opened with dlopen its TLS is
// allocated only in threads that use it, and a server on the CPU never loads it.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                         int, const void*, const void*, cudaDataType, int, const void*,
                         cudaDataType, int, const void*, void*, cudaDataType, int,
                         cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t,
                                         cublasOperation_t, int, int, int, const void*,
                                         const void*, cudaDataType, int, long long int,
                                         const void*, cudaDataType, int, long long int,
                                         const void*, void*, cudaDataType, int,
                                         long long int, int, cublasComputeType_t,
                                         cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string error;  // why it could not be opened; empty when it was
};

const Cublas& GetCublas();

absl::Status CublasError(cublasStatus_t status, absl::string_view what);

// Memory that grows to the largest size asked for and keeps it: on the device
// (DeviceBuffer), or page-locked on the host (PinnedBuffer), so that copies run at
// full speed and asynchronously.
template <typename Memory>
class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer() {
    if (data_ != nullptr) Memory::Free(data_);
  }
  absl::StatusOr<uint8_t*> Reserve(size_t bytes) {
    if (bytes <= capacity_) return data_;
    if (data_ != nullptr) Memory::Free(data_);
    data_ = nullptr;
    capacity_ = 0;
    void* data = nullptr;
    ATTN_CUDA(Memory::Allocate(&data, bytes),
              absl::StrCat("allocate ", bytes, " bytes", Memory::kOf));
    data_ = static_cast<uint8_t*>(data);
    capacity_ = bytes;
    return data_;
  }
  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};
struct DeviceMemory {
  static cudaError_t Allocate(void** data, size_t bytes) {
    return cudaMalloc(data, bytes);
  }
  static void Free(void* data) { cudaFree(data); }
  static constexpr const char* kOf = "";
};
struct PinnedMemory {
  static cudaError_t Allocate(void** data, size_t bytes) {
    return cudaHostAlloc(data, bytes, cudaHostAllocDefault);
  }
  static void Free(void* data) { cudaFreeHost(data); }
  static constexpr const char* kOf = " of pinned host memory";
};
using DeviceBuffer = GrowingBuffer<DeviceMemory>;
using PinnedBuffer = GrowingBuffer<PinnedMemory>;

// A non-blocking stream and a cuBLAS handle on it, made on one device; the stream is
// drained before either is released.
class DeviceStream {
 public:
  DeviceStream() = default;
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  ~DeviceStream();
  // Selects `device` and makes both.
  absl::Status Init(int device);
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

// The element type a model of `precision` computes in on the GPU (fp32 or bf16), and
// its size.
inline ElementType ComputeTypeOf(Precision precision) {
  return precision == Precision::kBf16 ? ElementType::kBf16 : ElementType::kF32;
}
inline int64_t BytesOf(ElementType type) { return type == ElementType::kBf16 ? 2 : 4; }

// `bytes` rounded up to 256, the alignment of every block in a staging or weights buffer.
inline size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// OK when CUDA device `index` exists and cuBLAS opens; else Unavailable naming the device
// and what was found.
absl::Status CheckCudaDevice(int index);

// One attention layer's weights as the GPU takes them, in f32 on the host: the model's
// heads less its pruned ones (`heads`, ascending), W_qkv [3 width, d] (the kept heads'
// Q rows, then K, then V; 1/sqrt(head_dim) folded into the Q rows and their bias),
// b_qkv [3 width], and W_out's kept columns [d, width] (width = heads * head_dim).
struct KeptHeadWeights {
  std::vector<int64_t> heads;
  int64_t width = 0;
  std::vector<float> qkv, qkv_bias, out;
};
KeptHeadWeights KeepHeads(const ModelSpec& spec, const AttentionWeights& weights);

// Appends `values` to `host` at the next multiple of 256 bytes, as f32 or (narrow) as
// bf16, and returns its offset.
size_t AppendAligned(const std::vector<float>& values, bool narrow,
                     std::vector<uint8_t>* host);

// The products of one model on one stream, in its compute precision (f32 with TF32 off
// unless allowed, or bf16 with f32 accumulation).
struct Gemm {
  cublasHandle_t handle = nullptr;
  ElementType compute = ElementType::kF32;
  bool allow_tf32 = false;

  // out[rows, out_width] (row stride ld_out, type out_type) = in[rows, in_width] W^T,
  // beta 1 (adding to what out holds) when `accumulate`; W row-major [out_width,
  // in_width] (row stride ld_weight); in (row stride ld_in) and W in the compute type.
  absl::Status Project(const void* in, int64_t ld_in, int64_t rows, int64_t in_width,
                       const void* weight, int64_t ld_weight, int64_t out_width,
                       void* out, ElementType out_type, int64_t ld_out,
                       bool accumulate) const;
  cudaDataType_t DataType() const {
    return compute == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  }
  cublasComputeType_t ComputeType() const {
    return compute == ElementType::kF32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                      : CUBLAS_COMPUTE_32F;
  }
};

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_DEVICE_COMMON_H_
