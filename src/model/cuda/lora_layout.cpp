#include "model/cuda/lora_layout.h"

#include <algorithm>

namespace qtrain {

LoraLayout make_lora_layout(const ModelConfig& cfg, const LoraOptions& lora) {
    LoraLayout y;
    if (!lora.enabled()) return y;
    y.rank = lora.rank;
    y.specs = lora_parameters(cfg, lora);
    y.first_trained = y.specs.size();
    for (ParamSpec& s : lora_train_also_parameters(cfg, lora)) {
        y.trained_base.push_back(s.name.substr(std::char_traits<char>::length(kPeftPrefix)));
        y.specs.push_back(std::move(s));
    }
    const int L = cfg.num_hidden_layers;
    y.a_offset.assign(static_cast<std::size_t>(L) * kLoraTargets, -1);
    y.b_offset = y.a_offset;
    y.saved_slot.assign(y.a_offset.size(), -1);
    for (const ParamSpec& s : y.specs) {
        y.offsets.push_back(y.total);
        y.total += (s.numel() + 63) / 64 * 64;
    }
    for (int l = 0; l < L; ++l)
        for (int t = 0; t < kLoraTargets; ++t) {
            const auto target = static_cast<LoraTarget>(t);
            if (!lora.has(target)) continue;
            const std::string a = lora_tensor_name(l, target, "lora_A"), b = lora_tensor_name(l, target, "lora_B");
            for (std::size_t i = 0; i < y.specs.size(); ++i) {
                if (y.specs[i].name == a) y.a_offset[y.index(l, target)] = y.offsets[i];
                if (y.specs[i].name == b) y.b_offset[y.index(l, target)] = y.offsets[i];
            }
            y.saved_slot[y.index(l, target)] = y.slots++;
            y.widest_input = std::max(y.widest_input, lora_target_shape(cfg, target)[1]);
        }
    return y;
}

}  // namespace qtrain
