#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace qtrain {

MappedFile::MappedFile(const std::string& path, const char* what) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    QT_CHECK(fd >= 0, "cannot open ", what, " '", path, "': ", std::strerror(errno));
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        throw_error(cat("cannot stat '", path, "': ", std::strerror(err)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
        void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        int err = errno;
        ::close(fd);  // the mapping keeps the file alive
        QT_CHECK(m != MAP_FAILED, "cannot mmap '", path, "': ", std::strerror(err));
        map_ = m;
    } else {
        ::close(fd);
    }
}

MappedFile::~MappedFile() {
    if (map_) ::munmap(map_, size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        if (map_) ::munmap(map_, size_);
        map_ = std::exchange(other.map_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

}  // namespace qtrain
