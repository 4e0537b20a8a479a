// A read-only memory map of a whole file (model weights and token files can be many GB; mapping
// lets the OS page in only what is touched). Move-only; unmaps on destruction.
#pragma once

#include <cstdint>
#include <string>

namespace qtrain {

class MappedFile {
public:
    // Maps `path`; `what` (e.g. "token file") names the kind of file in error messages. An empty
    // file maps to data() == nullptr, size() == 0.
    MappedFile(const std::string& path, const char* what);
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const unsigned char* data() const { return static_cast<const unsigned char*>(map_); }
    uint64_t size() const { return size_; }

private:
    void* map_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace qtrain
