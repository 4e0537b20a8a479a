// The TCP backend's messages: fixed-size structs sent as their bytes (see tcp_communicator.h on byte
// order). Internal.
#pragma once

#include <cstdint>

namespace qtrain::comm::tcp {

constexpr uint64_t kMagic = 0x31504354'4E525451ull;  // the bytes "QTRNTCP1" (little-endian)
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxText = 4096;  // run tokens and error messages are cut to this

// Peer -> rank 0, first message; followed by token_len bytes of run token.
struct Hello {
    uint64_t magic = kMagic;
    uint32_t version = kVersion;
    uint32_t world = 0;
    uint32_t rank = 0;
    uint32_t token_len = 0;
};
// Rank 0 -> peer: the answer to a hello, then "all ranks arrived"; followed by text_len bytes of message.
struct Reply {
    uint64_t magic = kMagic;
    uint32_t version = kVersion;
    uint32_t status = 0;  // kOk or kFailed (the text says why)
    uint32_t world = 0;
    uint32_t text_len = 0;
};
constexpr uint32_t kOk = 0, kFailed = 1;

// Peer -> rank 0 per collective (kind kCall, then the payload) or on abort (kind kAbort, then text_len
// bytes of reason). Rank 0 -> peer: kind kCall with `count` = payload bytes, or kAbort with a reason.
struct Frame {
    uint32_t kind = 0;
    uint32_t op = 0;
    uint32_t dtype = 0;
    int32_t root = 0;
    uint64_t count = 0;
    uint64_t seq = 0;
    uint32_t text_len = 0;
    uint32_t pad = 0;
};
constexpr uint32_t kCall = 1, kAbort = 2;
static_assert(sizeof(Hello) == 24 && sizeof(Reply) == 24 && sizeof(Frame) == 40, "wire structs have no padding");

}  // namespace qtrain::comm::tcp
