// File checksums for checkpoints: XXH3-64 (xxHash), streamed over the file in large chunks, so a
// 100 GB checkpoint is hashed at disk speed without being held in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qtrain {

struct FileChecksum {
    uint64_t bytes = 0;  // file size
    uint64_t xxh3 = 0;   // XXH3_64bits over the whole file (seed 0), as `xxhsum -H3` prints it
};

// Hashes the whole file; throws an Error naming `path` when it cannot be opened or read.
FileChecksum checksum_file(const std::string& path);
// XXH3-64 of a byte string in memory (the same function as the file checksum): fingerprints of small
// descriptions, e.g. the flat layout a checkpoint's blocks were written in (io/flat_layout.h).
uint64_t checksum_bytes(const void* data, std::size_t size);
// The 16 lowercase hex digits `xxhsum -H3` prints, and back (throws naming `what` on other text).
std::string checksum_hex(uint64_t value);
uint64_t parse_checksum_hex(const std::string& text, const std::string& what);

}  // namespace qtrain
