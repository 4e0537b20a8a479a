// Learning-rate schedule: linear warmup, then cosine or linear decay to final_lr_fraction * peak,
// then an optional 1-sqrt cooldown (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training
// Beyond Fixed Training Durations") over the last `cooldown` steps.
#pragma once

#include <string>

namespace qtrain {

enum class LrDecay { Cosine, Linear };

struct LrSchedule {
    float peak_lr = 1e-5f;
    int total_steps = 1;
    int warmup_steps = 0;
    int cooldown_steps = 0;
    float final_lr_fraction = 1.0f;
    LrDecay decay = LrDecay::Cosine;

    // Learning rate for optimizer step `step` (0-based):
    //  - warmup:   peak * (step + 1) / warmup                          for step < warmup
    //  - decay:    from peak to peak * final over [warmup, total - cooldown], cosine or linear
    //  - cooldown: lr_c * (1 - sqrt(k / cooldown)), k = step - (total - cooldown) in [0, cooldown),
    //              lr_c = the decay phase's final value (so with final_lr_fraction=1 this is WSD)
    float at(int step) const;
};

LrDecay parse_lr_decay(const std::string& name);  // "cosine" | "linear"

}  // namespace qtrain
