// safetensors (huggingface.co/docs/safetensors): 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets:[begin,end]}, "__metadata__": {str: str}}, then the data.
// Reading maps the file (no copy); a model directory may hold one file or shards listed in
// model.safetensors.index.json. Writing streams tensors to a temporary file, then renames it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace qtrain {

struct SafeTensorInfo {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets into the data section
    uint64_t end = 0;
    std::string file;    // which file holds it
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
};

// safetensors dtype strings ("F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "I32", "U8").
std::string safetensors_dtype_name(DType t);
DType parse_safetensors_dtype(const std::string& s, const std::string& context);

// One memory-mapped .safetensors file. Validates the header fully on open: header length within
// the file, valid JSON, known dtypes, offsets inside the data section and consistent with
// dtype*shape, no overlaps. Errors name the file and the tensor.
class SafeTensorsFile {
public:
    explicit SafeTensorsFile(const std::string& path);
    ~SafeTensorsFile();
    SafeTensorsFile(const SafeTensorsFile&) = delete;
    SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
    const SafeTensorInfo* find(const std::string& name) const;
    const void* data(const SafeTensorInfo& info) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // Elements [first, first + count) of `info` (one of this file's tensors, flattened row-major) as
    // fp32, converted from any floating dtype straight into `out`, so reading part of a large tensor
    // holds nothing else in memory. A NaN or Inf is an error naming the file, the tensor and the
    // element, as SafeTensorsReader::read_finite_f32's.
    void read_finite_f32(const SafeTensorInfo& info, int64_t first, int64_t count, float* out) const;

private:
    std::string path_;
    MappedFile file_;
    std::size_t data_start_ = 0;
    std::vector<SafeTensorInfo> tensors_;
    std::map<std::string, std::string> metadata_;
};

// A set of safetensors files seen as one name -> tensor map (single file or sharded checkpoint).
class SafeTensorsReader {
public:
    explicit SafeTensorsReader(const std::vector<std::string>& files);
    // `dir`/model.safetensors, or the shards listed in `dir`/model.safetensors.index.json.
    static SafeTensorsReader open_dir(const std::string& dir);

    bool has(const std::string& name) const;
    // Throws "tensor 'x' not found in <files>" when absent.
    const SafeTensorInfo& info(const std::string& name) const;
    std::vector<std::string> names() const;
    // Host view of the mapped bytes (valid while the reader lives).
    Tensor view(const std::string& name) const;
    // Copies tensor `name` into `out` as fp32, converting from F32/BF16/F16/E4M3/E5M2. Throws naming
    // the tensor, the file, the expected and the actual shape if `expected_shape` differs.
    void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* out) const;
    // read_f32 for weights and optimizer state, which are finite in any healthy file: a NaN or Inf is
    // an error naming the file, the tensor and the element (it would otherwise poison the first step,
    // far from its cause).
    void read_finite_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* out) const;
    std::string describe() const;  // the file list, for error messages

private:
    std::vector<std::shared_ptr<SafeTensorsFile>> files_;
    std::map<std::string, std::pair<int, const SafeTensorInfo*>> index_;
};

// Streams tensors into a .safetensors file. Data pointers are not copied: they must stay valid
// until write() returns. write() goes to `path`.tmp.<pid> and renames, so a crash leaves no
// half-written file under `path`.
class SafeTensorsWriter {
public:
    // Raw bytes already in `dtype`.
    void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
    // fp32 source stored as `storage` (F32, BF16, F16), converted while writing.
    void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data, DType storage = DType::F32);
    // fp32 tensor produced only when write() reaches it (then freed), so a writer of a large model
    // holds one tensor at a time in host memory; `produce` must return shape's element count.
    void add_f32_deferred(const std::string& name, std::vector<int64_t> shape, std::function<std::vector<float>()> produce,
                          DType storage = DType::F32);
    void set_metadata(const std::string& key, const std::string& value);
    void write(const std::string& path) const;

private:
    struct Entry {
        std::string name;
        DType dtype;             // stored dtype
        std::vector<int64_t> shape;
        const void* data;
        bool from_f32;           // convert fp32 -> dtype while writing
        std::function<std::vector<float>()> produce = {};  // add_f32_deferred: the fp32 data, on demand
    };
    std::vector<Entry> entries_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace qtrain
