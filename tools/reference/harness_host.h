// Host helpers of the CUDA harnesses and probes under tools/reference (flash_bidir_harness.cu,
// gdr_prepare_harness.cu and the GEMM probes): bf16 bits from f32 rounded to nearest even and back,
// and a seeded xorshift for their inputs.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

inline float from_bf16(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// xorshift64 (13, 7, 17); uniform() is the state's top 24 bits as a value in [-1, 1).
struct XorShift {
    uint64_t s;
    float uniform() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return (float)(s >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
};

// `v` uniform in [-a, a), bf16-representable, from a xorshift seeded with `seed`.
inline void fill_bf16(std::vector<uint16_t>& v, float a, uint64_t seed) {
    XorShift r{seed};
    for (auto& x : v) x = to_bf16(r.uniform() * a);
}
