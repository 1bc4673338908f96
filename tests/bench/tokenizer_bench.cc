// The tokenizer's speed for `make bench-encoder`: every text of a corpus (JSON lines with
// a "text" field, the first line a header) through the folder's tokenizer (Tokenizer::
// FromFolder: BERT's WordPiece or any tokenizer.json's pipeline), pass after pass, on the
// calling thread. Prints one JSON line: texts, tokens, bytes and the median
// tokens/s of the passes.
//
// usage: tokenizer_bench MODEL_FOLDER CORPUS.jsonl [PASSES]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/text/tokenizer.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench MODEL_FOLDER CORPUS.jsonl [PASSES]\n");
    return 2;
  }
  const int passes = argc > 3 ? std::atoi(argv[3]) : 7;
  auto tokenizer = attnserve::core::Tokenizer::FromFolder(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  std::ifstream in(argv[2]);
  std::vector<std::string> texts;
  std::string line;
  std::getline(in, line);  // header
  size_t bytes = 0;
  while (std::getline(in, line)) {
    texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    bytes += texts.back().size();
  }
  std::vector<int64_t> ids;
  ids.reserve(1 << 20);
  std::vector<double> rates;
  int64_t tokens = 0;
  for (int pass = 0; pass < passes + 1; ++pass) {
    tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& text : texts) {
      ids.clear();
      const auto encoding = (*tokenizer)->Encode(text, int64_t{1} << 30, &ids);
      if (!encoding.ok()) return 1;
      tokens += encoding->tokens;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass > 0) rates.push_back(static_cast<double>(tokens) / seconds);  // pass 0 warms
  }
  std::sort(rates.begin(), rates.end());
  std::printf(
      "{\"texts\": %zu, \"tokens\": %lld, \"bytes\": %zu, \"tokens_per_s\": %.0f}\n",
      texts.size(), static_cast<long long>(tokens), bytes, rates[rates.size() / 2]);
  return 0;
}
