// The per-layer elementwise ops of a decoder step, fused for the CPU: residual add + RMSNorm,
// in-place rotary embedding, SiLU-and-multiply, and the KV store into the head-major paged cache.
//
// Contracts: spyglass.kernels.torch_norm_rope (norm, rope, silu_and_mul) and
// cpu_attention.store_kv, which are the references these are tested against. Each op is one pass
// over its rows, computing in float32; rows are split across OpenMP threads only when there are
// enough of them to pay for it.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "scalar.h"

namespace {

using spyglass::Half;
using spyglass::round_as;
using spyglass::store;
using spyglass::to_float;

// dst[0, n) = src[0, n): a copy within one type, or float32 rounded to float16 (8 at a time with F16C).
template <typename T>
void store_row(T* dst, const T* src, int64_t n) {
    std::memcpy(dst, src, n * sizeof(T));
}

void store_row(Half* dst, const float* src, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
    }
#endif
    for (; i < n; ++i) store(dst + i, src[i]);
}

// Below this many elements an op runs on the calling thread: a parallel region costs more.
constexpr int64_t kParallelElements = 1 << 16;

template <typename T>
void add_rms_norm(const T* x, int64_t x_stride, const T* residual, int64_t residual_stride, const T* weight,
                  float eps, int64_t num_tokens, int64_t width, int64_t num_threads, T* out, T* summed) {
#pragma omp parallel for num_threads(num_threads) if (num_tokens * width >= kParallelElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const T* xr = x + t * x_stride;
        const T* rr = residual ? residual + t * residual_stride : nullptr;
        T* sr = summed + t * width;
        // Normalise the sum as stored (rounded to T), as the unfused torch ops do.
        float squares = 0.f;
        if (rr) {
#pragma omp simd reduction(+ : squares)
            for (int64_t i = 0; i < width; ++i) {
                const float v = round_as<T>(to_float(xr[i]) + to_float(rr[i]));
                store(sr + i, v);
                squares += v * v;
            }
        } else {
#pragma omp simd reduction(+ : squares)
            for (int64_t i = 0; i < width; ++i) {
                const float v = to_float(xr[i]);
                sr[i] = xr[i];
                squares += v * v;
            }
        }
        const float inverse_rms = 1.f / std::sqrt(squares / static_cast<float>(width) + eps);
        T* outr = out + t * width;
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) store(outr + i, to_float(sr[i]) * inverse_rms * to_float(weight[i]));
    }
}

template <typename T>
void rotary_embedding(T* x, int64_t token_stride, int64_t head_stride, int64_t num_tokens, int64_t num_heads,
                      int64_t head_dim, const int64_t* positions, const T* cos, const T* sin, int64_t table_stride,
                      int64_t num_threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (num_tokens * num_heads * head_dim >= kParallelElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const T* c = cos + positions[t] * table_stride;
        const T* s = sin + positions[t] * table_stride;
        for (int64_t h = 0; h < num_heads; ++h) {
            T* lo = x + t * token_stride + h * head_stride;
            T* hi = lo + half;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                const float a = to_float(lo[i]), b = to_float(hi[i]);
                store(lo + i, a * to_float(c[i]) - b * to_float(s[i]));
                store(hi + i, b * to_float(c[half + i]) + a * to_float(s[half + i]));
            }
        }
    }
}

template <typename T>
void silu_and_mul(const T* gate_up, int64_t num_tokens, int64_t width, int64_t num_threads, T* out) {
#pragma omp parallel for num_threads(num_threads) if (num_tokens * width >= kParallelElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const T* gate = gate_up + t * 2 * width;
        const T* up = gate + width;
        T* o = out + t * width;
        // Round silu(gate) before the product, as the unfused torch ops do.
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) {
            const float g = to_float(gate[i]);
            store(o + i, round_as<T>(g / (1.f + std::exp(-g))) * to_float(up[i]));
        }
    }
}

// Keys and values of type T into caches of type C (the same type, or float32 into float16). A prompt's
// tokens are split across threads: its stores are often the first touch of the cache's pages.
template <typename T, typename C>
void store_kv(const T* key, const T* value, int64_t token_stride, const int64_t* slots, int64_t num_tokens,
              int64_t num_kv_heads, int64_t head_dim, int64_t slots_per_head, int64_t num_threads, C* k_cache,
              C* v_cache) {
#pragma omp parallel for num_threads(num_threads) if (num_tokens * num_kv_heads * head_dim >= kParallelElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
        if (slots[t] < 0) continue;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            const int64_t src = t * token_stride + h * head_dim, dst = (h * slots_per_head + slots[t]) * head_dim;
            store_row(k_cache + dst, key + src, head_dim);
            store_row(v_cache + dst, value + src, head_dim);
        }
    }
}

}  // namespace

#define SPYGLASS_LAYER_OPS(SUFFIX, T)                                                                           \
    extern "C" void spyglass_add_rms_norm_##SUFFIX(const void* x, int64_t x_stride, const void* residual,        \
                                                   int64_t residual_stride, const void* weight, float eps,       \
                                                   int64_t num_tokens, int64_t width, int64_t num_threads,      \
                                                   void* out, void* summed) {                                   \
        add_rms_norm(static_cast<const T*>(x), x_stride, static_cast<const T*>(residual), residual_stride,       \
                     static_cast<const T*>(weight), eps, num_tokens, width, num_threads, static_cast<T*>(out),  \
                     static_cast<T*>(summed));                                                                  \
    }                                                                                                           \
    extern "C" void spyglass_rotary_embedding_##SUFFIX(void* x, int64_t token_stride, int64_t head_stride,       \
                                                       int64_t num_tokens, int64_t num_heads, int64_t head_dim,  \
                                                       const int64_t* positions, const void* cos,               \
                                                       const void* sin, int64_t table_stride,                   \
                                                       int64_t num_threads) {                                   \
        rotary_embedding(static_cast<T*>(x), token_stride, head_stride, num_tokens, num_heads, head_dim,         \
                         positions, static_cast<const T*>(cos), static_cast<const T*>(sin), table_stride,       \
                         num_threads);                                                                          \
    }                                                                                                           \
    extern "C" void spyglass_silu_and_mul_##SUFFIX(const void* gate_up, int64_t num_tokens, int64_t width,       \
                                                   int64_t num_threads, void* out) {                            \
        silu_and_mul(static_cast<const T*>(gate_up), num_tokens, width, num_threads, static_cast<T*>(out));      \
    }                                                                                                           \
    SPYGLASS_STORE_KV(spyglass_store_kv_##SUFFIX, T, T)

// NAME stores keys and values of type T into caches of type C.
#define SPYGLASS_STORE_KV(NAME, T, C)                                                                          \
    extern "C" void NAME(const void* key, const void* value, int64_t token_stride, const int64_t* slots,       \
                         int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim, int64_t slots_per_head,   \
                         int64_t num_threads, void* k_cache, void* v_cache) {                                  \
        store_kv(static_cast<const T*>(key), static_cast<const T*>(value), token_stride, slots, num_tokens,     \
                 num_kv_heads, head_dim, slots_per_head, num_threads, static_cast<C*>(k_cache),                \
                 static_cast<C*>(v_cache));                                                                    \
    }

SPYGLASS_LAYER_OPS(f32, float)
SPYGLASS_LAYER_OPS(bf16, uint16_t)
SPYGLASS_STORE_KV(spyglass_store_kv_f32_f16kv, float, Half)
