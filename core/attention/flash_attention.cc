#include "core/attention/flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/attention/flash_kernels.h"
#include "dnnl.h"

namespace attnserve::core {

namespace {

// exp(x) for x <= 0: see the constants in flash_kernels.h.
float ExpScalar(float x) {
  // NaN (scores that overflowed) stays NaN, as in the blocks' softmax; the int
  // conversion below would be undefined for it.
  if (std::isnan(x)) return x;
  if (x < kExpLowest) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  const float r = x - n * kLn2Hi - n * kLn2Lo;
  float p = kC5;
  for (const float c : {kC4, kC3, kC2, kC1, 1.0f}) p = p * r + c;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

float MaxScalar(const float* s, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// s[j] = exp(s[j] - shift) for j < n; returns their sum.
float ExpShiftScalar(float* s, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = ExpScalar(s[j] - shift);
    sum += s[j];
  }
  return sum;
}

// The products: register-blocked kernels (flash_kernels.h) where the ISA has them,
// else oneDNN's sgemm.
using ScoresKernel = void (*)(const float*, int64_t, const float*, int64_t, int64_t,
                              int64_t, int64_t, float*, float*);
using ContextKernel = void (*)(const float*, int64_t, const float*, int64_t, int64_t,
                               int64_t, int64_t, const float*, bool, float*, int64_t);

using PackKernel = void (*)(const float*, int64_t, int64_t, int64_t, float*);

struct VectorUnit {
  const char* name;
  float (*max)(const float*, int64_t);
  float (*exp_shift)(float*, int64_t, float);
  int64_t width;       // floats per vector; 1 for the scalar unit
  int64_t panel_keys;  // keys per packed panel (PackKeys); 1 for the scalar unit
  PackKernel pack_keys;
  ScoresKernel scores;
  ContextKernel context;
};

const VectorUnit& Unit() {
  static const VectorUnit unit = [] {
    // oneDNN's effective ISA, so that ONEDNN_MAX_CPU_ISA caps this unit with the
    // matrix products (and tests reach every path on one host).
    const auto has = [isa = dnnl_get_effective_cpu_isa()](dnnl_cpu_isa_t wanted) {
      return (isa & wanted) == wanted;
    };
    if (has(dnnl_cpu_isa_avx512_core)) {
      return VectorUnit{
          "avx512f",           avx512::RowMax,   avx512::ExpShift, 16,
          avx512::PanelKeys(), avx512::PackKeys, avx512::Scores,   avx512::Context};
    }
    if (has(dnnl_cpu_isa_avx2)) {
      return VectorUnit{
          "avx2",         avx2::RowMax, avx2::ExpShift, 8, avx2::PanelKeys(),
          avx2::PackKeys, avx2::Scores, avx2::Context};
    }
    return VectorUnit{"scalar", MaxScalar, ExpShiftScalar, 1,
                      1,        nullptr,   nullptr,        nullptr};
  }();
  return unit;
}

// Whether the register kernels run a head of `head_dim` (a whole number of vectors).
bool UseKernels(const VectorUnit& unit, int64_t head_dim) {
  return unit.scores != nullptr && head_dim % unit.width == 0;
}

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Floats of one thread's buffer: scores [query_rows, keys rounded up to a panel] and
// four per-row values.
int64_t BufferFloats(const FlashTiles& tiles) {
  return tiles.query_rows * RoundUp(tiles.keys, Unit().panel_keys) + 4 * tiles.query_rows;
}

// Floats of one head's packed keys (panels, padded) and values ([key_length,
// head_dim]), which every query tile of the head reads.
int64_t PackedHeadFloats(int64_t key_length, int64_t head_dim) {
  return (RoundUp(key_length, Unit().panel_keys) + key_length) * head_dim;
}

// One (sequence, head, query block) item.
struct Item {
  int64_t sequence, head, first_row;
};

// The item's context rows: see FlashAttention. `buffer` holds BufferFloats floats;
// `packed` is the item's head's PackedHeadFloats (null without register kernels).
// Returns oneDNN's status.
// `bias_table` is the item's head's relative bias (null for none).
dnnl_status_t AttendItem(const FlashSequence& sequence, const Item& item,
                         int64_t head_dim, int64_t width, int64_t kv_column,
                         int64_t kv_width, bool causal, int64_t window,
                         const float* bias_table, int64_t bias_radius,
                         const FlashTiles& tiles, const float* packed, float* buffer) {
  const VectorUnit& unit = Unit();
  const bool kernels = packed != nullptr;
  const int64_t rows = std::min(tiles.query_rows, sequence.query_length - item.first_row);
  const int64_t column = item.head * head_dim;
  const float* q = sequence.q + item.first_row * width + column;
  float* out = sequence.context + item.first_row * width + column;
  // Key blocks start on a panel.
  const int64_t key_tile = kernels ? RoundUp(tiles.keys, unit.panel_keys) : tiles.keys;
  float* scores = buffer;
  float* row_max = scores + tiles.query_rows * RoundUp(tiles.keys, unit.panel_keys);
  float* row_sum = row_max + tiles.query_rows;
  float* rescale = row_sum + tiles.query_rows;
  float* block_maxima = rescale + tiles.query_rows;  // the kernels' row maxima
  std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
  std::fill(row_sum, row_sum + rows, 0.0f);
  const int64_t last_row = item.first_row + rows - 1;
  // Keys [key_begin, key_end) hold every key some row of the block sees; the key blocks
  // outside are skipped. They stay on the grid of key_tile from key 0 (where the packed
  // panels start), so the first one may begin before the first row's window.
  int64_t key_end =
      causal ? std::min(sequence.key_length, last_row + 1) : sequence.key_length;
  int64_t key_begin = 0;
  if (window > 0) {
    key_end = std::min(key_end, last_row + window + 1);
    key_begin = std::max<int64_t>(0, item.first_row - window) / key_tile * key_tile;
  }
  const bool masked = causal || window > 0;
  const float* packed_values =
      kernels ? packed + RoundUp(sequence.key_length, unit.panel_keys) * head_dim
              : nullptr;
  for (int64_t first_key = key_begin; first_key < key_end; first_key += key_tile) {
    const int64_t keys = std::min(key_tile, key_end - first_key);
    // scores[rows, keys] (row stride `stride`) = q k^T for this key block.
    int64_t stride = keys;
    if (kernels) {
      // Whole panels: the scores past `keys` (later keys or the zero padding) are
      // never read.
      stride = RoundUp(keys, unit.panel_keys);
      unit.scores(q, width, packed + first_key * head_dim, stride, keys, rows, head_dim,
                  scores, block_maxima);
    } else {
      const dnnl_status_t status = dnnl_sgemm(
          'N', 'T', rows, keys, head_dim, 1.0f, q, width,
          sequence.k + first_key * kv_width + kv_column, kv_width, 0.0f, scores, keys);
      if (status != dnnl_success) return status;
    }
    const bool first = first_key == key_begin;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = scores + r * stride;
      // A pass over the row for its maximum without the kernels, when a bias moves the
      // scores after the kernels' maximum, or when keys of the row are masked below (the
      // kernels' maximum over them could exceed the visible scores' by enough to flush
      // them all to 0).
      bool scan_for_max = !kernels || bias_table != nullptr;
      if (bias_table != nullptr) {
        AddRelativeBias(row, keys, first_key - (item.first_row + r), bias_table,
                        bias_radius);
      }
      if (masked) {
        // The row sees keys [low, high): none after it when causal, none more than
        // `window` away. Without a window its own key is in the first block, so its
        // maximum is finite from the first block on.
        const int64_t i = item.first_row + r;
        int64_t low = 0;
        int64_t high = causal ? i + 1 : sequence.key_length;
        if (window > 0) {
          low = i - window;
          high = std::min(high, i + window + 1);
        }
        const int64_t visible_begin = std::clamp<int64_t>(low - first_key, 0, keys);
        const int64_t visible_end =
            std::clamp<int64_t>(high - first_key, visible_begin, keys);
        if (visible_begin > 0 || visible_end < keys) {
          const float hidden = -std::numeric_limits<float>::infinity();
          std::fill(row, row + visible_begin, hidden);
          std::fill(row + visible_end, row + keys, hidden);
          scan_for_max = true;
        }
      }
      const float block_max = scan_for_max ? unit.max(row, keys) : block_maxima[r];
      const float new_max = std::max(row_max[r], block_max);
      if (window > 0 && new_max == -std::numeric_limits<float>::infinity()) {
        // A window's first blocks may hold no key of this row yet: it adds nothing
        // (exp(-inf - -inf) would be NaN), and its sum and context stay 0.
        std::fill(row, row + keys, 0.0f);
        rescale[r] = 0.0f;
        row_sum[r] = 0.0f;
        continue;
      }
      const float sum = unit.exp_shift(row, keys, new_max);
      // The earlier blocks' sum and context were relative to the old maximum.
      rescale[r] = first ? 0.0f : ExpScalar(row_max[r] - new_max);
      row_sum[r] = first ? sum : row_sum[r] * rescale[r] + sum;
      row_max[r] = new_max;
    }
    // context = context * rescale + probabilities v for this key block.
    if (kernels) {
      unit.context(scores, stride, packed_values + first_key * head_dim, head_dim, rows,
                   keys, head_dim, rescale, first, out, width);
      continue;
    }
    if (!first) {
      for (int64_t r = 0; r < rows; ++r) {
        if (rescale[r] == 1.0f) continue;
        float* context_row = out + r * width;
        for (int64_t c = 0; c < head_dim; ++c) context_row[c] *= rescale[r];
      }
    }
    const dnnl_status_t status =
        dnnl_sgemm('N', 'N', rows, head_dim, keys, 1.0f, scores, keys,
                   sequence.v + first_key * kv_width + kv_column, kv_width,
                   first ? 0.0f : 1.0f, out, width);
    if (status != dnnl_success) return status;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = 1.0f / row_sum[r];
    float* context_row = out + r * width;
    for (int64_t c = 0; c < head_dim; ++c) context_row[c] *= inverse;
  }
  return dnnl_success;
}

}  // namespace

std::string FlashVectorUnit() { return Unit().name; }

absl::Status FlashAttention(absl::Span<const FlashSequence> sequences, int64_t heads,
                            int64_t head_dim, int64_t width, bool causal,
                            const FlashTiles& tiles, int threads, FlashScratch& scratch,
                            const RelativeBias& bias,
                            absl::Span<const int64_t> bias_heads, int64_t window,
                            const FlashKv& kv) {
  if (tiles.query_rows < 1 || tiles.keys < 1) {
    return absl::InvalidArgumentError(absl::StrCat("flash tiles must be >= 1, got ",
                                                   tiles.query_rows, " query rows and ",
                                                   tiles.keys, " keys"));
  }
  if (heads < 1 || head_dim < 1 || heads * head_dim > width || threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flash attention needs heads, head_dim, threads >= 1 and heads * "
        "head_dim <= width, got heads ",
        heads, ", head_dim ", head_dim, ", width ", width, ", threads ", threads));
  }
  if (!bias.empty() && static_cast<int64_t>(bias_heads.size()) != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("flash attention: a relative bias needs one model head per head (",
                     heads, "), got ", bias_heads.size()));
  }
  if (window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flash attention: window must be >= 0 (0: every key), got ", window));
  }
  // Key/value head of each query head, and how many there are.
  const int64_t kv_width = kv.kv_of.empty() ? width : kv.kv_width;
  const int64_t kv_heads = kv.kv_of.empty() ? heads : kv_width / head_dim;
  if (!kv.kv_of.empty()) {
    bool fits = static_cast<int64_t>(kv.kv_of.size()) == heads && kv_width >= head_dim &&
                kv_width % head_dim == 0;
    for (const int64_t position : kv.kv_of) fits &= position >= 0 && position < kv_heads;
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flash attention: kv_of needs one key/value head in [0, kv_width / head_dim) "
          "per head (",
          heads, "), got ", kv.kv_of.size(), " with kv_width ", kv.kv_width));
    }
  }
  const auto kv_of = [&](int64_t head) {
    return kv.kv_of.empty() ? head : kv.kv_of[static_cast<size_t>(head)];
  };
  std::vector<Item> items;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const FlashSequence& sequence = sequences[s];
    if (sequence.query_length < 1 || sequence.key_length < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flash attention: sequence ", s, " has query_length ", sequence.query_length,
          " and key_length ", sequence.key_length, "; both must be >= 1"));
    }
    if ((causal || window > 0) && sequence.query_length != sequence.key_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("flash attention: ", causal ? "causal" : "windowed", " sequence ",
                       s, " has query_length ", sequence.query_length, " != key_length ",
                       sequence.key_length));
    }
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t first = 0; first < sequence.query_length; first += tiles.query_rows) {
        items.push_back({static_cast<int64_t>(s), head, first});
      }
    }
  }
  if (causal) {
    // Later query blocks read more keys: hand them out first so that the last items
    // the threads pick up are the short ones.
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.first_row > b.first_row;
    });
  }
  threads =
      static_cast<int>(std::min<int64_t>(threads, static_cast<int64_t>(items.size())));
  threads = std::max(threads, 1);
  const size_t buffer_bytes = static_cast<size_t>(BufferFloats(tiles)) * sizeof(float);
  if (static_cast<int>(scratch.per_thread_.size()) < threads) {
    scratch.per_thread_.resize(static_cast<size_t>(threads));
  }
  std::vector<float*> buffers(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    auto& buffer = scratch.per_thread_[static_cast<size_t>(t)];
    if (buffer == nullptr) buffer = std::make_unique<ScratchBuffer>();
    buffers[static_cast<size_t>(t)] = static_cast<float*>(buffer->Reserve(buffer_bytes));
  }
  // Register kernels: every head's keys and values packed once, before the items that
  // read them (one head's query tiles all read the same ones).
  const VectorUnit& unit = Unit();
  float* packed = nullptr;
  std::vector<int64_t> packed_offsets;  // per sequence, its first head's floats
  if (UseKernels(unit, head_dim)) {
    int64_t total = 0;
    for (const FlashSequence& sequence : sequences) {
      packed_offsets.push_back(total);
      total += kv_heads * PackedHeadFloats(sequence.key_length, head_dim);
    }
    packed = static_cast<float*>(
        scratch.packed_.Reserve(static_cast<size_t>(total) * sizeof(float)));
    const auto pack_tasks = static_cast<int64_t>(sequences.size()) * kv_heads;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int64_t task = 0; task < pack_tasks; ++task) {
      const FlashSequence& sequence = sequences[static_cast<size_t>(task / kv_heads)];
      const int64_t column = (task % kv_heads) * head_dim;
      float* head = packed + packed_offsets[static_cast<size_t>(task / kv_heads)] +
                    (task % kv_heads) * PackedHeadFloats(sequence.key_length, head_dim);
      unit.pack_keys(sequence.k + column, kv_width, sequence.key_length, head_dim, head);
      float* values = head + RoundUp(sequence.key_length, unit.panel_keys) * head_dim;
      for (int64_t j = 0; j < sequence.key_length; ++j) {
        const float* row = sequence.v + j * kv_width + column;
        std::copy(row, row + head_dim, values + j * head_dim);
      }
    }
  }
  std::vector<dnnl_status_t> failures(static_cast<size_t>(threads), dnnl_success);
  const int64_t count = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) {
    const auto thread = static_cast<size_t>(omp_get_thread_num());
    if (failures[thread] != dnnl_success) continue;
    const Item& item = items[static_cast<size_t>(i)];
    const FlashSequence& sequence = sequences[static_cast<size_t>(item.sequence)];
    const float* head =
        packed == nullptr
            ? nullptr
            : packed + packed_offsets[static_cast<size_t>(item.sequence)] +
                  kv_of(item.head) * PackedHeadFloats(sequence.key_length, head_dim);
    const float* bias_table =
        bias.empty() ? nullptr : bias.Head(bias_heads[static_cast<size_t>(item.head)]);
    failures[thread] =
        AttendItem(sequence, item, head_dim, width, kv_of(item.head) * head_dim, kv_width,
                   causal, window, bias_table, bias.radius, tiles, head, buffers[thread]);
  }
  for (const dnnl_status_t failure : failures) {
    if (failure != dnnl_success) {
      return absl::InternalError(
          absl::StrCat("oneDNN sgemm failed in flash attention: status ", failure));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core
