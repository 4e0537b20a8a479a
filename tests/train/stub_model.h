// An IModel that does nothing (no weights, no state, an empty plan), for engine tests that need a
// model only for one or two calls: they derive from it and override those (checkpointer_test,
// checkpoint_manifest_test, evaluation_test).
#pragma once

#include <cstdint>
#include <string>

#include "model/imodel.h"

namespace qtrain::test {

class StubModel : public IModel {
public:
    ModelConfig cfg;
    const ModelConfig& config() const override { return cfg; }
    std::string device_name() const override { return "stub"; }
    void init_random(uint64_t) override {}
    void load_hf(const std::string&) override {}
    void save_hf(const std::string&) const override {}
    void forward_backward(const Batch&, float) override {}
    StepStats optimizer_step(const OptimizerParams&) override { return {}; }
    float evaluate(const Batch&) override { return 0; }
    void save_checkpoint(const std::string&) const override {}
    void load_checkpoint(const std::string&) override {}
    MemoryPlan memory_plan() const override { return {}; }
};

}  // namespace qtrain::test
