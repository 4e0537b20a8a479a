#include "train/checkpoint_export.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/flat_state_reader.h"
#include "model/checkpoint_layout.h"
#include "model/hf_writer.h"
#include "model/model_config.h"
#include "train/checkpointer.h"
#include "train/run_guard.h"

namespace qtrain {

namespace fs = std::filesystem;

int export_checkpoint(const TrainOptions& o) {
    const std::string dir = o.export_checkpoint;
    QT_CHECK(fs::exists(fs::path(dir) / "state.json"), "--export-checkpoint: '", dir,
             "' is not a complete checkpoint (no state.json; give a step_XXXXXXXX directory of --checkpoint-dir)");
    probe_writable_dir(o.out_dir, "--out-dir");
    const bool verified = verify_checkpoint(dir);
    const CheckpointState st = read_checkpoint_state(dir);
    const ModelConfig cfg = parse_model_config(st.config_json, dir + "/state.json");
    // the dtype the run would have exported: the CPU model writes fp32, the GPU model its model dtype
    const TrainOptions recorded = TrainOptions::from_json(st.options_json);
    const DType store = st.device == "cpu" ? DType::F32 : recorded.model_options(st.device).model_dtype;
    // a LoRA run's checkpoint: its adapters, or merged into --model's base (lora_checkpoint_export.cpp)
    if (recorded.lora_rank > 0) return export_lora_checkpoint(o, st, verified);
    QT_CHECK(!o.merge_lora, "--export-checkpoint --merge-lora: '", dir, "' is the checkpoint of a full training run "
             "(no --lora-rank), which holds the whole model: leave --merge-lora out");

    // the master weights, by name, from whatever the checkpoint holds: named tensors, or the GPU
    // model's blocks of its flat layout at any number of ranks (each tensor assembled from its pieces)
    const FlatStateReader reader(dir, gpu_checkpoint_layout(cfg));
    write_hf_model(o.out_dir, cfg, store, [&reader](const ParamSpec& s) {
        std::vector<float> v(s.numel());
        reader.read_tensor(FlatArray::Master, s.name, v.data());
        return v;
    });
    std::printf("[Export] %s (step %d, %s, %s%s) -> %s: model.safetensors (%s) and config.json\n", dir.c_str(),
                st.step, st.device.c_str(), reader.describe().c_str(),
                verified ? ", checksums verified" : ", written before checksums: not verified", o.out_dir.c_str(),
                std::string(dtype_name(store)).c_str());
    return 0;
}

}  // namespace qtrain
