// Element conversions shared by the CPU kernels: every kernel computes in float32 and stores
// in the tensor's dtype (float32, or bfloat16 held as uint16_t, rounded to nearest even as torch does).
#pragma once

#include <cstdint>
#include <cstring>

namespace spyglass {

inline float to_float(float x) { return x; }

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
