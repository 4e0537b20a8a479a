#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace qtrain {

float LrSchedule::at(int step) const {
    const double peak = peak_lr;
    const double final_lr = peak * final_lr_fraction;
    if (step < warmup_steps) return static_cast<float>(peak * (step + 1) / warmup_steps);

    const int decay_end = std::max(warmup_steps, total_steps - cooldown_steps);
    auto decayed = [&](int s) {
        const int span = decay_end - warmup_steps;
        if (span <= 0) return peak;
        double pos = std::clamp(static_cast<double>(s - warmup_steps) / span, 0.0, 1.0);
        double frac = decay == LrDecay::Cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * pos)) : 1.0 - pos;
        return final_lr + (peak - final_lr) * frac;
    };
    if (step < decay_end || cooldown_steps <= 0) return static_cast<float>(decayed(step));

    const double start = decayed(decay_end);
    const double k = std::min(step - decay_end, cooldown_steps - 1);
    return static_cast<float>(start * (1.0 - std::sqrt(k / cooldown_steps)));
}

LrDecay parse_lr_decay(const std::string& name) {
    if (name == "cosine") return LrDecay::Cosine;
    if (name == "linear") return LrDecay::Linear;
    throw_error(cat("--lr-schedule: unknown schedule '", name, "' (expected cosine or linear)"));
}

}  // namespace qtrain
