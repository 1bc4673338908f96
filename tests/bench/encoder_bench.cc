// The encoder core alone, for `make bench-encoder`: a Hugging Face BERT folder (as the
// server loads it) over a tokenized corpus, in batches of --batch consecutive
// sentences packed without padding, on --threads OpenMP threads. Prints one JSON line:
// the median sentences/s over --rounds passes, and every pass's figure. --device=cuda:N
// runs the CUDA encoder instead (the GPU device check's speed rows).
//
// usage: encoder_bench --model_dir=DIR --ids=FILE --lengths=FILE [--batch=32]
//                      [--threads=1] [--rounds=5] [--sentences=0 (all)]
// FILEs: little-endian int32, the sentences' ids one after another, and their lengths.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/device.h"
#include "core/base/status_macros.h"
#include "core/encoder/encoder_backend.h"
#include "core/io/safetensors.h"
#include "server/models/encoder_config.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face BERT folder (config.json, ...).");
ABSL_FLAG(std::string, ids, "", "int32 token ids, the sentences one after another.");
ABSL_FLAG(std::string, lengths, "", "int32 length of each sentence.");
ABSL_FLAG(int, batch, 32, "Sentences per Forward call.");
ABSL_FLAG(int, threads, 1, "OpenMP threads.");
ABSL_FLAG(int, rounds, 5, "Timed passes over the corpus (after one warm-up pass).");
ABSL_FLAG(int, sentences, 0, "Use the first N sentences; 0 = all.");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32 or bf16 (native bf16 where the CPU has it).");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N.");
ABSL_FLAG(std::string, dump, "",
          "Write the pooled embeddings of the warm-up pass here (float32 [n, d]).");

namespace {

std::string Read(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

std::vector<int64_t> Int32s(const std::string& path) {
  const std::string bytes = Read(path);
  std::vector<int64_t> values(bytes.size() / 4);
  for (size_t i = 0; i < values.size(); ++i) {
    int32_t value;
    std::memcpy(&value, bytes.data() + 4 * i, 4);
    values[i] = value;
  }
  return values;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "encoder_bench: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  attnserve::server::EncoderFiles files;
  files.config_json = Read(dir + "/config.json");
  files.modules_json = Read(dir + "/modules.json");
  files.pooling_json = Read(dir + "/1_Pooling/config.json");
  attnserve::v1::ModelConfig config;
  config.mutable_encoder();
  if (auto status = attnserve::server::ResolveEncoderConfig(files, &config);
      !status.ok()) {
    return Fail(status);
  }
  auto spec = attnserve::server::EncoderSpecFromConfig(config);
  if (!spec.ok()) return Fail(spec.status());
  if (absl::GetFlag(FLAGS_precision) == "bf16") {
    spec->precision = attnserve::core::Precision::kBf16;
  } else if (absl::GetFlag(FLAGS_precision) == "int8") {
    spec->precision = attnserve::core::Precision::kInt8;
  }
  auto file = attnserve::core::SafetensorsFile::Read(dir + "/model.safetensors");
  if (!file.ok()) return Fail(file.status());
  auto weights = attnserve::core::LoadBertWeights(*file, *spec);
  if (!weights.ok()) return Fail(weights.status());
  auto device = attnserve::core::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Fail(device.status());
  attnserve::core::EncoderBackendOptions options;
  options.intra_op_threads = absl::GetFlag(FLAGS_threads);
  auto encoder =
      attnserve::core::CreateEncoderBackend(*spec, *std::move(weights), *device, options);
  if (!encoder.ok()) return Fail(encoder.status());

  const std::vector<int64_t> ids = Int32s(absl::GetFlag(FLAGS_ids));
  std::vector<int64_t> lengths = Int32s(absl::GetFlag(FLAGS_lengths));
  if (absl::GetFlag(FLAGS_sentences) > 0) {
    lengths.resize(std::min<size_t>(lengths.size(), absl::GetFlag(FLAGS_sentences)));
  }
  const auto batch = static_cast<size_t>(absl::GetFlag(FLAGS_batch));
  std::vector<float> pooled(batch * spec->d_model);
  std::string dumped;
  const auto pass = [&]() -> absl::Status {
    size_t first_token = 0;
    for (size_t first = 0; first < lengths.size(); first += batch) {
      const size_t count = std::min(batch, lengths.size() - first);
      const absl::Span<const int64_t> sequence_lengths(&lengths[first], count);
      int64_t tokens = 0;
      for (int64_t length : sequence_lengths) tokens += length;
      attnserve::core::EncoderBatch packed;
      packed.token_ids = absl::MakeConstSpan(&ids[first_token], tokens);
      packed.lengths = sequence_lengths;
      ATTN_RETURN_IF_ERROR((*encoder)->Forward(
          packed, absl::MakeSpan(pooled.data(), count * spec->d_model), {}));
      if (dumped.size() < lengths.size() * spec->d_model * sizeof(float)) {
        dumped.append(reinterpret_cast<const char*>(pooled.data()),
                      count * spec->d_model * sizeof(float));
      }
      first_token += tokens;
    }
    return absl::OkStatus();
  };
  if (auto status = pass(); !status.ok()) return Fail(status);  // warm-up
  if (const std::string path = absl::GetFlag(FLAGS_dump); !path.empty()) {
    std::ofstream(path, std::ios::binary) << dumped;
  }
  std::vector<double> rates;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const auto start = std::chrono::steady_clock::now();
    if (auto status = pass(); !status.ok()) return Fail(status);
    const std::chrono::duration<double> seconds =
        std::chrono::steady_clock::now() - start;
    rates.push_back(static_cast<double>(lengths.size()) / seconds.count());
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "{\"batch\": %zu, \"threads\": %d, \"sentences\": %zu, "
      "\"device\": \"%s\", \"compute\": \"%s\", \"sentences_per_s\": %.2f, "
      "\"rounds\": [%s]}\n",
      batch, absl::GetFlag(FLAGS_threads), lengths.size(),
      (*encoder)->device_name().c_str(), (*encoder)->ComputePath().c_str(),
      sorted[sorted.size() / 2], absl::StrJoin(rates, ", ").c_str());
  return 0;
}
