// MultiHeadAttention: the forward pass of nn.MultiheadAttention on oneDNN, for a batch
// of sequences of different lengths packed end to end (no padding work).
//
// For each sequence, with d = d_model, h heads of size d/h:
//   Q = X W_q^T + b_q,  K = M W_k^T + b_k,  V = M W_v^T + b_v   (M = X for
//   self-attention)
//   head_i = softmax(Q_i K_i^T / sqrt(d/h)) V_i   (per head i)
//   out = concat(mask_1 head_1, ..., mask_h head_h) W_out^T + b_out
// A head whose factor is 0 (or that the model prunes) is not computed at all: its rows
// of W_q, W_k, W_v and its columns of W_out are left out of the matrix products.
#ifndef ATTNSERVE_CORE_ATTENTION_MULTI_HEAD_ATTENTION_H_
#define ATTNSERVE_CORE_ATTENTION_MULTI_HEAD_ATTENTION_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/attention/attention_backend.h"
#include "core/attention/attention_weights.h"
#include "core/attention/flash_attention.h"
#include "core/attention/model_spec.h"
#include "core/attention/primitive_cache.h"
#include "core/attention/quantization.h"
#include "core/base/scratch_buffer.h"
#include "dnnl.hpp"

namespace attnserve::core {

// The CPU engine for this backend. Internal when oneDNN cannot create it.
absl::StatusOr<dnnl::engine> CreateCpuEngine();

// The CPU backend. Owns its copy of the weights, the oneDNN primitives and its scratch
// buffers.
// Thread-compatible: one thread at a time may call Forward (run several objects for
// parallel workers; they share nothing mutable, scratchpads included).
class MultiHeadAttention : public AttentionBackend {
 public:
  struct Options {
    // OpenMP threads oneDNN uses inside Forward; 0 keeps OpenMP's default (one per
    // core, or OMP_NUM_THREADS). Range [0, 1024].
    int intra_op_threads = 0;
    // Primitives kept per object (each shape of projection, scores, softmax and
    // context is one). Range [4, 1000000].
    int primitive_cache_capacity = 512;
    // Bytes of attention scores computed at once. A sequence whose scores for all
    // heads (h L_q L_k floats) fit runs all heads in one batched matmul; a longer one
    // runs one head at a time in blocks of query rows (at least 16) of this size, so
    // that it stays in cache. Range >= 1024.
    int64_t attention_block_bytes = 1 << 20;
    // How a bf16 model computes. kAuto: oneDNN's bf16 path where the CPU has
    // AVX512_BF16 or AMX; elsewhere the weights keep their bf16 values and every
    // product runs in f32 (oneDNN would emulate bf16 products, slower than f32).
    // kNative: the bf16 path or FailedPrecondition. kFloat32: always f32 compute.
    // Ignored for fp32 and int8 models.
    enum class Bf16Compute { kAuto, kNative, kFloat32 };
    Bf16Compute bf16_compute = Bf16Compute::kAuto;
    // Which oneDNN primitive runs an f32 projection. kPerShape: one per row-chunk size,
    // with the weights packed in its preferred layout. kRuntimeRows: one for every row
    // count, on the weights as stored. Which is faster depends on the CPU (runtime rows
    // measured x1.42 at M=128 on a Zen 3 with AVX2, x0.83 on a Zen 5 with AVX-512), so
    // kAuto times both when it first meets a weight matrix (in, out): at 128 rows (fewer
    // where that is over 2^28 multiply-adds), one untimed run each, then three
    // alternating timed ones, medians. The faster runs that matrix at every row count,
    // so a request's answer does not depend on what it was batched with.
    // bf16-native and int8 projections always run kPerShape.
    enum class ProjectionPrimitives { kAuto, kPerShape, kRuntimeRows };
    ProjectionPrimitives projection_primitives = ProjectionPrimitives::kAuto;
    // How softmax(Q K^T) V runs for a sequence whose scores do not fit
    // attention_block_bytes (or a causal one of 256 tokens or more), when it computes
    // in f32 and no attention weights are returned. kBlocks: oneDNN primitives over
    // blocks of query rows, each against every key (the scores of a block in one
    // buffer, one softmax primitive). kFlash: flash_attention.h, key-tiled with an
    // online softmax, causal key blocks skipped; every sequence, short ones too.
    // kAuto: Create times kBlocks and kFlash at three tile sizes (64x256, 128x512,
    // 256x1024) on one sequence of 1024 tokens, one untimed and three alternating timed
    // runs each, and the fastest (median) serves the long sequences; once per process
    // for a head size, thread count and block budget (AttentionChoice).
    enum class AttentionKernel { kAuto, kBlocks, kFlash };
    AttentionKernel attention_kernel = AttentionKernel::kAuto;
    // kFlash's tiles (see FlashTiles); kAuto times its own.
    FlashTiles flash_tiles;
  };

  // Validates `spec`, `weights` (shapes) and `options` (InvalidArgument naming the
  // field); FailedPrecondition for Bf16Compute::kNative on a CPU without AVX512_BF16
  // or AMX (the message names oneDNN's ISA there); Unimplemented for an engine other than
  // CPU (not yet supported by this implementation); Internal when oneDNN fails. fp32:
  // every product in f32. bf16: weights and activations in bf16, matrix products
  // accumulate in f32, scores and softmax in f32 (or, without native bf16, bf16-valued
  // weights with f32 activations: see Options::bf16_compute); inputs and outputs stay f32
  // at this interface. int8: the four projections' products in int8 (quantization.h), the
  // rest in f32. Weights are reordered once into the layout oneDNN picks for each
  // projection shape (usually one per matrix). `engine` is copied (a reference-counted
  // handle).
  static absl::StatusOr<std::unique_ptr<MultiHeadAttention>> Create(
      const ModelSpec& spec, const AttentionWeights& weights, const dnnl::engine& engine,
      const Options& options);
  // Same, with default Options.
  static absl::StatusOr<std::unique_ptr<MultiHeadAttention>> Create(
      const ModelSpec& spec, const AttentionWeights& weights, const dnnl::engine& engine);

  // Whether this CPU runs bf16 precision (AVX512_BF16 or AMX, as oneDNN sees it:
  // ONEDNN_MAX_CPU_ISA can lower it).
  static bool SupportsBf16();

  // How this object computes, for logs: "fp32", "bf16 (native, <isa>)", "bf16
  // weights, f32 compute (<isa> has no native bf16)" or "int8 projections (u8s8,
  // <isa>, ...)".
  std::string ComputePath() const;
  // The same for a model of `spec` created with default Options on this CPU.
  static std::string DefaultComputePath(const ModelSpec& spec);

  MultiHeadAttention(const MultiHeadAttention&) = delete;
  MultiHeadAttention& operator=(const MultiHeadAttention&) = delete;

  // Masks whose sliced weights are kept (each costs 4 d * width floats); a further
  // mask clears them.
  static constexpr size_t kMaskedHeadSets = 8;

  // Computes the batch. `output` receives [sum(query_lengths), d_model] and must have
  // exactly that size. `attention_weights` is empty, or receives per sequence, one
  // after another, the softmax weights [num_heads, L_q, L_k] (rows sum to 1) and then
  // must have exactly AttentionWeightsSize(...) floats; a pruned head's are zeros.
  // Rotary positions and the sliding window (AttentionOptions) apply on every path:
  // Q and K turn in f32 after their bias (native bf16: before they are narrowed); a
  // window masks the keys a row does not see, and skips the key blocks no row of a
  // block sees (the flash kernel's key tiles, the row blocks' key ranges).
  // Errors: InvalidArgument naming the field (those of CheckForwardArguments: a length
  // < 1, both or neither of query and query_bf16 set, sizes that do not match the
  // lengths, memory_lengths count != query_lengths count, causal, relative_bias, rotary
  // or a window with cross-attention, head_mask size != num_heads or a value outside
  // [0, 1], a bad relative bias, rotary.inv_freq longer than head_dim / 2 or with a
  // value not finite or < 0, window < 0, a wrong output size); Internal when oneDNN
  // fails. Blocks the calling thread while computing.
  absl::Status Forward(const AttentionBatch& batch, const AttentionOptions& options,
                       absl::Span<float> output,
                       absl::Span<float> attention_weights) override;
  using AttentionBackend::Forward;

  // Statistics of every head (num_heads entries; a pruned head's are zero) over
  // `batch`, computed with all the model's heads (no head mask). Same errors as Forward.
  absl::Status HeadStatistics(const AttentionBatch& batch, bool causal,
                              absl::Span<HeadStatistic> statistics) override;

  const ModelSpec& spec() const override { return spec_; }
  // Heads the last successful Forward computed: the model's heads less those its head
  // mask zeroed.
  int64_t computed_heads() const override { return computed_heads_; }
  std::string device_name() const override { return "cpu"; }
  int64_t device_memory_bytes() const override { return 0; }
  // Primitives created so far (cache misses); a repeated shape adds none.
  int64_t primitive_creations() const { return cache_.creations(); }
  // What Options::ProjectionPrimitives::kAuto chose for one weight matrix shape:
  // runtime rows or not, and the two medians (ms) at `rows` rows. The choices are the
  // process's, shared by every object, so that the instances of a model (and the
  // layers of an encoder) run the same primitive for a matrix and answer a request
  // with the same bits whichever serves it; each (in, out) is timed once per process
  // and thread count.
  struct ProjectionChoice {
    bool runtime_rows = false;
    int64_t rows = 0;
    double per_shape_ms = 0.0, runtime_rows_ms = 0.0;
  };
  // The f32 projection primitives this object has used so far, for logs and
  // benchmarks: one entry per (in, out) in ascending order, e.g.
  // "512x512: runtime rows (0.410 vs 0.520 ms at 128 rows); 512x2048: per shape (...)",
  // or "" when none was chosen.
  std::string ProjectionChoices() const;
  // The same for every object of the process (each entry followed by its thread count,
  // "@N", 0 = OpenMP's default): what the CPU was measured to prefer.
  static std::string ProcessProjectionChoices();
  // The same as data, by (in, out, intra_op_threads), ascending.
  static std::vector<std::pair<std::array<int64_t, 3>, ProjectionChoice>>
  ProcessProjectionChoiceList();

  // What AttentionKernel::kAuto chose for one (head_dim, intra_op_threads,
  // attention_block_bytes): flash or not, its tiles, and the medians (ms) of kBlocks and
  // of the chosen tiles on `timed_heads` heads of a `timed_length`-token sequence.
  // Process-wide, like ProjectionChoice, so that every instance of a model answers
  // with the same bits.
  struct AttentionChoice {
    bool flash = true;
    FlashTiles tiles;
    int64_t timed_length = 0, timed_heads = 0;
    double blocks_ms = 0.0, flash_ms = 0.0;
  };
  // The attention kernel this object runs long sequences on, for logs and benchmarks:
  // "flash 256x1024 (3.10 vs blocks 3.90 ms, 2 heads x 1024 tokens)", "blocks (...)",
  // "flash 64x256 (fixed)", "blocks (fixed)", or "none" for native bf16 (which runs
  // blocks: the flash kernel is f32).
  std::string AttentionKernelChoice() const;
  // Every kAuto choice of the process, by (head_dim, intra_op_threads,
  // attention_block_bytes), ascending; and the same as text, each entry
  // "hd<head_dim>@<threads>: <choice>".
  static std::vector<std::pair<std::array<int64_t, 3>, AttentionChoice>>
  ProcessAttentionChoiceList();
  static std::string ProcessAttentionChoices();
  // From now on this object computes in `other`'s scratch buffers instead of its own,
  // so that objects that never run at the same time (the layers of an encoder, run one
  // after another by one thread) hold one set of batch-sized buffers between them, not
  // one each. REQUIRES: Forward and HeadStatistics are never called on this object and
  // `other` (or any object sharing with them) at the same time.
  void ShareScratch(const MultiHeadAttention& other) { scratch_ = other.scratch_; }

 private:
  // The heads one Forward computes, with their weights sliced out of the model's: W_q,
  // W_k, W_v rows [width, d] (1/sqrt(head_dim) folded into W_q and b_q) and W_out
  // columns [d, width] with each head's factor folded in.
  // A weight matrix, plain f32 row-major [out, in], and its copies reordered into
  // the layouts oneDNN's primitives asked for (in the compute precision).
  // An int8 model also keeps it quantized (made on first use) and packs that.
  struct Matrix {
    std::vector<float> plain;
    QuantizedMatrix quantized;
    std::vector<std::pair<dnnl::memory::desc, dnnl::memory>> packed;
  };
  // Grouped-query attention: K and V hold the key/value heads the set's query heads
  // read (kv_heads), each once; query head p reads column block kv_of[p] of them.
  struct HeadSet {
    std::vector<int64_t> heads;     // model head indexes, ascending
    int64_t width = 0;              // heads.size() * head_dim
    std::vector<int64_t> kv_heads;  // model key/value head indexes, ascending
    int64_t kv_width = 0;           // kv_heads.size() * head_dim
    std::vector<int64_t> kv_of;     // per query head, its key/value head's position
    // The query heads of every key/value head when they are equally many (consecutive,
    // so the all-heads products read K and V broadcast over them); 0 when not.
    int64_t share = 1;
    Matrix query_weight, key_weight, value_weight, out_weight;
    std::vector<float> query_bias, key_bias, value_bias;
    // Sets kv_width and share from kv_heads and kv_of.
    void CountShare(int64_t head_dim);
  };
  // `from`'s heads at `positions` (ascending), their output scaled by `factors`.
  static HeadSet SliceHeads(const HeadSet& from, int64_t d_model, int64_t head_dim,
                            absl::Span<const int64_t> positions,
                            absl::Span<const float> factors);
  // The head set for `head_mask` (validated): all the model's heads when it is empty or
  // all ones, else a cached slice.
  HeadSet& SelectHeads(absl::Span<const float> head_mask);
  // `matrix` in the layout `desc`, reordered on first use.
  const dnnl::memory& Packed(Matrix& matrix, int64_t in, int64_t out,
                             const dnnl::memory::desc& desc);

  MultiHeadAttention(const ModelSpec& spec, const dnnl::engine& engine,
                     const Options& options, bool native_bf16);

  absl::Status ForwardImpl(const AttentionBatch& batch, const AttentionOptions& options,
                           absl::Span<float> output, absl::Span<float> attention_weights);
  // out[rows, out_width] = in[rows, in_width] W^T + bias, with `in` in the compute
  // precision and `out` in it too (kProjection) or f32 (kOutProjection).
  absl::Status Project(PrimitiveKind kind, const void* in, int64_t rows, int64_t in_width,
                       Matrix& weight, const float* bias, int64_t out_width, void* out);
  // int8 models: rows of f32 activations as uint8 codes with per-row scales and zero
  // points (see quantization.h), in scratch buffers valid until the next call that uses
  // the same buffers.
  struct QuantizedRows {
    const uint8_t* codes = nullptr;
    const float* scales = nullptr;
    const int32_t* zero_points = nullptr;
  };
  QuantizedRows QuantizeInput(const float* in, int64_t rows, int64_t width,
                              ScratchBuffer& codes, ScratchBuffer& parameters);
  // out[rows, out_width] (f32) = in W^T + bias through oneDNN's u8s8 matmul.
  absl::Status ProjectInt8(const QuantizedRows& in, int64_t rows, int64_t in_width,
                           Matrix& weight, const float* bias, int64_t out_width,
                           float* out);
  // One chunk of Project, through the per-shape primitive or the runtime-rows one.
  absl::Status ProjectChunk(PrimitiveKind kind, bool runtime_rows, const void* in,
                            int64_t rows, int64_t in_width, Matrix& weight,
                            const float* bias, int64_t out_width, void* out);
  // Whether projections through this weight matrix run the runtime-rows primitive
  // (Options::projection_primitives); under kAuto the first call for an (in, out)
  // times both on inputs of its own.
  absl::StatusOr<bool> UseRuntimeRows(PrimitiveKind kind, int64_t in_width,
                                      Matrix& weight, const float* bias,
                                      int64_t out_width);
  // `count` values at `in` (f32, or bf16 when `from_bf16`) into the compute
  // precision at `out`.
  absl::Status Convert(const void* in, bool from_bf16, int64_t count, void* out);
  // `values` (f32 or bf16) in the compute precision: as they are, or converted into
  // `buffer`.
  absl::StatusOr<const void*> InComputePrecision(absl::Span<const float> f32,
                                                 absl::Span<const uint16_t> bf16,
                                                 ScratchBuffer& buffer);
  // `count` consecutive sequences of equal lengths (count > 1 only when all heads of
  // one sequence fit the block budget and no causal blocks are needed: see
  // RunLength), the heads of `set`: context[count L_q, width] from q[count L_q, width],
  // k/v[count L_k, width], all in the compute precision (Q and K already rotated);
  // of `options`, the causal mask, the relative bias (by model head) and the window
  // apply to the scores. A block of query rows multiplies only the keys its rows may
  // see (up to its last row when causal blocks are skipped, within the window of its
  // rows) and masks the rest to -inf. When `attention_weights` is not null the softmax
  // weights [count, num_heads, L_q, L_k] of the set's heads are written there (others
  // untouched; keys a row does not see read 0).
  absl::Status AttendSequences(const HeadSet& set, int64_t count, const uint8_t* q,
                               const uint8_t* k, const uint8_t* v, int64_t query_length,
                               int64_t key_length, const AttentionOptions& options,
                               float* attention_weights, uint8_t* context);
  // One sequence's heads one at a time in blocks of `block_rows` query rows (the long
  // path of AttendSequences, without returned weights), the (head, block) items spread
  // over OpenMP's threads, each running single-threaded primitives in its own buffers.
  absl::Status AttendBlocksInParallel(const HeadSet& set, const uint8_t* q,
                                      const uint8_t* k, const uint8_t* v,
                                      int64_t query_length, int64_t key_length,
                                      int64_t block_rows, bool skip_masked,
                                      const AttentionOptions& options, uint8_t* context);
  // cos and sin of the rotary angles float(t) * inv_freq[c] (f32, as transformers
  // computes them) for positions t < `positions`: row t holds inv_freq.size() cosines,
  // then as many sines. Kept in the scratch and extended while the frequencies stay
  // the same, so it holds 2 inv_freq.size() floats per position of the longest
  // sequence seen. Valid until the next call.
  const float* RotaryTable(absl::Span<const float> inv_freq, int64_t positions);
  // Bytes of the f32 scores of all the set's heads for one sequence.
  static int64_t ScoresBytes(const HeadSet& set, int64_t query_length,
                             int64_t key_length);
  // Whether a sequence takes the long path: its scores exceed the block budget, or it
  // is causal and long enough for its masked triangle to be skipped.
  bool IsLong(const HeadSet& set, int64_t query_length, int64_t key_length,
              bool causal) const;
  // Whether a sequence of these lengths runs through FlashAttention (see
  // Options::attention_kernel); its caller has checked for f32 compute and no weights.
  bool UseFlash(const HeadSet& set, int64_t query_length, int64_t key_length,
                bool causal) const;
  // kAuto: times the kernels (see Options::attention_kernel) unless this process
  // already has, and keeps the choice in attention_choice_.
  absl::Status ChooseAttentionKernel();
  // The timing behind it, on this object's cache and scratch.
  absl::StatusOr<AttentionChoice> TimeAttentionKernels();
  // How many sequences from `index` on have the same lengths and may run in one
  // AttendSequences call.
  int64_t RunLength(const HeadSet& set, absl::Span<const int64_t> query_lengths,
                    absl::Span<const int64_t> key_lengths, size_t index,
                    bool causal) const;
  // `heads` consecutive heads' [rows, head_dim] slices of an [L, width] plane, as
  // [heads, rows, head_dim] with strides (head_dim, width, 1): no copy into per-head
  // planes. With count > 1, of `count` such planes one after another:
  // [count, heads, rows, head_dim]. With share > 1, the heads as heads / share groups
  // of `share`: [(count,) heads / share, share, rows, head_dim].
  dnnl::memory::desc HeadRowsView(int64_t count, int64_t heads, int64_t rows,
                                  int64_t width, int64_t share = 1) const;
  // The key/value heads that `heads` query heads read, `share` query heads each, from
  // an [L, kv_width] plane: HeadRowsView's layout with share 1, else [(count,) heads /
  // share, 1, rows, head_dim] (broadcast over each group's query heads: nothing copied).
  dnnl::memory::desc KvRowsView(int64_t count, int64_t heads, int64_t rows,
                                int64_t kv_width, int64_t share) const;
  // The same slices read transposed, [(count,) heads (/ share, 1), head_dim, length]
  // (K^T).
  dnnl::memory::desc KvColumnsView(int64_t count, int64_t heads, int64_t length,
                                   int64_t kv_width, int64_t share) const;
  // Projections: (rows, in_width, out_width). Attention: (heads, rows, L_k, width,
  // sequences, kv_width, share); softmax: (heads, rows, L_k, 1 when its output is in
  // the compute precision, sequences).
  // Conversion: (count, 1 when from bf16).
  absl::StatusOr<CachedPrimitive*> GetPrimitive(PrimitiveKind kind,
                                                const PrimitiveDims& dims);
  // One execution argument: oneDNN's argument id, its layout, and where its data is
  // (read, or written for a DST argument).
  struct ExecArg {
    int id;
    dnnl::memory::desc desc;
    const void* data;
  };
  // Runs `primitive` on `args` (and the scratchpad); allocates nothing once the
  // primitive has run before.
  absl::Status Execute(CachedPrimitive& primitive, std::initializer_list<ExecArg> args);

  ModelSpec spec_;
  // f32 or bf16, and its size in bytes (f32 for int8 models: only their projections'
  // products are int8).
  dnnl::memory::data_type compute_;
  int64_t compute_bytes_;
  bool int8_;
  Int8Levels int8_levels_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  Options options_;
  PrimitiveCache cache_;

  // The model's heads (all but spec.pruned_heads), and slices of it per head mask.
  HeadSet model_heads_;
  absl::flat_hash_map<std::vector<float>, std::unique_ptr<HeadSet>> masked_heads_;
  // kAuto's choices this object has used, by (in, out, intra_op_threads): copies
  // of the process-wide ones (see UseRuntimeRows), kept here so that the hot path takes
  // no lock.
  std::map<std::array<int64_t, 3>, ProjectionChoice> projection_choices_;
  // The kernel and tiles long f32 sequences run on (Options::attention_kernel).
  AttentionChoice attention_choice_;
  std::vector<float> out_bias_;
  // spec.qk_norm: the norms' scales, the query's times 1/sqrt(head_dim) (which then is
  // not folded into W_q: the norm would undo it).
  std::vector<float> query_norm_, key_norm_;
  int64_t computed_heads_ = 0;

  // What one thread of AttendBlocksInParallel computes in.
  struct ThreadScratch {
    std::unique_ptr<dnnl::stream> stream;
    ScratchBuffer scores, probabilities, scratchpad;
  };
  // Scratch, grown to the largest batch seen; shared by objects that run one after
  // another (ShareScratch).
  struct Scratch {
    std::vector<std::unique_ptr<ThreadScratch>> per_thread;
    ScratchBuffer q, k, v, context, probabilities, compute_probabilities;
    ScratchBuffer query_input, memory_input;
    // int8: codes and their per-row parameters, and the int32 products.
    ScratchBuffer query_codes, query_parameters, memory_codes, memory_parameters;
    ScratchBuffer accumulators;
    ScratchBuffer scratchpad;  // oneDNN's (user mode)
    FlashScratch flash;
    // Rotary: native bf16's f32 Q or K before they turn; the angles' table
    // (RotaryTable) and the frequencies and positions it holds.
    ScratchBuffer rotary_projection;
    std::vector<float> rotary_table, rotary_inv_freq;
    int64_t rotary_positions = 0;
  };
  std::shared_ptr<Scratch> scratch_ = std::make_shared<Scratch>();
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_MULTI_HEAD_ATTENTION_H_
