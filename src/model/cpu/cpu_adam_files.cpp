#include "model/cpu/cpu_adam_files.h"

#include "core/error.h"

namespace qtrain {

void add_adam_state(SafeTensorsWriter& weights, SafeTensorsWriter& optimizer, const std::vector<ParamSpec>& specs,
                    const std::vector<int64_t>& offsets, const float* p, const float* m, const float* v) {
    for (size_t i = 0; i < specs.size(); ++i) {
        const ParamSpec& s = specs[i];
        weights.add_f32(s.name, s.shape, p + offsets[i], DType::F32);
        optimizer.add_f32(s.name + ".exp_avg", s.shape, m + offsets[i], DType::F32);
        optimizer.add_f32(s.name + ".exp_avg_sq", s.shape, v + offsets[i], DType::F32);
    }
}

void read_adam_state(const SafeTensorsReader& weights, const SafeTensorsReader& optimizer,
                     const std::vector<ParamSpec>& specs, const std::vector<int64_t>& offsets, float* p, float* m,
                     float* v, const std::string& dir) {
    auto read = [&](const SafeTensorsReader& r, const std::string& name, const ParamSpec& s, float* out) {
        QT_CHECK(r.has(name), "checkpoint '", dir, "': tensor '", name, "' is missing from ", r.describe());
        r.read_finite_f32(name, s.shape, out);
    };
    for (size_t i = 0; i < specs.size(); ++i) {
        const ParamSpec& s = specs[i];
        read(weights, s.name, s, p + offsets[i]);
        read(optimizer, s.name + ".exp_avg", s, m + offsets[i]);
        read(optimizer, s.name + ".exp_avg_sq", s, v + offsets[i]);
    }
}

}  // namespace qtrain
