// Element conversions shared by the CPU kernels: every kernel computes in float32 and stores
// in the tensor's dtype (float32, bfloat16 held as uint16_t, or float16 held as `Half`), rounded to
// nearest even as torch does.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace spyglass {

// IEEE half precision (float16), as its bits: a type of its own so that it never passes for bfloat16.
struct Half {
    uint16_t bits;
};

inline float half_bits_to_float(uint16_t h) {
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

// x rounded to the nearest float16 (ties to even; too large: infinity), as its bits.
inline uint16_t float_to_half_bits(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
    if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // 65520 and up round to infinity
    uint32_t bits, rest, half_way;
    if (x >= 0x38800000u) {  // normal: rebias the exponent, keep 10 mantissa bits
        bits = (x - 0x38000000u) >> 13;
        rest = x & 0x1FFFu;
        half_way = 0x1000u;
    } else if (x >= 0x33000000u) {  // subnormal: units of 2^-24
        const uint32_t shift = 126 - (x >> 23), mantissa = (x & 0x7FFFFFu) | 0x800000u;
        bits = mantissa >> shift;
        rest = mantissa & ((1u << shift) - 1);
        half_way = 1u << (shift - 1);
    } else {  // below half of the smallest subnormal
        return static_cast<uint16_t>(sign);
    }
    if (rest > half_way || (rest == half_way && (bits & 1u))) ++bits;
    return static_cast<uint16_t>(sign | bits);
#endif
}

inline float to_float(float x) { return x; }

inline float to_float(Half x) { return half_bits_to_float(x.bits); }

inline void store(Half* dst, float x) { dst->bits = float_to_half_bits(x); }

inline float to_float(uint16_t x) {
    uint32_t bits = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline void store(float* dst, float x) { *dst = x; }

inline void store(uint16_t* dst, float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    *dst = static_cast<uint16_t>(bits >> 16);
}

// x rounded to T's precision, kept as float: what storing to T and loading back gives (vectorisable).
template <typename T>
inline float round_as(float x);

template <>
inline float round_as<float>(float x) {
    return x;
}

template <>
inline float round_as<uint16_t>(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

}  // namespace spyglass
