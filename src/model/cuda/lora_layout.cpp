#include "model/cuda/lora_layout.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

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
    y.a_numel.assign(y.a_offset.size(), 0);
    y.saved_slot.assign(y.a_offset.size(), -1);
    const auto pad = [](int64_t n) { return (n + 63) / 64 * 64; };
    std::unordered_map<std::string, std::size_t> index_of;
    for (std::size_t i = 0; i < y.specs.size(); ++i) index_of[y.specs[i].name] = i;
    y.offsets.assign(y.specs.size(), -1);
    const auto place = [&](std::size_t i) {
        y.offsets[i] = y.total;
        y.total += pad(y.specs[i].numel());
        return y.offsets[i];
    };
    y.dropout = lora.dropout > 0.0f;
    for (int l = 0; l < L; ++l) {
        for (const char* part : {"lora_A", "lora_B"})  // a layer's A's, then its B's, each in target order
            for (int t = 0; t < kLoraTargets; ++t) {
                const auto target = static_cast<LoraTarget>(t);
                if (!lora.has(target)) continue;
                const auto it = index_of.find(lora_tensor_name(l, target, part));
                QT_CHECK(it != index_of.end(), "GPU model: internal error (no LoRA tensor ",
                         lora_tensor_name(l, target, part), ")");
                (part[5] == 'A' ? y.a_offset : y.b_offset)[y.index(l, target)] = place(it->second);
                if (part[5] == 'A') y.a_numel[y.index(l, target)] = y.specs[it->second].numel();
            }
        for (int t = 0; t < kLoraTargets; ++t) {
            const auto target = static_cast<LoraTarget>(t);
            if (!lora.has(target)) continue;
            y.saved_slot[y.index(l, target)] = y.slots++;
            y.widest_input = std::max(y.widest_input, lora_target_shape(cfg, target)[1]);
        }
    }
    for (std::size_t i = y.first_trained; i < y.specs.size(); ++i) place(i);
    const LoraTarget qkv[] = {LoraTarget::Q, LoraTarget::K, LoraTarget::V}, gate_up[] = {LoraTarget::Gate, LoraTarget::Up};
    for (int l = 0; l < L; ++l)
        for (const auto& [targets, n] : {std::pair{qkv, 3}, std::pair{gate_up, 2}}) {
            LoraTarget present[3];
            int k = 0;
            for (int j = 0; j < n; ++j)
                if (y.has(l, targets[j])) present[k++] = targets[j];
            if (y.stacked(l, present, k)) y.widest_stack = std::max(y.widest_stack, k);
        }
    return y;
}

namespace {
// Which fused matrix's input a target reads: q|k|v's and gate|up's are shared, o's and down's not.
int input_of(LoraTarget t) {
    switch (t) {
        case LoraTarget::Q: case LoraTarget::K: case LoraTarget::V: return 0;
        case LoraTarget::O: return 1;
        case LoraTarget::Gate: case LoraTarget::Up: return 2;
        default: return 3;
    }
}
}  // namespace

bool LoraLayout::stacked(int l, const LoraTarget* targets, int n) const {
    if (n < 2 || dropout) return false;
    for (int j = 1; j < n; ++j)
        if (input_of(targets[j]) != input_of(targets[0])) return false;  // (adjacent, but other inputs)
    if (a_offset[index(l, targets[0])] < 0) return false;
    for (int j = 1; j < n; ++j) {
        const int i = index(l, targets[j]), prev = index(l, targets[j - 1]);
        if (a_offset[i] < 0 || saved_slot[i] != saved_slot[prev] + 1) return false;
        // adjacent: the previous A ([r, in], the same in for targets that share an input) ends where this one starts
        if (a_offset[i] != a_offset[prev] + a_numel[prev]) return false;
    }
    return true;
}

}  // namespace qtrain
