// CpuModel weights in and out: HF safetensors (export/import) and checkpoints (fp32 master weights
// plus Adam state). Loads read everything into fresh buffers first and only then swap them in, so a
// bad file leaves the model as it was. Under data parallel rank 0 writes the files; under ZeRO-3 the
// ranks first all-gather the state to it (so a checkpoint has one format whatever the ZeRO level and
// resumes at any other), and every rank loads the whole file and keeps its block.
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/files.h"
#include "io/flat_state_reader.h"
#include "io/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/cpu/cpu_adam_files.h"
#include "model/cpu/cpu_model.h"
#include "model/flag_names.h"

namespace qtrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

std::string join(const std::string& dir, const char* file) { return (fs::path(dir) / file).string(); }

void require_file(const std::string& path, const std::string& what) {
    std::error_code ec;
    QT_CHECK(fs::exists(path, ec), what, ": '", path, "' does not exist");
}

}  // namespace

void CpuModel::load_hf(const std::string& model_dir) {
    SafeTensorsReader reader = SafeTensorsReader::open_dir(model_dir);
    std::vector<float> loaded(params_.size());
    for (size_t i = 0; i < specs_.size(); ++i) {
        const ParamSpec& s = specs_[i];
        // Tied models have no lm_head (embed_tokens is the LM head); a copy in the file is ignored.
        QT_CHECK(reader.has(s.name), "model '", model_dir, "': tensor '", s.name, "' is missing from ",
                 reader.describe(),
                 s.name == "lm_head.weight" ? " (the config has tie_word_embeddings=false, so it needs its own LM head)"
                                            : "");
        reader.read_finite_f32(s.name, s.shape, loaded.data() + offsets_[i]);
    }
    params_.swap(loaded);
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    std::fill(adam_m_.begin(), adam_m_.end(), 0.0f);
    std::fill(adam_v_.begin(), adam_v_.end(), 0.0f);
    step_loss_ = 0.0;
    start_adapters();
    shard_state();
}

void CpuModel::start_adapters() {
    if (!frozen_base()) return;
    bind_trained_base();  // (load_hf swapped the base's buffer)
    lora_.init(options_.lora.seed);
    if (!options_.lora.from.empty()) lora_.load_adapter(options_.lora.from, flag(&LoraOptions::from));
}

void CpuModel::bind_trained_base() {
    lora_.bind_base([this](const std::string& name) { return params_.data() + offset(name); });
}

void CpuModel::save_hf(const std::string& dir) const {
    // LoRA: the PEFT adapter, or with --merge-lora the base with every adapter merged in (W + s B A)
    if (frozen_base() && !options_.lora.merge) {
        lora_.save_adapter(dir);
        return;
    }
    std::vector<float> merged;
    if (frozen_base()) {
        merged = params_;
        lora_.merge_into(merged.data(), [&](const std::string& name) { return offset(name); });
    }
    // ZeRO-3: called on every rank (imodel.h), which all send rank 0 their blocks; else rank 0 only
    std::vector<float> gathered;
    const float* weights = frozen_base() ? merged.data() : whole(params_, gathered);
    if (weights_sharded() && comm_->rank() != 0) return;
    fs::create_directories(dir);
    SafeTensorsWriter writer;
    writer.set_metadata("format", "pt");
    // specs_ has no lm_head.weight when tied: the shared matrix is written once, as embed_tokens.
    for (size_t i = 0; i < specs_.size(); ++i)
        writer.add_f32(specs_[i].name, specs_[i].shape, weights + offsets_[i], DType::F32);
    writer.write(join(dir, kModelFile));
    ModelConfig cfg = config_;
    cfg.torch_dtype = "float32";
    write_text_file_atomic(join(dir, "config.json"), model_config_to_json(cfg));
}

void CpuModel::save_checkpoint(const std::string& dir) const {
    if (frozen_base()) {  // the adapters and their moments only: the base is --model's, unchanged
        // (several ranks hold the same replicated adapters: rank 0 writes them once)
        if (!comm_ || comm_->rank() == 0) lora_.save_checkpoint(dir);
        return;
    }
    // Under ZeRO-1/2 every rank holds the same gathered state (cpu_data_parallel.cpp), so rank 0's
    // files are the whole checkpoint and the other ranks have nothing of their own to write. Under
    // ZeRO-3 the ranks gather the state to rank 0 first (collective), which writes the same files.
    std::vector<float> gp, gm, gv;
    const float *p = whole(params_, gp), *m = whole(adam_m_, gm), *v = whole(adam_v_, gv);
    if (comm_ && comm_->rank() != 0) return;
    fs::create_directories(dir);
    SafeTensorsWriter weights, optimizer;
    add_adam_state(weights, optimizer, specs_, offsets_, p, m, v);
    weights.write(join(dir, kModelFile));
    optimizer.write(join(dir, kOptimizerFile));
}

void CpuModel::load_checkpoint(const std::string& dir) {
    if (frozen_base()) {  // the base was loaded from --model first (the engine's resume)
        lora_.load_checkpoint(dir);
        step_loss_ = 0.0;
        return;
    }
    std::vector<float> p(params_.size()), m(params_.size()), v(params_.size());
    if (holds_block_files(dir)) {
        // the GPU model's blocks of its flat layout, at any number of ranks (io/flat_state_reader.h)
        const FlatStateReader r(dir, gpu_checkpoint_layout(config_));
        const std::pair<FlatArray, float*> into[] = {{FlatArray::Master, p.data()}, {FlatArray::ExpAvg, m.data()},
                                                     {FlatArray::ExpAvgSq, v.data()}};
        for (size_t i = 0; i < specs_.size(); ++i)
            for (auto [array, out] : into) r.read_tensor(array, specs_[i].name, out + offsets_[i]);
    } else {
        const std::string model_path = join(dir, kModelFile), opt_path = join(dir, kOptimizerFile);
        require_file(model_path, "checkpoint '" + dir + "'");
        require_file(opt_path, "checkpoint '" + dir + "'");
        SafeTensorsReader weights({model_path}), optimizer({opt_path});
        read_adam_state(weights, optimizer, specs_, offsets_, p.data(), m.data(), v.data(), dir);
    }
    params_.swap(p);
    adam_m_.swap(m);
    adam_v_.swap(v);
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    step_loss_ = 0.0;
    shard_state();
}

std::vector<float> CpuModel::read_tensor(const std::string& name, TensorKind kind) {
    if (lora_.has(name)) {  // an adapter (PEFT name): never sharded
        const int64_t n = lora_.spec(name).numel();
        const float* p = kind == TensorKind::Gradient ? lora_.grad(name) : lora_.param(name);
        return std::vector<float>(p, p + n);
    }
    QT_CHECK(kind != TensorKind::Gradient || !frozen_base(), "CpuModel: '", name, "' is frozen under LoRA (",
             flag(&LoraOptions::rank), "): it has no gradient");
    const int64_t begin = offset(name), end = begin + specs_[index_.at(name)].numel();
    if (kind == TensorKind::Gradient) return std::vector<float>(grads_.begin() + begin, grads_.begin() + end);
    const Held held(*this, {begin, end});
    return std::vector<float>(params_.begin() + begin, params_.begin() + end);
}

}  // namespace qtrain
