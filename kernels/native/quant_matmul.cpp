// y[M, N] = x[M, K] @ W^T with W kept in GGUF blocks (Q4_0, Q4_1, Q8_0), dequantized in registers.
//
// Contract: spyglass.kernels.cpu_quant (tested against gguf's own dequantize and a float matmul).
// As in llama.cpp, the activations are quantized to int8 per 32-element block (scale d, and
// s = d * sum(q) for the weights' offset term), so each block's product is an int8 dot product:
// maddubs/madd on AVX2, dpbusd with AVX512-VNNI, a plain integer loop on the portable build.
// Per weight block, w = d * q + m with q unsigned (Q4_1: m stored; Q4_0: m = -8 d) or w = d * q with
// q signed (Q8_0). The weights are first repacked (once, at load) so that 8 rows' blocks are
// interleaved: one vector instruction then makes 8 rows' products, and each block's nibbles are
// unpacked once for several activation rows.
//
// In AVX-512 builds whose compiler knows AMX (GCC 11+, clang 12+; the AMX functions carry their own
// target attribute, so no build needs an AMX flag) and switched on by `spyglass_quant_use_amx` on a
// CPU that has it, full tiles of 16 activation rows by 16 weight rows multiply each block in one
// tile instruction (the packed layout's 4-value interleave is AMX's weight-tile layout); the scaling
// that follows is the vector path's, operation for operation, so both give the same bits.

// GCC spills group_dots' accumulators to the stack unless its first scheduling pass (off by
// default on x86) orders the unrolled block loop for register pressure: 1.2-1.3x faster.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("schedule-insns", "sched-pressure")
#endif

#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>

#include "scalar.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__linux__) && (__has_include(<amxtileintrin.h>) || __has_include(<amxintrin.h>))
#define SPYGLASS_AMX 1
#define SPYGLASS_AMX_TARGET __attribute__((target("amx-tile,amx-int8")))
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kRowChunk = 64;  // activation rows per pass, so their int8 copies stay in cache

enum QuantType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };

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
        d[b] = spyglass::half_bits_to_float(load_half(block));
        int8_t* qb = q + b * kBlock;
        if (type == kQ8_0) {
            m[b] = 0.f;
            std::memcpy(qb, block + 2, kBlock);
            continue;
        }
        const uint8_t* nibbles = block + (type == kQ4_1 ? 4 : 2);
        m[b] = type == kQ4_1 ? spyglass::half_bits_to_float(load_half(block + 2)) : -8.f * d[b];
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

// The packed layout the matmul reads (`spyglass_quant_pack` writes it from GGUF rows): weight rows in
// groups of kGroup (rows past n are zero), each group's k / 32 blocks in order, each block holding
// the group's scales d (float16 x 8), Q4_1's offsets m (float16 x 8), then the values interleaved
// so that one 32-byte vector holds 4 consecutive values of each of the 8 rows (bytes 4r..4r+3 are
// row r's): Q8_0 as 8 such vectors (vector j: values 4j..4j+3), Q4_0/Q4_1 as 4 vectors of nibbles
// (vector c: values 8c..8c+3 in the low nibbles, 8c+4..8c+7 in the high ones). A broadcast of 4
// activation values times one vector gives 8 rows' partial dot products at once, lane r = row r.
constexpr int64_t kGroup = 8;
constexpr int64_t kXRows = 3;  // activation rows per pass over a group's block (4 spilled: 8-15% slower)

int64_t packed_block_bytes(int64_t type) { return type == kQ4_0 ? 144 : type == kQ4_1 ? 160 : 272; }
int64_t values_offset(int64_t type) { return type == kQ4_1 ? 32 : 16; }

// Value v (0..31) of one GGUF block's quantized values, as stored (unsigned for Q4, signed for Q8_0).
int32_t gguf_value(const uint8_t* block, int64_t type, int64_t v) {
    if (type == kQ8_0) return static_cast<int8_t>(block[2 + v]);
    const uint8_t* nibbles = block + (type == kQ4_1 ? 4 : 2);
    return v < 16 ? nibbles[v] & 0x0F : nibbles[v - 16] >> 4;
}

void pack_block(const uint8_t* w, int64_t type, int64_t n, int64_t row_bytes, int64_t group, int64_t b, uint8_t* dst) {
    std::memset(dst, 0, packed_block_bytes(type));
    uint8_t* values = dst + values_offset(type);
    for (int64_t r = 0; r < kGroup && group * kGroup + r < n; ++r) {
        const uint8_t* block = w + (group * kGroup + r) * row_bytes + b * block_bytes(type);
        std::memcpy(dst + 2 * r, block, 2);                               // d
        if (type == kQ4_1) std::memcpy(dst + 16 + 2 * r, block + 2, 2);  // m
        for (int64_t t = 0; t < 4; ++t) {
            if (type == kQ8_0) {
                for (int64_t j = 0; j < 8; ++j) values[j * 32 + 4 * r + t] = static_cast<uint8_t>(gguf_value(block, type, 4 * j + t));
            } else {
                for (int64_t c = 0; c < 4; ++c) {
                    values[c * 32 + 4 * r + t] =
                        static_cast<uint8_t>(gguf_value(block, type, 8 * c + t) | gguf_value(block, type, 8 * c + 4 + t) << 4);
                }
            }
        }
    }
}

// Value v of row r in a packed block's values.
int32_t packed_value(const uint8_t* values, int64_t type, int64_t r, int64_t v) {
    if (type == kQ8_0) return static_cast<int8_t>(values[(v / 4) * 32 + 4 * r + v % 4]);
    const uint8_t byte = values[(v / 8) * 32 + 4 * r + v % 4];
    return v % 8 < 4 ? byte & 0x0F : byte >> 4;
}

#if defined(__AVX2__)
inline __m256i broadcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

// dot + the 4-value products of unsigned w and signed x, per 32-bit lane.
inline __m256i dot_accumulate(__m256i dot, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(dot, w, x);
#else
    return _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}
#endif

// out[i * kGroup + r] = row r of the group times activation row i, for X_ROWS rows of xq (row stride k).
template <int64_t TYPE, int X_ROWS>
void group_dots(const uint8_t* group, int64_t num_blocks, const int8_t* xq, const float* xd, const float* xs, int64_t k,
                float* out) {
    const int64_t stride = packed_block_bytes(TYPE);
#if defined(__AVX2__)
    // One named accumulator per activation row, not an array: GCC kept __m256 arrays on the stack.
    static_assert(X_ROWS >= 1 && X_ROWS <= 3, "three activation rows at most: more spill registers");
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0;
    __m256i dot0, dot1, dot2;
    // f(dot, acc, i) for each of the X_ROWS activation rows.
    auto each_row = [&](auto&& f) {
        f(dot0, acc0, 0);
        if constexpr (X_ROWS > 1) f(dot1, acc1, 1);
        if constexpr (X_ROWS > 2) f(dot2, acc2, 2);
    };
    for (int64_t b = 0; b < num_blocks; ++b) {
        const uint8_t* block = group + b * stride;
        const uint8_t* values = block + values_offset(TYPE);
        const int8_t* x = xq + b * kBlock;  // row i's block at x + i * k
        dot0 = dot1 = dot2 = _mm256_setzero_si256();
        if constexpr (TYPE == kQ8_0) {  // signed weights: maddubs multiplies unsigned by signed, so move w's sign onto x
            for (int64_t j = 0; j < 8; ++j) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 32 * j));
                const __m256i magnitude = _mm256_sign_epi8(w, w);
                each_row([&](__m256i& dot, __m256&, int i) {
                    dot = dot_accumulate(dot, magnitude, _mm256_sign_epi8(broadcast4(x + i * k + 4 * j), w));
                });
            }
        } else {
            const __m256i low = _mm256_set1_epi8(0x0F);
            for (int64_t c = 0; c < 4; ++c) {
                const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 32 * c));
                const __m256i w0 = _mm256_and_si256(packed, low), w1 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                each_row([&](__m256i& dot, __m256&, int i) {
                    const int8_t* xc = x + i * k + 8 * c;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
                    dot = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(dot, w0, broadcast4(xc)), w1, broadcast4(xc + 4));
#else
                    // 4-bit weights (at most 15) times int8 (at most 127 in size): the 16 products each
                    // int16 lane collects over a block stay below 2^15, so lanes sum in int16.
                    dot = _mm256_add_epi16(dot, _mm256_maddubs_epi16(w0, broadcast4(xc)));
                    dot = _mm256_add_epi16(dot, _mm256_maddubs_epi16(w1, broadcast4(xc + 4)));
#endif
                });
            }
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
            each_row([&](__m256i& dot, __m256&, int) { dot = _mm256_madd_epi16(dot, _mm256_set1_epi16(1)); });
#endif
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
        const __m256 m = TYPE == kQ4_1 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)))
                                       : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
        each_row([&](__m256i& dot, __m256& acc, int i) {
            const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(xd[i * num_blocks + b]));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc);
            if (TYPE != kQ8_0) acc = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[i * num_blocks + b]), acc);
        });
    }
    each_row([&](__m256i&, __m256& acc, int i) { _mm256_storeu_ps(out + i * kGroup, acc); });
#else
    for (int64_t i = 0; i < X_ROWS; ++i) {
        for (int64_t r = 0; r < kGroup; ++r) {
            float total = 0.f;
            for (int64_t b = 0; b < num_blocks; ++b) {
                const uint8_t* block = group + b * stride;
                const float d = spyglass::half_bits_to_float(load_half(block + 2 * r));
                const float m = TYPE == kQ4_1 ? spyglass::half_bits_to_float(load_half(block + 16 + 2 * r)) : -8.f * d;
                const int8_t* x = xq + i * k + b * kBlock;
                int32_t dot = 0;
                for (int64_t v = 0; v < kBlock; ++v) dot += packed_value(block + values_offset(TYPE), TYPE, r, v) * x[v];
                total += d * xd[i * num_blocks + b] * static_cast<float>(dot);
                if (TYPE != kQ8_0) total += m * xs[i * num_blocks + b];
            }
            out[i * kGroup + r] = total;
        }
    }
#endif
}

bool use_amx = false;  // set by spyglass_quant_use_amx

constexpr int64_t kTileRows = 16;  // activation rows, and weight rows (two groups), of one AMX tile

#if defined(SPYGLASS_AMX)
struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

SPYGLASS_AMX_TARGET void configure_tiles() {
    TileConfig config{};
    config.palette = 1;
    config.rows[0] = kTileRows, config.colsb[0] = kTileRows * 4;  // C: int32 per activation row x weight row
    config.rows[1] = kTileRows, config.colsb[1] = kBlock;         // A: one block of 16 activation rows
    config.rows[2] = kBlock / 4, config.colsb[2] = kTileRows * 4;  // B: 4 values of 16 weight rows per row
    // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only, and the stores past them
    // were dropped (ldtilecfg then faults): make them all happen first.
    __asm__ __volatile__("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
}

// Block b of weight groups g and g + 1 as a B tile: row q holds values 4q..4q+3 of each weight row,
// which is what the packed layout's vectors hold (Q4: two rows of nibbles per vector).
template <int64_t TYPE>
SPYGLASS_AMX_TARGET void weight_tile(const uint8_t* group0, const uint8_t* group1, int64_t b, uint8_t* tile) {
    const int64_t stride = packed_block_bytes(TYPE);
    const uint8_t* values[2] = {group0 + b * stride + values_offset(TYPE), group1 + b * stride + values_offset(TYPE)};
    for (int half = 0; half < 2; ++half) {
        for (int64_t q = 0; q < kBlock / 4; ++q) {
            uint8_t* row = tile + q * kTileRows * 4 + half * kGroup * 4;
            if constexpr (TYPE == kQ8_0) {
                std::memcpy(row, values[half] + 32 * q, 32);
            } else {
                const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values[half] + 32 * (q / 2)));
                const __m256i nibbles = q % 2 ? _mm256_srli_epi16(packed, 4) : packed;
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), _mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F)));
            }
        }
    }
}

// y's rows [0, m_tiles * 16) and weight rows [32 p, 32 p + 16) for pair p of groups, on AMX. The
// scaling per block is group_dots' (scale = d * xd, then the offset), in the same order.
template <int64_t TYPE>
SPYGLASS_AMX_TARGET void amx_tiles(const uint8_t* packed, int64_t group_bytes, int64_t num_blocks, int64_t pair, int64_t m_tiles, const int8_t* xq,
               const float* xd, const float* xs, int64_t n, int64_t k, std::vector<uint8_t>& tiles, float* y) {
    const int64_t stride = packed_block_bytes(TYPE), g = 2 * pair;
    const uint8_t *group0 = packed + g * group_bytes, *group1 = group0 + group_bytes;
    tiles.resize(num_blocks * kBlock * kTileRows);
    for (int64_t b = 0; b < num_blocks; ++b) weight_tile<TYPE>(group0, group1, b, &tiles[b * kBlock * kTileRows]);
    const int64_t columns = n - g * kGroup < kTileRows ? n - g * kGroup : kTileRows;
    alignas(64) int32_t dots[kTileRows * kTileRows];
    for (int64_t tile = 0; tile < m_tiles; ++tile) {
        const int64_t i0 = tile * kTileRows;
        __m512 acc[kTileRows];
        for (auto& a : acc) a = _mm512_setzero_ps();
        for (int64_t b = 0; b < num_blocks; ++b) {
            _tile_zero(0);
            _tile_loadd(1, xq + i0 * k + b * kBlock, k);
            _tile_loadd(2, &tiles[b * kBlock * kTileRows], kTileRows * 4);
            if constexpr (TYPE == kQ8_0) {
                _tile_dpbssd(0, 1, 2);
            } else {
                _tile_dpbsud(0, 1, 2);
            }
            _tile_stored(0, dots, kTileRows * 4);
            const uint8_t *block0 = group0 + b * stride, *block1 = group1 + b * stride;
            const __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block0)))),
                                                _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block1))), 1);
            __m512 m = _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
            if constexpr (TYPE == kQ4_1) {
                m = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block0 + 16)))),
                                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block1 + 16))), 1);
            }
            for (int64_t i = 0; i < kTileRows; ++i) {
                const int64_t row = (i0 + i) * num_blocks + b;
                const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(dots + i * kTileRows));
                acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(xd[row])), acc[i]);
                if (TYPE != kQ8_0) acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[row]), acc[i]);
            }
        }
        const __mmask16 valid = static_cast<__mmask16>((1u << columns) - 1);
        for (int64_t i = 0; i < kTileRows; ++i) _mm512_mask_storeu_ps(y + (i0 + i) * n + g * kGroup, valid, acc[i]);
    }
}

SPYGLASS_AMX_TARGET void release_tiles() { _tile_release(); }
#endif

template <int64_t TYPE>
void matmul(const float* x, const uint8_t* packed, int64_t m_rows, int64_t n, int64_t k, int64_t num_threads, float* y) {
    const int64_t num_blocks = k / kBlock, num_groups = (n + kGroup - 1) / kGroup;
    const int64_t group_bytes = num_blocks * packed_block_bytes(TYPE);
    std::vector<int8_t> xq(m_rows * k);
    std::vector<float> xd(m_rows * num_blocks), xs(m_rows * num_blocks);
    // AMX takes whole tiles: 16-row blocks of activations times pairs of weight groups.
    const int64_t m_tiles = use_amx ? m_rows / kTileRows : 0, num_pairs = m_tiles ? num_groups / 2 : 0;
#pragma omp parallel num_threads(num_threads)
    {
        float dots[kXRows * kGroup];
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m_rows; ++i) {
            quantize_row(x + i * k, num_blocks, &xq[i * k], &xd[i * num_blocks], &xs[i * num_blocks]);
        }
#if defined(SPYGLASS_AMX)
        if (num_pairs) {
            configure_tiles();
            std::vector<uint8_t> tiles;
#pragma omp for schedule(static)
            for (int64_t pair = 0; pair < num_pairs; ++pair) {
                amx_tiles<TYPE>(packed, group_bytes, num_blocks, pair, m_tiles, xq.data(), xd.data(), xs.data(), n, k, tiles, y);
            }
            release_tiles();
        }
#endif
        // The rest on the vector path: rows past the tiles, and all rows of a group without a pair.
        const int64_t first_row = m_tiles * kTileRows;
        for (int64_t chunk = 0; chunk < m_rows; chunk += kRowChunk) {
            const int64_t chunk_end = chunk + kRowChunk < m_rows ? chunk + kRowChunk : m_rows;
#pragma omp for schedule(static)
            for (int64_t g = 0; g < num_groups; ++g) {
                if (g < 2 * num_pairs && chunk_end <= first_row) continue;
                const uint8_t* group = packed + g * group_bytes;
                const int64_t rows = n - g * kGroup < kGroup ? n - g * kGroup : kGroup;
                for (int64_t i = g < 2 * num_pairs && chunk < first_row ? first_row : chunk; i < chunk_end; i += kXRows) {
                    const int64_t count = chunk_end - i < kXRows ? chunk_end - i : kXRows;
                    const int8_t* xi = &xq[i * k];
                    const float *di = &xd[i * num_blocks], *si = &xs[i * num_blocks];
                    switch (count) {
                        case 3: group_dots<TYPE, 3>(group, num_blocks, xi, di, si, k, dots); break;
                        case 2: group_dots<TYPE, 2>(group, num_blocks, xi, di, si, k, dots); break;
                        default: group_dots<TYPE, 1>(group, num_blocks, xi, di, si, k, dots); break;
                    }
                    for (int64_t row = 0; row < count; ++row) {
                        std::memcpy(y + (i + row) * n + g * kGroup, dots + row * kGroup, rows * sizeof(float));
                    }
                }
            }
        }
    }
}

}  // namespace

extern "C" {

// Multiply whole tiles on AMX from now on when ``wanted`` and this build and CPU allow it (the
// process asks Linux for the tile state once); returns whether AMX is in use.
int spyglass_quant_use_amx(int wanted) {
#if defined(SPYGLASS_AMX)
    static const bool permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    use_amx = wanted && permitted;
#else
    (void)wanted;
    use_amx = false;
#endif
    return use_amx;
}

// Bytes `spyglass_quant_pack` writes for an [n, k] matrix of `type`.
int64_t spyglass_quant_packed_bytes(int64_t type, int64_t n, int64_t k) {
    return (n + kGroup - 1) / kGroup * (k / kBlock) * packed_block_bytes(type);
}

// The packed layout (see above) of W: n GGUF rows of k / 32 blocks of `type`.
void spyglass_quant_pack(const uint8_t* w, int64_t type, int64_t n, int64_t k, int64_t num_threads, uint8_t* out) {
    const int64_t num_blocks = k / kBlock, row_bytes = num_blocks * block_bytes(type);
    const int64_t num_groups = (n + kGroup - 1) / kGroup;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t g = 0; g < num_groups; ++g) {
        for (int64_t b = 0; b < num_blocks; ++b) {
            pack_block(w, type, n, row_bytes, g, b, out + (g * num_blocks + b) * packed_block_bytes(type));
        }
    }
}

// y[m_rows, n] (float32) = x[m_rows, k] (float32, contiguous) @ W^T, W packed by `spyglass_quant_pack`.
void spyglass_quant_matmul(const float* x, const uint8_t* packed, int64_t type, int64_t m_rows, int64_t n, int64_t k,
                           int64_t num_threads, float* y) {
    if (type == kQ8_0) {
        matmul<kQ8_0>(x, packed, m_rows, n, k, num_threads, y);
    } else if (type == kQ4_1) {
        matmul<kQ4_1>(x, packed, m_rows, n, k, num_threads, y);
    } else {
        matmul<kQ4_0>(x, packed, m_rows, n, k, num_threads, y);
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
