// y[M, N] = x[M, K] @ W^T with W kept in GGUF blocks (Q4_0, Q4_1, Q8_0), dequantized in registers.
//
// Contract: spyglass.kernels.cpu_quant (tested against gguf's own dequantize and a float matmul).
// As in llama.cpp, the activations are quantized to int8 per 32-element block (scale d, and
// s = d * sum(q) for the weights' offset term), so each block's product is an int8 dot product:
// maddubs/madd on AVX2, dpbusd with AVX512-VNNI, a plain integer loop on the portable build.
// Per weight block, w = d * q + m with q unsigned (Q4_1: m stored; Q4_0: m = -8 d) or w = d * q with
// q signed (Q8_0). A thread unpacks a tile of weight rows to int8 once and reuses it for every
// activation row, so large M pays the unpacking once per tile, not per row.

#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kTileRows = 4;   // weight rows unpacked and multiplied together
constexpr int64_t kRowChunk = 64;  // activation rows per pass, so a tile's inputs stay in cache

enum QuantType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };

float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        exponent = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            --exponent;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

uint16_t load_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return h;
}

int64_t block_bytes(int64_t type) { return type == kQ4_0 ? 18 : type == kQ4_1 ? 20 : 34; }

// One weight row unpacked to int8 values q, a scale d and an offset m per block (m is 0 for Q8_0).
void unpack_row(const uint8_t* row, int64_t type, int64_t num_blocks, int8_t* q, float* d, float* m) {
    const int64_t stride = block_bytes(type);
    for (int64_t b = 0; b < num_blocks; ++b) {
        const uint8_t* block = row + b * stride;
        d[b] = half_to_float(load_half(block));
        int8_t* qb = q + b * kBlock;
        if (type == kQ8_0) {
            m[b] = 0.f;
            std::memcpy(qb, block + 2, kBlock);
            continue;
        }
        const uint8_t* nibbles = block + (type == kQ4_1 ? 4 : 2);
        m[b] = type == kQ4_1 ? half_to_float(load_half(block + 2)) : -8.f * d[b];
#if defined(__AVX2__)
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles));
        const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm256_and_si256(both, _mm256_set1_epi8(0x0F)));
#else
        for (int64_t j = 0; j < kBlock / 2; ++j) {
            qb[j] = static_cast<int8_t>(nibbles[j] & 0x0F);
            qb[j + kBlock / 2] = static_cast<int8_t>(nibbles[j] >> 4);
        }
#endif
    }
}

// One activation row to int8 per block: q = round(x / d) with d = max|x| / 127, s = d * sum(q).
void quantize_row(const float* x, int64_t num_blocks, int8_t* q, float* d, float* s) {
    for (int64_t b = 0; b < num_blocks; ++b) {
        const float* xb = x + b * kBlock;
        float amax = 0.f;
        for (int64_t j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
        const float scale = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int64_t j = 0; j < kBlock; ++j) {
            const int32_t v = static_cast<int32_t>(std::nearbyint(xb[j] * inverse));
            q[b * kBlock + j] = static_cast<int8_t>(v);
            sum += v;
        }
        d[b] = scale;
        s[b] = scale * static_cast<float>(sum);
    }
}

#if defined(__AVX2__)
// Eight int32 partial sums of one block's products; SIGNED_W: the weights are signed int8 (Q8_0).
template <bool SIGNED_W>
inline __m256i block_dot(__m256i w, __m256i x) {
    if (SIGNED_W) {  // maddubs multiplies unsigned by signed: move w's sign onto x
        x = _mm256_sign_epi8(x, w);
        w = _mm256_sign_epi8(w, w);
    }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

// out[i * kTileRows + r] = sum over blocks of wd[r][b] * xd[i][b] * dot(wq[r][b], xq[i][b]), for the
// tile's kTileRows unpacked weight rows and X_ROWS consecutive activation rows (each weight block
// loaded once for all of them). Rows past the weight matrix's end hold stale values; callers drop them.
template <bool SIGNED_W, int X_ROWS>
void tile_dots(const int8_t* wq, const float* wd, const int8_t* xq, const float* xd, int64_t num_blocks, float* out) {
    const int64_t k = num_blocks * kBlock;
#if defined(__AVX2__)
    __m256 acc[X_ROWS][kTileRows];
    for (int i = 0; i < X_ROWS; ++i) {
        for (int r = 0; r < kTileRows; ++r) acc[i][r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < num_blocks; ++b) {
        __m256i x[X_ROWS];
        for (int i = 0; i < X_ROWS; ++i) {
            x[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * k + b * kBlock));
        }
        for (int r = 0; r < kTileRows; ++r) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + r * k + b * kBlock));
            for (int i = 0; i < X_ROWS; ++i) {
                const __m256 scale = _mm256_set1_ps(wd[r * num_blocks + b] * xd[i * num_blocks + b]);
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot<SIGNED_W>(w, x[i])), scale, acc[i][r]);
            }
        }
    }
    for (int i = 0; i < X_ROWS; ++i) {
        for (int r = 0; r < kTileRows; ++r) out[i * kTileRows + r] = horizontal_sum(acc[i][r]);
    }
#else
    for (int i = 0; i < X_ROWS; ++i) {
        for (int r = 0; r < kTileRows; ++r) {
            float total = 0.f;
            for (int64_t b = 0; b < num_blocks; ++b) {
                int32_t dot = 0;
                for (int64_t j = 0; j < kBlock; ++j) {
                    dot += static_cast<int32_t>(wq[r * k + b * kBlock + j]) * xq[i * k + b * kBlock + j];
                }
                total += wd[r * num_blocks + b] * xd[i * num_blocks + b] * static_cast<float>(dot);
            }
            out[i * kTileRows + r] = total;
        }
    }
#endif
}

template <bool SIGNED_W>
void matmul(const float* x, const uint8_t* w, int64_t type, int64_t m_rows, int64_t n, int64_t k, int64_t num_threads,
            float* y) {
    const int64_t num_blocks = k / kBlock, row_bytes = num_blocks * block_bytes(type);
    const int64_t num_tiles = (n + kTileRows - 1) / kTileRows;
    std::vector<int8_t> xq(m_rows * k);
    std::vector<float> xd(m_rows * num_blocks), xs(m_rows * num_blocks);
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<int8_t> wq(kTileRows * k);
        std::vector<float> wd(kTileRows * num_blocks), wm(kTileRows * num_blocks);
        float dots[2 * kTileRows];
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m_rows; ++i) {
            quantize_row(x + i * k, num_blocks, &xq[i * k], &xd[i * num_blocks], &xs[i * num_blocks]);
        }
        for (int64_t chunk = 0; chunk < m_rows; chunk += kRowChunk) {
            const int64_t chunk_end = chunk + kRowChunk < m_rows ? chunk + kRowChunk : m_rows;
#pragma omp for schedule(static)
            for (int64_t tile = 0; tile < num_tiles; ++tile) {
                const int64_t first = tile * kTileRows, rows = n - first < kTileRows ? n - first : kTileRows;
                for (int64_t r = 0; r < rows; ++r) {
                    unpack_row(w + (first + r) * row_bytes, type, num_blocks, &wq[r * k], &wd[r * num_blocks],
                               &wm[r * num_blocks]);
                }
                for (int64_t i = chunk; i < chunk_end; i += 2) {
                    const bool pair = i + 1 < chunk_end;
                    if (pair) {
                        tile_dots<SIGNED_W, 2>(wq.data(), wd.data(), &xq[i * k], &xd[i * num_blocks], num_blocks, dots);
                    } else {
                        tile_dots<SIGNED_W, 1>(wq.data(), wd.data(), &xq[i * k], &xd[i * num_blocks], num_blocks, dots);
                    }
                    for (int64_t row = i; row < i + (pair ? 2 : 1); ++row) {
                        const float* s = &xs[row * num_blocks];
                        for (int64_t r = 0; r < rows; ++r) {
                            float offset = 0.f;  // the weights' per-block offsets times the activation block sums
                            if (!SIGNED_W) {
                                for (int64_t b = 0; b < num_blocks; ++b) offset += wm[r * num_blocks + b] * s[b];
                            }
                            y[row * n + first + r] = dots[(row - i) * kTileRows + r] + offset;
                        }
                    }
                }
            }
        }
    }
}

}  // namespace

extern "C" {

// y[m_rows, n] (float32) = x[m_rows, k] (float32, contiguous) @ W^T, W: n rows of k / 32 blocks of `type`.
void spyglass_quant_matmul(const float* x, const uint8_t* w, int64_t type, int64_t m_rows, int64_t n, int64_t k,
                           int64_t num_threads, float* y) {
    if (type == kQ8_0) {
        matmul<true>(x, w, type, m_rows, n, k, num_threads, y);
    } else {
        matmul<false>(x, w, type, m_rows, n, k, num_threads, y);
    }
}

// out[i, :] (float32) = the dequantized weight row row_ids[i] (every row in order when row_ids is null).
void spyglass_dequantize_rows(const uint8_t* w, int64_t type, int64_t k, const int64_t* row_ids, int64_t num_rows,
                              int64_t num_threads, float* out) {
    const int64_t num_blocks = k / kBlock, row_bytes = num_blocks * block_bytes(type);
#pragma omp parallel num_threads(num_threads) if (num_rows * k >= (1 << 16))
    {
        std::vector<int8_t> q(k);
        std::vector<float> d(num_blocks), m(num_blocks);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < num_rows; ++i) {
            unpack_row(w + (row_ids ? row_ids[i] : i) * row_bytes, type, num_blocks, q.data(), d.data(), m.data());
            for (int64_t j = 0; j < k; ++j) out[i * k + j] = d[j / kBlock] * q[j] + m[j / kBlock];
        }
    }
}

}  // extern "C"
