// Paged attention for the CPU, read straight from the head-major paged cache.
//
// Contract: the same as spyglass.kernels.torch_attention.paged_attention (the reference this is
// tested against), over the CPU backend's cache layout [num_kv_heads, num_blocks, block_size, head_dim].
// Query rows may be strided (a view of the fused qkv output); heads within a row are contiguous.
//
// One work item is (request, up to kTileRows query rows, kv head). In bfloat16 on AVX512-BF16 CPUs
// (head dims 32, 64, 128; even block sizes) every query vector of the item, its rows times the kv
// head's group of query heads, meets a block of keys while it is in L1, so K and V are streamed from
// memory once per item and never gathered or repeated; keys are walked through block pointers
// computed once per item. Products take bf16 inputs (vdpbf16ps) and the probabilities are rounded to
// bf16 for the weighted sum, as the torch path rounds them before its matmul. float32 on AVX2 CPUs
// (same head dims) takes a path of the same shape with FMA: 8 keys per pass for the scores, 32 dims of
// 3 query vectors per pass for the values, over a float32 cache or a float16 one (--kv-cache-dtype
// float16: half the bytes to stream). Other dtypes and shapes go one row at a time through a generic
// path, as does any call with a sliding window (a row sees only its last `sliding_window` keys) or
// soft-capped scores (softcap * tanh(score / softcap), Gemma 2).
// Scores, softmax and sums are float32 throughout.
// Every query length runs here (prompts included). Plain C ABI, loaded with ctypes; OpenMP from the
// runtime torch already loaded (same soname), with the thread count torch uses.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using spyglass::Half;
using spyglass::store;
using spyglass::to_float;

// Query rows handled together by one work item: they share every pass over their keys.
constexpr int64_t kTileRows = 4;

struct WorkItem {
    int64_t request;
    int64_t row;       // first flattened query row
    int64_t num_rows;  // up to kTileRows consecutive rows of the request
    int64_t kv_head;
    int64_t num_keys;  // causal limit for the first row; row i sees num_keys + i keys
};

// Where an item's blocks start in the K and V caches of element type C.
template <typename C>
struct BlockStarts {
    std::vector<const C*> keys, values;
};

// Per-thread buffers, grown as needed and reused across work items.
struct Scratch {
    std::vector<float> scores;
    std::vector<uint16_t> probs;
    BlockStarts<uint16_t> bf16;
    BlockStarts<float> f32;
    BlockStarts<Half> f16;

    template <typename C>
    BlockStarts<C>& starts();
};

template <>
inline BlockStarts<uint16_t>& Scratch::starts() { return bf16; }
template <>
inline BlockStarts<float>& Scratch::starts() { return f32; }
template <>
inline BlockStarts<Half>& Scratch::starts() { return f16; }

struct Shapes {
    int64_t num_heads, num_kv_heads, head_dim, num_blocks, block_size, table_stride, query_row_stride;
    int64_t sliding_window;  // 0: every earlier key is visible
    float softcap;           // 0: scores are not capped
};

// Where one work item reads: its request's block table and its kv head's slice of the cache.
struct Keys {
    const int32_t* table;
    int64_t head_offset;  // kv_head * num_blocks
    int64_t block_size, dim, count;
    int64_t first = 0;  // the first visible key (a sliding window hides the ones before)
};

template <typename T>
const T* row(const T* cache, const Keys& keys, int64_t j) {
    return cache + ((keys.head_offset + keys.table[j / keys.block_size]) * keys.block_size + j % keys.block_size) *
                       keys.dim;
}

// scores[g * n + j] = scale * q_g . k_j (soft-capped when softcap > 0) for every visible key first <= j < n.
template <typename T, typename C>
void scores_into(const T* q_row, const C* k_cache, const Keys& keys, int64_t group, float scale, float softcap,
                 float* q, float* scores) {
    const int64_t dim = keys.dim, n = keys.count;
    for (int64_t i = 0; i < group * dim; ++i) q[i] = to_float(q_row[i]) * scale;
    for (int64_t j = keys.first; j < n; ++j) {
        const C* key = row(k_cache, keys, j);
        for (int64_t g = 0; g < group; ++g) {
            const float* qg = q + g * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; ++d) dot += qg[d] * to_float(key[d]);
            scores[g * n + j] = softcap > 0.f ? softcap * std::tanh(dot / softcap) : dot;
        }
    }
}

// acc[g * dim + d] = sum_j probs[g * n + j] * v_j[d].
template <typename C>
void weighted_values(const float* probs, const C* v_cache, const Keys& keys, int64_t group, float* acc) {
    const int64_t dim = keys.dim, n = keys.count;
    std::fill(acc, acc + group * dim, 0.f);
    for (int64_t j = keys.first; j < n; ++j) {
        const C* value = row(v_cache, keys, j);
        for (int64_t g = 0; g < group; ++g) {
            const float p = probs[g * n + j];
            float* ag = acc + g * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) ag[d] += p * to_float(value[d]);
        }
    }
}

// scores[0, n) = softmax(scores[0, n)).
void softmax(float* scores, int64_t n) {
    float top = scores[0];
    for (int64_t j = 1; j < n; ++j) top = std::max(top, scores[j]);
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - top);
        total += scores[j];
    }
    const float inverse = 1.f / total;
    for (int64_t j = 0; j < n; ++j) scores[j] *= inverse;
}

template <typename T, typename C>
void attend_row(const WorkItem& item, int64_t row_in_item, const T* query, const C* k_cache, const C* v_cache,
                const int32_t* block_tables, const Shapes& s, float scale, std::vector<float>& scratch, T* out) {
    const int64_t group = s.num_heads / s.num_kv_heads, dim = s.head_dim, n = item.num_keys + row_in_item;
    scratch.resize(static_cast<size_t>(group * (n + 2 * dim)));
    float* scores = scratch.data();  // [group, n]
    float* q = scores + group * n;   // [group, dim]
    float* acc = q + group * dim;    // [group, dim]
    const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, n - s.sliding_window) : 0;
    const Keys keys{block_tables + item.request * s.table_stride, item.kv_head * s.num_blocks, s.block_size, dim, n,
                    first};
    const int64_t row_index = item.row + row_in_item;
    const T* q_row = query + row_index * s.query_row_stride + item.kv_head * group * dim;
    scores_into(q_row, k_cache, keys, group, scale, s.softcap, q, scores);
    for (int64_t g = 0; g < group; ++g) softmax(scores + g * n + first, n - first);
    weighted_values(scores, v_cache, keys, group, acc);
    T* out_row = out + (row_index * s.num_heads + item.kv_head * group) * dim;
    for (int64_t i = 0; i < group * dim; ++i) store(out_row + i, acc[i]);
}

// Any dtype, any shape: one query row at a time.
template <typename T, typename C>
void attend(const WorkItem& item, const T* query, const C* k_cache, const C* v_cache, const int32_t* block_tables,
            const Shapes& s, float scale, Scratch& scratch, T* out) {
    for (int64_t i = 0; i < item.num_rows; ++i)
        attend_row(item, i, query, k_cache, v_cache, block_tables, s, scale, scratch.scores, out);
}

// The item's blocks of one cache, as pointers to their first key (no division per key).
template <typename T>
void block_starts(const T* cache, const Keys& keys, std::vector<const T*>& starts) {
    const int64_t count = (keys.count + keys.block_size - 1) / keys.block_size;
    starts.resize(static_cast<size_t>(count));
    for (int64_t b = 0; b < count; ++b)
        starts[b] = cache + (keys.head_offset + keys.table[b]) * keys.block_size * keys.dim;
}

#if defined(__AVX2__)
// float32 on AVX2: every query vector of the item (its rows times the kv head's group) meets 8 keys
// at a time for its scores, their lane sums folded into one vector; the weighted sum of values
// runs over 32 dims of up to 3 vectors at a time, so every accumulator stays in a register. Blocks
// ahead are prefetched while one is read. The cache holds float32 or float16 (`Half`, widened to
// float32 as it is loaded: half the bytes to stream for the same keys).

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Lane j of the result is the sum of the 8 lanes of a[j].
inline __m256 sum_each8(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Ask for the `count` elements from p, every 64-byte line, into L1 (_MM_HINT_T0) or L2 (_MM_HINT_T1).
template <int HINT = _MM_HINT_T0, typename C>
void prefetch(const C* p, int64_t count) {
    const char* bytes = reinterpret_cast<const char*>(p);
    const auto hint = static_cast<decltype(_MM_HINT_T0)>(HINT);
    for (int64_t i = 0; i < count * static_cast<int64_t>(sizeof(C)); i += 64) _mm_prefetch(bytes + i, hint);
}

// scores[v * n + j] = q_v . k_j for `count` query vectors (already scaled) and the first n keys. Each
// pass takes 8 keys, which every vector meets while they are in L1; meanwhile the same keys two
// blocks on are prefetched into L1 and the same values into L2, for the values pass (a block of one
// head is a page of its own to the hardware prefetcher, which stops at page ends).
template <int CHUNKS, typename C>
void scores_f32(const float* q, int64_t count, const std::vector<const C*>& blocks,
                const std::vector<const C*>& value_blocks, int64_t block_size, int64_t n, float* scores) {
    constexpr int64_t dim = 8 * CHUNKS;
    const int64_t num_blocks = (n + block_size - 1) / block_size;
    if (num_blocks > 1) prefetch(blocks[1], block_size * dim);
    for (int64_t start = 0, b = 0; start < n; start += block_size, ++b) {
        const int64_t in_block = std::min(block_size, n - start);
        for (int64_t sub = 0; sub < in_block; sub += 8) {
            const int64_t here = std::min<int64_t>(8, in_block - sub);
            if (b + 2 < num_blocks) prefetch(blocks[b + 2] + sub * dim, 8 * dim);
            prefetch<_MM_HINT_T1>(value_blocks[b] + sub * dim, 8 * dim);
            const C* keys[8];
            // Past the block's last key, recompute its first one (dropped below) rather than read on.
            for (int64_t j = 0; j < 8; ++j) keys[j] = blocks[b] + (sub + (j < here ? j : 0)) * dim;
            for (int64_t v = 0; v < count; ++v) {
                __m256 acc[8];
                for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
                for (int c = 0; c < CHUNKS; ++c) {
                    const __m256 qc = _mm256_loadu_ps(q + v * dim + 8 * c);
                    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qc, load8(keys[j] + 8 * c), acc[j]);
                }
                const __m256 dots = sum_each8(acc);
                float* out = scores + v * n + start + sub;
                if (here == 8) {
                    _mm256_storeu_ps(out, dots);
                } else {
                    alignas(32) float lanes[8];
                    _mm256_store_ps(lanes, dots);
                    std::memcpy(out, lanes, here * sizeof(float));
                }
            }
        }
    }
}

// acc[v * dim + first + d] = sum_j probs[v * probs_stride + j] * v_j[first + d], d < 32, for COUNT vectors.
template <int COUNT, typename C>
void values_f32(const float* probs, int64_t probs_stride, const std::vector<const C*>& blocks,
                int64_t block_size, int64_t n, int64_t dim, int64_t first, float* acc) {
    __m256 sums[COUNT][4];
    for (int v = 0; v < COUNT; ++v)
        for (int c = 0; c < 4; ++c) sums[v][c] = _mm256_setzero_ps();
    const int64_t num_blocks = (n + block_size - 1) / block_size;
    for (int64_t start = 0, b = 0; start < n; start += block_size, ++b) {
        const int64_t in_block = std::min(block_size, n - start);
        const C* next = b + 1 < num_blocks ? blocks[b + 1] + first : nullptr;
        for (int64_t j = 0; j < in_block; ++j) {
            if (next) _mm_prefetch(reinterpret_cast<const char*>(next + j * dim), _MM_HINT_T0);
            const C* value = blocks[b] + j * dim + first;
            __m256 p[COUNT];
            for (int v = 0; v < COUNT; ++v) p[v] = _mm256_broadcast_ss(probs + v * probs_stride + start + j);
            for (int c = 0; c < 4; ++c) {
                const __m256 chunk = load8(value + 8 * c);
                for (int v = 0; v < COUNT; ++v) sums[v][c] = _mm256_fmadd_ps(p[v], chunk, sums[v][c]);
            }
        }
    }
    for (int v = 0; v < COUNT; ++v)
        for (int c = 0; c < 4; ++c) _mm256_storeu_ps(acc + v * dim + first + 8 * c, sums[v][c]);
}

constexpr int64_t kValueVectors = 3;  // 12 accumulators, 3 probabilities and a value vector: 16 registers

template <int CHUNKS, typename C>
void attend_f32(const WorkItem& item, const float* query, const C* k_cache, const C* v_cache,
                const int32_t* block_tables, const Shapes& s, float scale, Scratch& scratch, float* out) {
    constexpr int64_t dim = 8 * CHUNKS;
    const int64_t group = s.num_heads / s.num_kv_heads;
    const int64_t vectors = item.num_rows * group, n_max = item.num_keys + item.num_rows - 1;
    scratch.scores.resize(static_cast<size_t>(vectors * (n_max + 2 * dim)));
    float* probs = scratch.scores.data();  // [vectors, n_max], zero past each row's causal limit
    float* acc = probs + vectors * n_max;  // [vectors, dim]
    float* q = acc + vectors * dim;        // [vectors, dim], scaled
    const Keys keys{block_tables + item.request * s.table_stride, item.kv_head * s.num_blocks, s.block_size, dim, n_max};
    BlockStarts<C>& starts = scratch.starts<C>();
    block_starts(k_cache, keys, starts.keys);
    block_starts(v_cache, keys, starts.values);
    for (int64_t v = 0; v < vectors; ++v) {
        const int64_t i = v / group, g = v % group;
        const float* qv = query + (item.row + i) * s.query_row_stride + (item.kv_head * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) q[v * dim + d] = qv[d] * scale;
    }
    // Every vector's scores up to the item's last row's limit; each row then keeps its own keys.
    prefetch(starts.keys[0], std::min(s.block_size, n_max) * dim);
    scores_f32<CHUNKS>(q, vectors, starts.keys, starts.values, s.block_size, n_max, probs);
    for (int64_t v = 0; v < vectors; ++v) {
        const int64_t n = item.num_keys + v / group;
        softmax(probs + v * n_max, n);
        std::fill(probs + v * n_max + n, probs + (v + 1) * n_max, 0.f);
    }
    for (int64_t first = 0; first < dim; first += 32) {
        for (int64_t v0 = 0; v0 < vectors; v0 += kValueVectors) {
            const float* p = probs + v0 * n_max;
            float* a = acc + v0 * dim;
            const auto& blocks = starts.values;
            switch (std::min(kValueVectors, vectors - v0)) {
                case 3: values_f32<3>(p, n_max, blocks, s.block_size, n_max, dim, first, a); break;
                case 2: values_f32<2>(p, n_max, blocks, s.block_size, n_max, dim, first, a); break;
                default: values_f32<1>(p, n_max, blocks, s.block_size, n_max, dim, first, a); break;
            }
        }
    }
    for (int64_t v = 0; v < vectors; ++v) {
        const int64_t i = v / group, g = v % group;
        std::memcpy(out + ((item.row + i) * s.num_heads + item.kv_head * group + g) * dim, acc + v * dim,
                    dim * sizeof(float));
    }
}

// float32 queries with head dims 32, 64 and 128 and no window or soft-cap take the AVX2 path; others
// the generic one.
template <typename C>
void attend(const WorkItem& item, const float* query, const C* k_cache, const C* v_cache,
            const int32_t* block_tables, const Shapes& s, float scale, Scratch& scratch, float* out) {
    if (s.sliding_window == 0 && s.softcap == 0.f) switch (s.head_dim) {
            case 32: return attend_f32<4>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
            case 64: return attend_f32<8>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
            case 128: return attend_f32<16>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
        }
    attend<float, C>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
}
#endif

#if defined(__AVX512BF16__)
// bfloat16 with AVX512-BF16: pairs of bf16 products accumulate in float32 (vdpbf16ps). Every query
// vector of the item (its rows times the kv head's group) meets each key block while it is in L1.

// Lane j of the result is the sum of all 16 lanes of v[j] (a transpose folded into the adds).
inline __m512 sum_each(const __m512 v[16]) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; ++i)
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    // quads[i] holds, per 128-bit lane, the lane sums of keys 4i..4i+3: add the four lanes up.
    const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                     _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
    const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                      _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

inline __m512bh load_bf16(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// The loops below are templates on CHUNKS (head_dim / 32) and COUNT (query vectors per pass) so that
// every accumulator stays in a register.

// scores[j] = scale * q . k_j for the first n keys.
template <int CHUNKS>
void scores_bf16(const uint16_t* q, const std::vector<const uint16_t*>& blocks, int64_t block_size, int64_t n,
                 float scale, float* scores) {
    constexpr int64_t dim = 32 * CHUNKS;
    __m512bh qc[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) qc[c] = load_bf16(q + 32 * c);
    for (int64_t start = 0, b = 0; start < n; start += block_size, ++b) {
        const int64_t in_block = std::min(block_size, n - start);
        for (int64_t sub = 0; sub < in_block; sub += 16) {
            const int64_t count = std::min<int64_t>(16, in_block - sub);
            const uint16_t* first = blocks[b] + sub * dim;
            __m512 acc[16];
            for (int64_t j = 0; j < 16; ++j) {
                // Past the block's last key, recompute its first one (masked out below) rather than read on.
                const uint16_t* key = first + (j < count ? j : 0) * dim;
                acc[j] = _mm512_setzero_ps();
                for (int c = 0; c < CHUNKS; ++c) acc[j] = _mm512_dpbf16_ps(acc[j], qc[c], load_bf16(key + 32 * c));
            }
            const __m512 dots = _mm512_mul_ps(sum_each(acc), _mm512_set1_ps(scale));
            _mm512_mask_storeu_ps(scores + start + sub, static_cast<__mmask16>((1u << count) - 1), dots);
        }
    }
}

// probs[0, padded) = bf16(softmax(scores[0, n))), zero past n.
void probabilities_bf16(float* scores, int64_t n, int64_t padded, uint16_t* probs) {
    softmax(scores, n);
    auto first_lanes = [](int64_t lanes) {
        return static_cast<__mmask16>(lanes <= 0 ? 0 : lanes >= 16 ? 0xFFFF : (1u << lanes) - 1);
    };
    for (int64_t j = 0; j < padded; j += 32) {
        const __m512 a = _mm512_maskz_loadu_ps(first_lanes(n - j), scores + j);
        const __m512 b = _mm512_maskz_loadu_ps(first_lanes(n - j - 16), scores + j + 16);
        _mm512_storeu_si512(probs + j, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

// acc[v] = sum_j probs[v][j] * v_j for COUNT query vectors over the first n keys (block_size even).
// Keys go in pairs: rows j and j+1 interleaved element-wise meet (p_j, p_j+1) in one vdpbf16ps.
// Within each 128-bit lane, unpacklo covers dims 8l..8l+3 and unpackhi 8l+4..8l+7 of a 32-dim chunk.
template <int CHUNKS, int COUNT>
void values_bf16_fixed(const uint16_t* probs, int64_t probs_stride, const std::vector<const uint16_t*>& blocks,
                       int64_t block_size, int64_t n, float* acc) {
    constexpr int64_t dim = 32 * CHUNKS;
    __m512 sums[COUNT][CHUNKS][2];
    for (int v = 0; v < COUNT; ++v)
        for (int c = 0; c < CHUNKS; ++c) sums[v][c][0] = sums[v][c][1] = _mm512_setzero_ps();
    for (int64_t start = 0, b = 0; start < n; start += block_size, ++b) {
        const int64_t in_block = std::min(block_size, n - start);
        for (int64_t j = 0; j < in_block; j += 2) {
            const uint16_t* first = blocks[b] + j * dim;
            // An odd last key pairs with itself; its partner's probability is zero.
            const uint16_t* second = j + 1 < in_block ? first + dim : first;
            __m512i lo[CHUNKS], hi[CHUNKS];
            for (int c = 0; c < CHUNKS; ++c) {
                const __m512i x = _mm512_loadu_si512(first + 32 * c), y = _mm512_loadu_si512(second + 32 * c);
                lo[c] = _mm512_unpacklo_epi16(x, y);
                hi[c] = _mm512_unpackhi_epi16(x, y);
            }
            for (int v = 0; v < COUNT; ++v) {
                int32_t pair;
                std::memcpy(&pair, probs + v * probs_stride + start + j, sizeof pair);
                const __m512bh weights = (__m512bh)_mm512_set1_epi32(pair);
                for (int c = 0; c < CHUNKS; ++c) {
                    sums[v][c][0] = _mm512_dpbf16_ps(sums[v][c][0], weights, (__m512bh)lo[c]);
                    sums[v][c][1] = _mm512_dpbf16_ps(sums[v][c][1], weights, (__m512bh)hi[c]);
                }
            }
        }
    }
    for (int v = 0; v < COUNT; ++v)
        for (int c = 0; c < CHUNKS; ++c) {
            alignas(64) float parts[2][16];
            _mm512_store_ps(parts[0], sums[v][c][0]);
            _mm512_store_ps(parts[1], sums[v][c][1]);
            float* out = acc + v * dim + 32 * c;
            for (int lane = 0; lane < 4; ++lane)
                for (int i = 0; i < 4; ++i) {
                    out[8 * lane + i] = parts[0][4 * lane + i];
                    out[8 * lane + 4 + i] = parts[1][4 * lane + i];
                }
        }
}

// Query vectors per values pass: 2 * CHUNKS * COUNT accumulators, at most 24 of the 32 registers.
template <int CHUNKS>
constexpr int kVectorsPerPass = 12 / CHUNKS;

// `values_bf16_fixed` for ``count`` (1..kVectorsPerPass) vectors, chosen at run time.
template <int CHUNKS, int COUNT = kVectorsPerPass<CHUNKS>>
void values_bf16(const uint16_t* probs, int64_t probs_stride, int64_t count, const std::vector<const uint16_t*>& blocks,
                 int64_t block_size, int64_t n, float* acc) {
    if constexpr (COUNT > 1)
        if (count < COUNT) return values_bf16<CHUNKS, COUNT - 1>(probs, probs_stride, count, blocks, block_size, n, acc);
    values_bf16_fixed<CHUNKS, COUNT>(probs, probs_stride, blocks, block_size, n, acc);
}

template <int CHUNKS>
void attend_bf16(const WorkItem& item, const uint16_t* query, const uint16_t* k_cache, const uint16_t* v_cache,
                 const int32_t* block_tables, const Shapes& s, float scale, Scratch& scratch, uint16_t* out) {
    constexpr int64_t dim = 32 * CHUNKS;
    const int64_t group = s.num_heads / s.num_kv_heads;
    const int64_t vectors = item.num_rows * group, n_max = item.num_keys + item.num_rows - 1;
    const int64_t padded = (n_max + 31) / 32 * 32;
    scratch.scores.resize(static_cast<size_t>(padded + vectors * dim));
    scratch.probs.resize(static_cast<size_t>(vectors * padded));
    float* acc = scratch.scores.data() + padded;
    const Keys keys{block_tables + item.request * s.table_stride, item.kv_head * s.num_blocks, s.block_size, dim, n_max};
    BlockStarts<uint16_t>& starts = scratch.starts<uint16_t>();
    block_starts(k_cache, keys, starts.keys);
    block_starts(v_cache, keys, starts.values);
    for (int64_t v = 0; v < vectors; ++v) {
        const int64_t i = v / group, g = v % group, n = item.num_keys + i;
        const uint16_t* q = query + (item.row + i) * s.query_row_stride + (item.kv_head * group + g) * dim;
        scores_bf16<CHUNKS>(q, starts.keys, s.block_size, n, scale, scratch.scores.data());
        probabilities_bf16(scratch.scores.data(), n, padded, scratch.probs.data() + v * padded);
    }
    constexpr int64_t per_pass = kVectorsPerPass<CHUNKS>;
    for (int64_t v0 = 0; v0 < vectors; v0 += per_pass)
        values_bf16<CHUNKS>(scratch.probs.data() + v0 * padded, padded, std::min(per_pass, vectors - v0),
                            starts.values, s.block_size, n_max, acc + v0 * dim);
    for (int64_t v = 0; v < vectors; ++v) {
        const int64_t i = v / group, g = v % group;
        uint16_t* out_row = out + ((item.row + i) * s.num_heads + item.kv_head * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) store(out_row + d, acc[v * dim + d]);
    }
}

// Head dims 32, 64 and 128 with an even block size and no window or soft-cap take the AVX512-BF16
// path; others the generic one.
void attend(const WorkItem& item, const uint16_t* query, const uint16_t* k_cache, const uint16_t* v_cache,
            const int32_t* block_tables, const Shapes& s, float scale, Scratch& scratch, uint16_t* out) {
    if (s.block_size % 2 == 0 && s.sliding_window == 0 && s.softcap == 0.f) switch (s.head_dim) {
            case 32: return attend_bf16<1>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
            case 64: return attend_bf16<2>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
            case 128: return attend_bf16<4>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
        }
    attend<uint16_t, uint16_t>(item, query, k_cache, v_cache, block_tables, s, scale, scratch, out);
}
#endif

template <typename T, typename C>
void paged_attention(const T* query, const C* k_cache, const C* v_cache, const int32_t* block_tables,
                     const int32_t* context_lens, const int32_t* query_start_loc, int64_t num_reqs, Shapes shapes,
                     float scale, int64_t num_threads, T* out) {
    std::vector<WorkItem> items;
    for (int64_t r = 0; r < num_reqs; ++r) {
        const int64_t q_len = query_start_loc[r + 1] - query_start_loc[r];
        for (int64_t i = 0; i < q_len; i += kTileRows)
            for (int64_t h = 0; h < shapes.num_kv_heads; ++h)
                items.push_back({r, query_start_loc[r] + i, std::min(kTileRows, q_len - i), h,
                                 context_lens[r] - q_len + i + 1});
    }
    const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(num_threads)
    {
        Scratch scratch;
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < num_items; ++w)
            attend(items[w], query, k_cache, v_cache, block_tables, shapes, scale, scratch, out);
    }
}

}  // namespace

// NAME for queries and outputs of type T over caches of type C.
#define SPYGLASS_PAGED_ATTENTION(NAME, T, C)                                                                  \
    extern "C" void NAME(const void* query, const void* k_cache, const void* v_cache, const int32_t* block_tables, \
                         const int32_t* context_lens, const int32_t* query_start_loc, int64_t num_reqs,        \
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,       \
                         int64_t block_size, int64_t table_stride, int64_t query_row_stride, float scale,      \
                         int64_t sliding_window, float softcap, int64_t num_threads, void* out) {              \
        Shapes shapes{num_heads,  num_kv_heads,     head_dim,       num_blocks, block_size,                       \
                      table_stride, query_row_stride, sliding_window, softcap};                                   \
        paged_attention(static_cast<const T*>(query), static_cast<const C*>(k_cache),                         \
                        static_cast<const C*>(v_cache), block_tables, context_lens, query_start_loc, num_reqs, \
                        shapes, scale, num_threads, static_cast<T*>(out));                     \
    }

SPYGLASS_PAGED_ATTENTION(spyglass_paged_attention_f32, float, float)
SPYGLASS_PAGED_ATTENTION(spyglass_paged_attention_bf16, uint16_t, uint16_t)
SPYGLASS_PAGED_ATTENTION(spyglass_paged_attention_f32_f16kv, float, Half)
