// Deterministic random numbers, identical on every platform and standard library (std::
// distributions are not), so a seed gives the same initialisation and data order everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace qtrain {

inline uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Stable 64-bit hash of a string (FNV-1a), e.g. to derive a per-tensor seed from its name.
inline uint64_t hash_string(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next_u64() { return splitmix64(state_); }
    // uniform in [0, 1) with 24 bits
    float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
    // uniform integer in [0, n)
    uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }
    // standard normal (Box-Muller in double precision, one value per call)
    float normal() {
        double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
        return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    uint64_t state() const { return state_; }
    void set_state(uint64_t s) { state_ = s; }

private:
    uint64_t state_;
};

}  // namespace qtrain
