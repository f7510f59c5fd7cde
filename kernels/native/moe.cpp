// Grouped expert MLPs of a mixture-of-experts layer: out[t] = sum_k w[t, k] * down_e(act(gate_e x_t) * up_e x_t)
// over each token's top-k experts e = ids[t, k].
//
// Contract: spyglass.kernels.torch_moe.fused_experts (the Python loop over experts it is tested against).
// The caller sorts the (token, k) pairs by expert once (`sorted_pairs`, `expert_offsets`); the kernel then
// runs three parallel phases over work items, never a loop over experts on the Python side:
//   1. gate/up: items (expert, tile of intermediate columns): h[pair] = act(x[token] . gate) * (x[token] . up)
//   2. down:    items (expert, tile of hidden columns):       y[pair] = h[pair] . down
//   3. combine: items (token):                                out[t]  = sum_k w[t, k] * y[t * top_k + k]
// A work item walks all of its expert's rows against one tile of weight rows, so the tile is read from
// memory once per step and stays in cache. Everything accumulates in float32; weights are float32 or
// bfloat16 (widened in registers), and the result is rounded to the output dtype once.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "scalar.h"

namespace {

using spyglass::store;
using spyglass::to_float;

constexpr int kXRows = 4;      // activation rows per microkernel call
constexpr int kWRows = 3;      // weight rows per microkernel call (4 x 3 accumulators fill 12 of 16 ymm registers)
constexpr int64_t kTile = 48;  // weight rows per work item

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

// out[i * WR + c] = x[i] . w[c] over k values, for XR float32 rows and WR weight rows.
template <typename T, int XR, int WR>
void dots(const float* const* x, const T* const* w, int64_t k, float* out) {
    int64_t j = 0;
    float acc[XR][WR] = {};
#if defined(__AVX2__) && defined(__FMA__)
    __m256 vacc[XR][WR];
    for (int i = 0; i < XR; ++i) {
        for (int c = 0; c < WR; ++c) vacc[i][c] = _mm256_setzero_ps();
    }
    for (; j + 8 <= k; j += 8) {
        __m256 wv[WR];
        for (int c = 0; c < WR; ++c) wv[c] = load8(w[c] + j);
        for (int i = 0; i < XR; ++i) {
            const __m256 xv = _mm256_loadu_ps(x[i] + j);
            for (int c = 0; c < WR; ++c) vacc[i][c] = _mm256_fmadd_ps(xv, wv[c], vacc[i][c]);
        }
    }
    for (int i = 0; i < XR; ++i) {
        for (int c = 0; c < WR; ++c) acc[i][c] = horizontal_sum(vacc[i][c]);
    }
#endif
    for (; j < k; ++j) {
        for (int i = 0; i < XR; ++i) {
            for (int c = 0; c < WR; ++c) acc[i][c] += x[i][j] * to_float(w[c][j]);
        }
    }
    for (int i = 0; i < XR; ++i) {
        for (int c = 0; c < WR; ++c) out[i * WR + c] = acc[i][c];
    }
}

template <typename T, int XR>
void dots_rows(const float* const* x, const T* const* w, int num_w, int64_t k, float* out) {
    if (num_w == 3) dots<T, XR, 3>(x, w, k, out);
    else if (num_w == 2) dots<T, XR, 2>(x, w, k, out);
    else dots<T, XR, 1>(x, w, k, out);
}

// The microkernel for num_x <= kXRows activation rows and num_w <= kWRows weight rows; out is [num_x, num_w].
template <typename T>
void dot_block(const float* const* x, int num_x, const T* const* w, int num_w, int64_t k, float* out) {
    switch (num_x) {
        case 4: dots_rows<T, 4>(x, w, num_w, k, out); break;
        case 3: dots_rows<T, 3>(x, w, num_w, k, out); break;
        case 2: dots_rows<T, 2>(x, w, num_w, k, out); break;
        default: dots_rows<T, 1>(x, w, num_w, k, out); break;
    }
}

inline float activate(float g, int64_t activation) {
    if (activation == 0) return g / (1.f + std::exp(-g));  // silu
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // gelu, tanh approximation
    return 0.5f * g * (1.f + std::tanh(inner));
}

struct WorkItem {
    int64_t expert, first_column;
};

// Every (expert with rows, tile of `columns` weight rows) pair.
std::vector<WorkItem> work_items(const int64_t* expert_offsets, int64_t num_experts, int64_t columns) {
    std::vector<WorkItem> items;
    for (int64_t e = 0; e < num_experts; ++e) {
        if (expert_offsets[e + 1] == expert_offsets[e]) continue;
        for (int64_t c = 0; c < columns; c += kTile) items.push_back({e, c});
    }
    return items;
}

// Rows [begin, end) of `rows` (each k floats) times weight rows [first, last) of `weight`, calling
// emit(row index, first weight row, values [num_x][num_w]) per microkernel block.
template <typename T, typename Emit>
void tile_product(const float* rows, int64_t begin, int64_t end, const T* weight, int64_t first, int64_t last,
                  int64_t k, Emit emit) {
    float block[kXRows * kWRows];
    for (int64_t r = begin; r < end; r += kXRows) {
        const int num_x = static_cast<int>(std::min<int64_t>(kXRows, end - r));
        const float* x[kXRows];
        for (int i = 0; i < num_x; ++i) x[i] = rows + (r + i) * k;
        for (int64_t n = first; n < last; n += kWRows) {
            const int num_w = static_cast<int>(std::min<int64_t>(kWRows, last - n));
            const T* w[kWRows];
            for (int c = 0; c < num_w; ++c) w[c] = weight + (n + c) * k;
            dot_block<T>(x, num_x, w, num_w, k, block);
            emit(r, num_x, n, num_w, block);
        }
    }
}

template <typename T>
void fused_experts(const T* x, int64_t x_stride, const T* w13, const T* w2, const int64_t* sorted_pairs,
                   const int64_t* expert_offsets, const float* pair_weights, int64_t num_tokens, int64_t top_k,
                   int64_t num_experts, int64_t hidden, int64_t inter, int64_t activation, int64_t num_threads,
                   T* out) {
    const int64_t num_pairs = num_tokens * top_k;
    // Rows in expert order: xs[s] is the input of sorted pair s, h[s] its activated gate * up.
    std::vector<float> xs(num_pairs * hidden), h(num_pairs * inter), y(num_pairs * hidden);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t s = 0; s < num_pairs; ++s) {
        const T* row = x + (sorted_pairs[s] / top_k) * x_stride;
        for (int64_t j = 0; j < hidden; ++j) xs[s * hidden + j] = to_float(row[j]);
    }

    const std::vector<WorkItem> up_items = work_items(expert_offsets, num_experts, inter);
#pragma omp parallel for num_threads(num_threads) schedule(dynamic)
    for (size_t i = 0; i < up_items.size(); ++i) {
        const int64_t e = up_items[i].expert, first = up_items[i].first_column;
        const int64_t last = std::min(first + kTile, inter);
        const T* gate = w13 + e * 2 * inter * hidden;
        const T* up = gate + inter * hidden;
        // Gate rows first (kept aside), then the matching up rows, which finish h.
        tile_product<T>(xs.data(), expert_offsets[e], expert_offsets[e + 1], gate, first, last, hidden,
                        [&](int64_t r, int num_x, int64_t n, int num_w, const float* block) {
                            for (int a = 0; a < num_x; ++a) {
                                for (int c = 0; c < num_w; ++c) h[(r + a) * inter + n + c] = block[a * num_w + c];
                            }
                        });
        tile_product<T>(xs.data(), expert_offsets[e], expert_offsets[e + 1], up, first, last, hidden,
                        [&](int64_t r, int num_x, int64_t n, int num_w, const float* block) {
                            for (int a = 0; a < num_x; ++a) {
                                for (int c = 0; c < num_w; ++c) {
                                    float& value = h[(r + a) * inter + n + c];
                                    value = activate(value, activation) * block[a * num_w + c];
                                }
                            }
                        });
    }

    const std::vector<WorkItem> down_items = work_items(expert_offsets, num_experts, hidden);
#pragma omp parallel for num_threads(num_threads) schedule(dynamic)
    for (size_t i = 0; i < down_items.size(); ++i) {
        const int64_t e = down_items[i].expert, first = down_items[i].first_column;
        const int64_t last = std::min(first + kTile, hidden);
        tile_product<T>(h.data(), expert_offsets[e], expert_offsets[e + 1], w2 + e * hidden * inter, first, last,
                        inter, [&](int64_t r, int num_x, int64_t n, int num_w, const float* block) {
                            for (int a = 0; a < num_x; ++a) {
                                float* row = y.data() + sorted_pairs[r + a] * hidden;  // back in pair order
                                for (int c = 0; c < num_w; ++c) row[n + c] = block[a * num_w + c];
                            }
                        });
    }

#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t j = 0; j < hidden; ++j) {
            float sum = 0.f;
            for (int64_t k = 0; k < top_k; ++k) sum += pair_weights[t * top_k + k] * y[(t * top_k + k) * hidden + j];
            store(out + t * hidden + j, sum);
        }
    }
}

}  // namespace

#define SPYGLASS_FUSED_EXPERTS(SUFFIX, T)                                                                          \
    extern "C" void spyglass_fused_experts_##SUFFIX(                                                                \
        const void* x, int64_t x_stride, const void* w13, const void* w2, const int64_t* sorted_pairs,              \
        const int64_t* expert_offsets, const float* pair_weights, int64_t num_tokens, int64_t top_k,                \
        int64_t num_experts, int64_t hidden, int64_t inter, int64_t activation, int64_t num_threads, void* out) {   \
        fused_experts<T>(static_cast<const T*>(x), x_stride, static_cast<const T*>(w13), static_cast<const T*>(w2), \
                         sorted_pairs, expert_offsets, pair_weights, num_tokens, top_k, num_experts, hidden, inter, \
                         activation, num_threads, static_cast<T*>(out));                                            \
    }

SPYGLASS_FUSED_EXPERTS(f32, float)
SPYGLASS_FUSED_EXPERTS(bf16, uint16_t)
