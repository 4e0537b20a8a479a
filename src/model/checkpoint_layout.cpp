#include "model/checkpoint_layout.h"

namespace qtrain {

FlatLayout flat_layout_of(const GpuParamLayout& layout) {
    FlatLayout out;
    out.total = layout.total;
    for (std::size_t i = 0; i < layout.specs.size(); ++i)
        out.tensors.push_back({layout.specs[i].name, layout.offsets[i], layout.specs[i].shape});
    return out;
}

FlatLayout gpu_checkpoint_layout(const ModelConfig& config) { return flat_layout_of(make_gpu_layout(config)); }

}  // namespace qtrain
