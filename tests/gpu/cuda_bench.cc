// The CUDA backend's speed on the shapes (B, L, d, h), self-attention: for
// each precision and attention path, the median of timed Forward calls after warm-up,
// as device time (CUDA events around the kernels and products) and as the caller sees
// it (packing, both copies and the wait included). One JSON object per line, read by
// tests/gpu/device_check.py. Needs a GPU; exits 2 without one.
//   cuda_bench [--iterations=N] [--shapes=B,L,d,h;...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/attention/attention_weights.h"
#include "core/cuda/cuda_attention.h"
#include "tests/core/test_util.h"

namespace attnserve::core::cuda {
namespace {

struct Shape {
  int64_t batch, length, d_model, heads;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Multiply-adds counted twice: Q, K, V and output projections, scores and context.
double Flops(const Shape& s) {
  const double tokens = static_cast<double>(s.batch * s.length);
  const double d = static_cast<double>(s.d_model);
  return 2.0 * tokens * d * 4.0 * d + 4.0 * static_cast<double>(s.batch) * s.length *
                                          static_cast<double>(s.length) * d;
}

int Run(int iterations, const std::vector<Shape>& shapes) {
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "cuda_bench: no CUDA device\n");
    return 2;
  }
  std::printf("{\"device\": \"%s\"}\n", CudaDeviceDescription(0).c_str());
  using Path = CudaAttentionOptions::AttentionPath;
  for (const Shape& shape : shapes) {
    for (Precision precision : {Precision::kBf16, Precision::kFp32}) {
      using Kernel = CudaAttentionOptions::TensorCoreKernel;
      // (path, tensor-core kernel); the last three rows are the tensor-core variants.
      const std::pair<Path, Kernel> runs[] = {
          {Path::kAuto, Kernel::kLdmatrixV8Warps},
          {Path::kFused, Kernel::kLdmatrixV8Warps},
          {Path::kMaterialized, Kernel::kLdmatrixV8Warps},
          {Path::kTensorCore, Kernel::kTransposedV},
          {Path::kTensorCore, Kernel::kLdmatrixV},
          {Path::kTensorCore, Kernel::kLdmatrixV8Warps}};
      for (const auto& [path, kernel] : runs) {
        if (precision == Precision::kFp32 && path == Path::kTensorCore) continue;  // bf16
        const char* name = path == Path::kAuto              ? "auto"
                           : path == Path::kFused           ? "fused"
                           : path == Path::kMaterialized    ? "materialized"
                           : kernel == Kernel::kTransposedV ? "tc_transposed"
                           : kernel == Kernel::kLdmatrixV   ? "tc_ldmatrix"
                                                            : "tc_ldmatrix_8w";
        ModelSpec spec;
        spec.d_model = shape.d_model;
        spec.num_heads = shape.heads;
        spec.precision = precision;
        CudaAttentionOptions options;
        options.path = path;
        options.tensor_core_kernel = kernel;
        auto attention =
            CreateCudaAttention(spec, GenerateAttentionWeights(spec, 3), 0, options);
        if (!attention.ok()) {
          std::fprintf(stderr, "cuda_bench: %s\n", attention.status().ToString().c_str());
          return 1;
        }
        const std::vector<int64_t> lengths(shape.batch, shape.length);
        const std::vector<float> query =
            testing::RandomTokens(shape.batch * shape.length * shape.d_model, 1);
        std::vector<float> output(query.size());
        std::vector<double> device_ms, wall_ms, upload_ms, download_ms, attention_ms;
        for (int i = 0; i < iterations + 3; ++i) {
          const auto start = std::chrono::steady_clock::now();
          const absl::Status status =
              (*attention)->Forward({query, lengths}, {}, absl::MakeSpan(output));
          const auto end = std::chrono::steady_clock::now();
          if (!status.ok()) {
            std::fprintf(stderr, "cuda_bench: %s\n", status.ToString().c_str());
            return 1;
          }
          if (i < 3) continue;  // warm-up
          const CudaTimings timings = (*attention)->last_timings();
          device_ms.push_back(timings.compute_ms);
          attention_ms.push_back(timings.attention_ms);
          upload_ms.push_back(timings.upload_ms);
          download_ms.push_back(timings.download_ms);
          wall_ms.push_back(
              std::chrono::duration<double, std::milli>(end - start).count());
        }
        const double flops = Flops(shape);
        const double device = Median(device_ms), wall = Median(wall_ms);
        std::printf(
            "{\"batch\": %ld, \"length\": %ld, \"d_model\": %ld, \"heads\": %ld, "
            "\"precision\": \"%s\", \"path\": \"%s\", \"device_ms\": %.4f, "
            "\"attention_ms\": %.4f, "
            "\"upload_ms\": %.4f, \"download_ms\": %.4f, \"wall_ms\": %.4f, "
            "\"device_tflops\": %.2f, \"wall_tflops\": %.2f, \"iterations\": %d}\n",
            static_cast<long>(shape.batch), static_cast<long>(shape.length),
            static_cast<long>(shape.d_model), static_cast<long>(shape.heads),
            precision == Precision::kBf16 ? "bf16" : "fp32", name, device,
            Median(attention_ms), Median(upload_ms), Median(download_ms), wall,
            flops / device / 1e9, flops / wall / 1e9, iterations);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace attnserve::core::cuda

int main(int argc, char** argv) {
  int iterations = 20;
  std::string shapes_text = "32,128,512,8;8,512,768,12;1,4096,1024,16";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--iterations=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(13), &iterations) || iterations < 1) return 2;
    } else if (arg.rfind("--shapes=", 0) == 0) {
      shapes_text = arg.substr(9);
    } else {
      std::fprintf(stderr, "usage: cuda_bench [--iterations=N] [--shapes=B,L,d,h;...]\n");
      return 2;
    }
  }
  std::vector<attnserve::core::cuda::Shape> shapes;
  for (absl::string_view item : absl::StrSplit(shapes_text, ';', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ',');
    attnserve::core::cuda::Shape shape{};
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &shape.batch) ||
        !absl::SimpleAtoi(parts[1], &shape.length) ||
        !absl::SimpleAtoi(parts[2], &shape.d_model) ||
        !absl::SimpleAtoi(parts[3], &shape.heads)) {
      std::fprintf(stderr, "cuda_bench: bad shape '%s'\n", std::string(item).c_str());
      return 2;
    }
    shapes.push_back(shape);
  }
  return attnserve::core::cuda::Run(iterations, shapes);
}
