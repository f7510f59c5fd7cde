// Paged attention for the CPU, read straight from the head-major paged cache.
//
// Contract: the same as spyglass.kernels.torch_attention.paged_attention (the reference this is
// tested against), over the CPU backend's cache layout [num_kv_heads, num_blocks, block_size, head_dim].
// Query rows may be strided (a view of the fused qkv output); heads within a row are contiguous.
//
// One work item is (request, query row, kv head): its group of query heads shares one pass over the
// keys and one over the values, so K and V are read once per group and never gathered or repeated.
// Scores, softmax and sums are float32. In bfloat16 on AVX512-BF16 CPUs, products take bf16 inputs
// (vdpbf16ps) and the probabilities are rounded to bf16 for the weighted sum, as the torch path
// rounds them before its matmul. Every query length runs here: for prompts it matches or beats
// SDPA's CPU kernel on this workload's sizes (measured up to 1,024 tokens). Plain C ABI, loaded with ctypes; OpenMP from
// the runtime torch already loaded (same soname), with the thread count torch uses.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using spyglass::store;
using spyglass::to_float;

struct WorkItem {
    int64_t request;
    int64_t row;       // flattened query row
    int64_t kv_head;
    int64_t num_keys;  // causal limit for this row
};

struct Shapes {
    int64_t num_heads, num_kv_heads, head_dim, num_blocks, block_size, table_stride, query_row_stride;
};

// Where one work item reads: its request's block table and its kv head's slice of the cache.
struct Keys {
    const int32_t* table;
    int64_t head_offset;  // kv_head * num_blocks
    int64_t block_size, dim, count;
};

template <typename T>
const T* row(const T* cache, const Keys& keys, int64_t j) {
    return cache + ((keys.head_offset + keys.table[j / keys.block_size]) * keys.block_size + j % keys.block_size) *
                       keys.dim;
}

// scores[g * n + j] = scale * q_g . k_j for every key j < n.
template <typename T>
void scores_into(const T* q_row, const T* k_cache, const Keys& keys, int64_t group, float scale, float* q,
                 float* scores) {
    const int64_t dim = keys.dim, n = keys.count;
    for (int64_t i = 0; i < group * dim; ++i) q[i] = to_float(q_row[i]) * scale;
    for (int64_t j = 0; j < n; ++j) {
        const T* key = row(k_cache, keys, j);
        for (int64_t g = 0; g < group; ++g) {
            const float* qg = q + g * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; ++d) dot += qg[d] * to_float(key[d]);
            scores[g * n + j] = dot;
        }
    }
}

// acc[g * dim + d] = sum_j probs[g * n + j] * v_j[d].
template <typename T>
void weighted_values(const float* probs, const T* v_cache, const Keys& keys, int64_t group, float* acc) {
    const int64_t dim = keys.dim, n = keys.count;
    std::fill(acc, acc + group * dim, 0.f);
    for (int64_t j = 0; j < n; ++j) {
        const T* value = row(v_cache, keys, j);
        for (int64_t g = 0; g < group; ++g) {
            const float p = probs[g * n + j];
            float* ag = acc + g * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) ag[d] += p * to_float(value[d]);
        }
    }
}

#if defined(__AVX512BF16__)
// bfloat16 with AVX512-BF16: pairs of bf16 products accumulate in float32 (vdpbf16ps).

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

void scores_into(const uint16_t* q_row, const uint16_t* k_cache, const Keys& keys, int64_t group, float scale,
                 float* q, float* scores) {
    const int64_t dim = keys.dim, n = keys.count, chunks = dim / 32;
    if (dim % 32 != 0 || chunks > 8) return scores_into<uint16_t>(q_row, k_cache, keys, group, scale, q, scores);
    for (int64_t g = 0; g < group; ++g) {
        __m512bh qg[8];
        for (int64_t c = 0; c < chunks; ++c) qg[c] = load_bf16(q_row + g * dim + 32 * c);
        // 16 keys at a time, each run of them contiguous within one block.
        for (int64_t start = 0; start < n;) {
            const int64_t count = std::min<int64_t>({16, n - start, keys.block_size - start % keys.block_size});
            const uint16_t* first = row(k_cache, keys, start);
            __m512 acc[16];
            for (int64_t j = 0; j < 16; ++j) {
                acc[j] = _mm512_setzero_ps();
                if (j < count)
                    for (int64_t c = 0; c < chunks; ++c)
                        acc[j] = _mm512_dpbf16_ps(acc[j], qg[c], load_bf16(first + j * dim + 32 * c));
            }
            const __m512 dots = _mm512_mul_ps(sum_each(acc), _mm512_set1_ps(scale));
            _mm512_mask_storeu_ps(scores + g * n + start, static_cast<__mmask16>((1u << count) - 1), dots);
            start += count;
        }
    }
}

void weighted_values(const float* probs, const uint16_t* v_cache, const Keys& keys, int64_t group, float* acc) {
    const int64_t dim = keys.dim, n = keys.count, chunks = dim / 32;
    if (dim % 32 != 0 || chunks > 8) return weighted_values<uint16_t>(probs, v_cache, keys, group, acc);
    // Keys go in pairs: rows j and j+1 interleaved element-wise meet (p_j, p_j+1) in one vdpbf16ps.
    // Within each 128-bit lane, unpacklo covers dims 8l..8l+3 and unpackhi 8l+4..8l+7 of a 32-dim chunk.
    const int64_t heads_per_pass = std::max<int64_t>(1, 24 / (2 * chunks));
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t g0 = 0; g0 < group; g0 += heads_per_pass) {
        const int64_t heads = std::min(heads_per_pass, group - g0);
        __m512 sums[24];
        for (int64_t i = 0; i < 2 * chunks * heads; ++i) sums[i] = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j += 2) {
            const bool pair = j + 1 < n;
            const uint16_t* first = row(v_cache, keys, j);
            const uint16_t* second = pair ? row(v_cache, keys, j + 1) : nullptr;
            __m512i lo[8], hi[8];
            for (int64_t c = 0; c < chunks; ++c) {
                const __m512i a = _mm512_loadu_si512(first + 32 * c);
                const __m512i b = pair ? _mm512_loadu_si512(second + 32 * c) : zero;
                lo[c] = _mm512_unpacklo_epi16(a, b);
                hi[c] = _mm512_unpackhi_epi16(a, b);
            }
            for (int64_t h = 0; h < heads; ++h) {
                const float* p = probs + (g0 + h) * n + j;
                uint16_t both[2];
                store(both, p[0]);
                store(both + 1, pair ? p[1] : 0.f);
                uint32_t packed;
                std::memcpy(&packed, both, sizeof packed);
                const __m512bh weights = (__m512bh)_mm512_set1_epi32(static_cast<int>(packed));
                for (int64_t c = 0; c < chunks; ++c) {
                    __m512* s = sums + (h * chunks + c) * 2;
                    s[0] = _mm512_dpbf16_ps(s[0], weights, (__m512bh)lo[c]);
                    s[1] = _mm512_dpbf16_ps(s[1], weights, (__m512bh)hi[c]);
                }
            }
        }
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t c = 0; c < chunks; ++c) {
                alignas(64) float parts[2][16];
                _mm512_store_ps(parts[0], sums[(h * chunks + c) * 2]);
                _mm512_store_ps(parts[1], sums[(h * chunks + c) * 2 + 1]);
                float* out = acc + (g0 + h) * dim + 32 * c;
                for (int lane = 0; lane < 4; ++lane)
                    for (int i = 0; i < 4; ++i) {
                        out[8 * lane + i] = parts[0][4 * lane + i];
                        out[8 * lane + 4 + i] = parts[1][4 * lane + i];
                    }
            }
    }
}
#endif

template <typename T>
void attend_one(const WorkItem& item, const T* query, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                const Shapes& s, float scale, std::vector<float>& scratch, T* out) {
    const int64_t group = s.num_heads / s.num_kv_heads, dim = s.head_dim, n = item.num_keys;
    scratch.resize(static_cast<size_t>(group * (n + 2 * dim)));
    float* scores = scratch.data();  // [group, n]
    float* q = scores + group * n;   // [group, dim]
    float* acc = q + group * dim;    // [group, dim]
    const Keys keys{block_tables + item.request * s.table_stride, item.kv_head * s.num_blocks, s.block_size, dim, n};
    const T* q_row = query + item.row * s.query_row_stride + item.kv_head * group * dim;
    scores_into(q_row, k_cache, keys, group, scale, q, scores);

    for (int64_t g = 0; g < group; ++g) {
        float* scores_g = scores + g * n;
        float top = scores_g[0];
        for (int64_t j = 1; j < n; ++j) top = std::max(top, scores_g[j]);
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < n; ++j) {
            scores_g[j] = std::exp(scores_g[j] - top);
            total += scores_g[j];
        }
        const float inverse = 1.f / total;
        for (int64_t j = 0; j < n; ++j) scores_g[j] *= inverse;
    }

    weighted_values(scores, v_cache, keys, group, acc);
    T* out_row = out + (item.row * s.num_heads + item.kv_head * group) * dim;
    for (int64_t i = 0; i < group * dim; ++i) store(out_row + i, acc[i]);
}

template <typename T>
void paged_attention(const T* query, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                     const int32_t* context_lens, const int32_t* query_start_loc, int64_t num_reqs, Shapes shapes,
                     float scale, int64_t num_threads, T* out) {
    std::vector<WorkItem> items;
    for (int64_t r = 0; r < num_reqs; ++r) {
        const int64_t q_len = query_start_loc[r + 1] - query_start_loc[r];
        for (int64_t i = 0; i < q_len; ++i)
            for (int64_t h = 0; h < shapes.num_kv_heads; ++h)
                items.push_back({r, query_start_loc[r] + i, h, context_lens[r] - q_len + i + 1});
    }
    const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<float> scratch;
#pragma omp for schedule(dynamic, 4)
        for (int64_t w = 0; w < num_items; ++w)
            attend_one(items[w], query, k_cache, v_cache, block_tables, shapes, scale, scratch, out);
    }
}

}  // namespace

#define SPYGLASS_PAGED_ATTENTION(NAME, T)                                                                     \
    extern "C" void NAME(const void* query, const void* k_cache, const void* v_cache, const int32_t* block_tables, \
                         const int32_t* context_lens, const int32_t* query_start_loc, int64_t num_reqs,        \
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,       \
                         int64_t block_size, int64_t table_stride, int64_t query_row_stride, float scale,      \
                         int64_t num_threads, void* out) {                                                     \
        Shapes shapes{num_heads, num_kv_heads, head_dim, num_blocks, block_size, table_stride, query_row_stride}; \
        paged_attention(static_cast<const T*>(query), static_cast<const T*>(k_cache),                         \
                        static_cast<const T*>(v_cache), block_tables, context_lens, query_start_loc, num_reqs, \
                        shapes, scale, num_threads, static_cast<T*>(out));                     \
    }

SPYGLASS_PAGED_ATTENTION(spyglass_paged_attention_f32, float)
SPYGLASS_PAGED_ATTENTION(spyglass_paged_attention_bf16, uint16_t)
