// `--export-checkpoint` of a LoRA run's checkpoint (issue 33). The checkpoint holds the adapters
// (PEFT's files) and their moments only; the frozen base is --model's. Without --merge-lora the
// adapter files are the export; with it, --model's weights with every adapter merged in, written as
// the end of a `--merge-lora` run writes them (CpuLora::merge_tensor, hf_writer.h), so the two agree.
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/cpu/cpu_lora.h"
#include "model/hf_writer.h"
#include "model/lora.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "train/checkpoint_export.h"
#include "train/model_dir_files.h"
#include "train/model_source.h"
#include "train/output_tokenizer.h"
#include "train/resume_check.h"

namespace qtrain {

namespace fs = std::filesystem;

int export_lora_checkpoint(const TrainOptions& o, const CheckpointState& st, bool verified) {
    const std::string dir = o.export_checkpoint;
    const TrainOptions recorded = TrainOptions::from_json(st.options_json);
    const std::string note = verified ? ", checksums verified" : ", written before checksums: not verified";
    if (!o.merge_lora) {
        // the adapters as PEFT's files: they are the export
        fs::create_directories(o.out_dir);
        for (const char* file : {kAdapterWeightsFile, kAdapterConfigFile})
            fs::copy_file(fs::path(dir) / file, fs::path(o.out_dir) / file, fs::copy_options::overwrite_existing);
        std::printf("[Export] %s (step %d, LoRA rank %d%s) -> %s: %s and %s\n", dir.c_str(), st.step,
                    recorded.lora_rank, note.c_str(), o.out_dir.c_str(), kAdapterWeightsFile, kAdapterConfigFile);
        return 0;
    }
    QT_CHECK(!o.model.empty(), "--export-checkpoint --merge-lora: give the base model with --model (the checkpoint of "
             "a LoRA run holds the adapters only; its run trained on --model=", recorded.model, ")");
    const ModelSource source = resolve_model_source(o);
    QT_CHECK(source.directory, "--export-checkpoint --merge-lora: --model=", o.model, " has no weights to merge into (",
             source.description, ")", recorded.from_scratch ? "; the run was --from-scratch, give a model directory "
             "with the weights it started from" : "");
    // the base must be the model the adapters were trained on: the same config (shapes and math) ...
    const std::vector<OptionChange> changes =
        compare_resume_options(st.options_json, st.device, st.config_json, recorded, st.device, source.config);
    for (const OptionChange& c : changes)
        QT_CHECK(c.flag.rfind("model config.", 0) != 0, "--export-checkpoint --merge-lora: --model=", o.model,
                 " is not the base of the checkpoint '", dir, "': ", describe_option_change(c));
    // ... and adapters of its shapes, rank, alpha and targets (the checks of --lora-from)
    LoraOptions lora = recorded.model_options(st.device).lora;
    lora.from.clear();
    lora.merge = true;
    CpuLora adapters(source.config, lora);
    adapters.load_adapter(dir, "--export-checkpoint");

    // stored as the run would have exported: the CPU model fp32, the GPU model its model dtype (its base
    // weights are --model's rounded to it, the merge is done on those in fp32 and rounded once)
    const DType store = st.device == "cpu" ? DType::F32 : recorded.model_options(st.device).model_dtype;
    const SafeTensorsReader base = SafeTensorsReader::open_dir(*source.directory);
    write_hf_model(o.out_dir, source.config, store, [&](const ParamSpec& s) {
        std::vector<float> v(s.numel());
        QT_CHECK(base.has(s.name), "--model=", o.model, ": tensor '", s.name, "' is missing from ", base.describe());
        base.read_finite_f32(s.name, s.shape, v.data());
        if (store == DType::BF16)
            for (float& x : v) x = bf16_to_float(float_to_bf16(x));
        adapters.merge_tensor(s, v.data());
        return v;
    });
    // what goes beside the weights, as the run's export: --tokenizer's files, else --model's
    std::optional<Tokenizer> tok = load_output_tokenizer(o.tokenizer, source.config.vocab_size);
    copy_model_dir_files(*source.directory, o.out_dir, !tok);
    if (tok) export_hf_tokenizer(*tok, o.out_dir);
    std::printf("[Export] %s (step %d, LoRA rank %d%s) merged into %s -> %s: model.safetensors (%s) and config.json\n",
                dir.c_str(), st.step, recorded.lora_rank, note.c_str(), source.description.c_str(), o.out_dir.c_str(),
                std::string(dtype_name(store)).c_str());
    return 0;
}

}  // namespace qtrain
