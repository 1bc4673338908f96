#include "core/cuda/device_common.h"

#include <dlfcn.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/base/bfloat16.h"

namespace attnserve::core::cuda {

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CUDA could not ", what, ": out of device memory"));
  }
  return absl::InternalError(absl::StrCat("CUDA failed to ", what, ": ",
                                          cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

const Cublas& GetCublas() {
  static const Cublas* const cublas = [] {
    auto* loaded = new Cublas;
    void* library = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      loaded->error =
          absl::StrCat("cannot open libcublas.so.13 (cuBLAS of CUDA 13): ", dlerror());
      return loaded;
    }
    const auto find = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
          dlsym(library, name));
      if (function == nullptr && loaded->error.empty()) {
        loaded->error = absl::StrCat("libcublas.so.13 has no ", name);
      }
    };
    find(loaded->create, "cublasCreate_v2");
    find(loaded->destroy, "cublasDestroy_v2");
    find(loaded->set_stream, "cublasSetStream_v2");
    find(loaded->gemm, "cublasGemmEx");
    find(loaded->gemm_strided_batched, "cublasGemmStridedBatchedEx");
    find(loaded->status_string, "cublasGetStatusString");
    return loaded;
  }();
  return *cublas;
}

absl::Status CublasError(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuBLAS failed to ", what, ": ", GetCublas().status_string(status)));
}

DeviceStream::~DeviceStream() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) GetCublas().destroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status DeviceStream::Init(int device) {
  device_ = device;
  ATTN_CUDA(cudaSetDevice(device), absl::StrCat("select device cuda:", device));
  ATTN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
            "create a stream");
  ATTN_CUBLAS(GetCublas().create(&cublas_), "create a handle");
  ATTN_CUBLAS(GetCublas().set_stream(cublas_, stream_), "set its stream");
  return absl::OkStatus();
}

absl::Status CheckCudaDevice(int index) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) cudaGetLastError();
  if (index < 0 || index >= count) {
    return absl::UnavailableError(absl::StrCat(
        "device cuda:", index, " is not available: CUDA found ", count, " device(s)",
        error != cudaSuccess ? absl::StrCat(" (", cudaGetErrorString(error), ")") : ""));
  }
  if (const std::string& error = GetCublas().error; !error.empty()) {
    return absl::UnavailableError(
        absl::StrCat("device cuda:", index, " is not available: ", error));
  }
  return absl::OkStatus();
}

KeptHeadWeights KeepHeads(const ModelSpec& spec, const AttentionWeights& weights) {
  KeptHeadWeights kept;
  const int64_t d = spec.d_model;
  const int64_t head_dim = spec.head_dim();
  for (int64_t h = 0; h < spec.num_heads; ++h) {
    if (!spec.IsPruned(h)) kept.heads.push_back(h);
  }
  const int64_t width = static_cast<int64_t>(kept.heads.size()) * head_dim;
  kept.width = width;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Rows of the kept heads' Q, K and V projections, then W_out's kept columns.
  kept.qkv.resize(static_cast<size_t>(3 * width * d));
  kept.qkv_bias.resize(static_cast<size_t>(3 * width));
  for (int64_t part = 0; part < 3; ++part) {
    for (size_t p = 0; p < kept.heads.size(); ++p) {
      for (int64_t r = 0; r < head_dim; ++r) {
        const int64_t from = part * d + kept.heads[p] * head_dim + r;
        const int64_t to = part * width + static_cast<int64_t>(p) * head_dim + r;
        const float factor = part == 0 ? scale : 1.0f;
        for (int64_t c = 0; c < d; ++c) {
          kept.qkv[to * d + c] = weights.in_proj_weight[from * d + c] * factor;
        }
        kept.qkv_bias[to] = weights.in_proj_bias[from] * factor;
      }
    }
  }
  kept.out.resize(static_cast<size_t>(d * width));
  for (int64_t o = 0; o < d; ++o) {
    for (size_t p = 0; p < kept.heads.size(); ++p) {
      for (int64_t c = 0; c < head_dim; ++c) {
        kept.out[o * width + p * head_dim + c] =
            weights.out_proj_weight[o * d + kept.heads[p] * head_dim + c];
      }
    }
  }
  return kept;
}

size_t AppendAligned(const std::vector<float>& values, bool narrow,
                     std::vector<uint8_t>* host) {
  const size_t offset = Align(host->size());
  const size_t bytes = values.size() * (narrow ? 2 : 4);
  host->resize(offset + bytes, 0);
  uint8_t* to = host->data() + offset;
  if (!narrow) {
    std::memcpy(to, values.data(), bytes);
    return offset;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = FloatToBf16(values[i]);
    std::memcpy(to + 2 * i, &bits, 2);
  }
  return offset;
}

absl::Status Gemm::Project(const void* in, int64_t ld_in, int64_t rows, int64_t in_width,
                           const void* weight, int64_t ld_weight, int64_t out_width,
                           void* out, ElementType out_type, int64_t ld_out,
                           bool accumulate) const {
  // Column-major view: out^T [out_width, rows] = W [out_width, in_width] in^T, with
  // row-major W read as its transpose.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  ATTN_CUBLAS(
      GetCublas().gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_width),
                       static_cast<int>(rows), static_cast<int>(in_width), &alpha, weight,
                       DataType(), static_cast<int>(ld_weight), in, DataType(),
                       static_cast<int>(ld_in), &beta, out,
                       out_type == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_32F,
                       static_cast<int>(ld_out), ComputeType(), CUBLAS_GEMM_DEFAULT),
      "run a projection");
  return absl::OkStatus();
}

}  // namespace attnserve::core::cuda
