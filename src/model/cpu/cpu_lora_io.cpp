// CpuLora's files: PEFT's adapter directory (the export and --lora-from), the checkpoint's adapter
// state, and the merge into the base for --merge-lora.
#include <filesystem>

#include "core/error.h"
#include "model/flag_names.h"
#include "core/files.h"
#include "io/safetensors.h"
#include "model/cpu/cpu_adam_files.h"
#include "model/cpu/cpu_lora.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOptimizerFile = "optimizer.safetensors";

std::string join(const std::string& dir, const char* file) { return (fs::path(dir) / file).string(); }

// A tied model's --train-also=embeddings: PEFT (ensure_weight_tying) wraps lm_head too, tied to the
// trained embed_tokens copy, and its files carry that tensor under the head's name as well (its load
// looks for both). qtrain trains the one matrix: the adapter file repeats it under this name.
const std::string kTiedHead = std::string(kPeftPrefix) + "lm_head.weight";
const std::string kEmbed = std::string(kPeftPrefix) + "model.embed_tokens.weight";

bool writes_tied_head(const ModelConfig& cfg, const LoraOptions& lora) {
    return cfg.tie_word_embeddings && (lora.train_also & kTrainEmbeddings);
}

}  // namespace

void CpuLora::save_adapter(const std::string& dir) const {
    fs::create_directories(dir);
    SafeTensorsWriter writer;
    writer.set_metadata("format", "pt");
    for (size_t i = 0; i < specs_.size(); ++i)
        writer.add_f32(specs_[i].name, specs_[i].shape, value(i), DType::F32);
    if (writes_tied_head(cfg_, lora_)) writer.add_f32(kTiedHead, spec(kEmbed).shape, value(index(kEmbed)), DType::F32);
    writer.write(join(dir, kAdapterWeightsFile));
    write_text_file_atomic(join(dir, kAdapterConfigFile), peft_adapter_config_json(lora_, cfg_));
}

void CpuLora::load_adapter(const std::string& dir, const std::string& flag) {
    const std::string where = flag + "=" + dir;
    const std::string config = join(dir, kAdapterConfigFile), weights = join(dir, kAdapterWeightsFile);
    std::error_code ec;
    QT_CHECK(fs::exists(config, ec), where, ": no ", kAdapterConfigFile, " (a PEFT adapter directory holds it)");
    QT_CHECK(fs::exists(weights, ec), where, ": no ", kAdapterWeightsFile,
             " (a PEFT adapter saved with safe_serialization, peft's default)");
    check_peft_adapter_config(read_text_file(config), lora_, flag, dir);
    const SafeTensorsReader reader({weights});
    std::vector<float> loaded(params_.size());
    for (size_t i = 0; i < specs_.size(); ++i) {
        const ParamSpec& s = specs_[i];
        QT_CHECK(reader.has(s.name), where, ": tensor '", s.name, "' is missing (an adapter of another base, or "
                 "of fewer layers?)");
        try {
            reader.read_finite_f32(s.name, s.shape, loaded.data() + offsets_[i]);
        } catch (const Error& e) {
            throw_error(cat(where, ": not an adapter of this base model: ", e.what()));
        }
    }
    // a tensor this model has no place for: another base (more layers) or another kind of adapter
    for (const std::string& name : reader.names())
        QT_CHECK(index_.count(name) || (name == kTiedHead && writes_tied_head(cfg_, lora_)), where, ": tensor '", name, "' has no place in this model (an adapter of "
                 "another base?)");
    params_.swap(loaded);
    scatter();
    for (auto* v : {&grads_, &m_, &v_}) std::fill(v->begin(), v->end(), 0.0f);
}

void CpuLora::save_checkpoint(const std::string& dir) const {
    fs::create_directories(dir);
    SafeTensorsWriter weights, optimizer;
    const std::vector<float> values = gathered();
    add_adam_state(weights, optimizer, specs_, offsets_, values.data(), m_.data(), v_.data());
    // the weights file is PEFT's adapter file too (--export-checkpoint copies it)
    if (writes_tied_head(cfg_, lora_))
        weights.add_f32(kTiedHead, spec(kEmbed).shape, values.data() + offset(kEmbed), DType::F32);
    // the dropout masks' pass count: a resume draws the masks the uninterrupted run would have
    optimizer.set_metadata("lora_dropout_passes", std::to_string(passes_));
    weights.write(join(dir, kAdapterWeightsFile));
    optimizer.write(join(dir, kOptimizerFile));
    write_text_file_atomic(join(dir, kAdapterConfigFile), peft_adapter_config_json(lora_, cfg_));
}

void CpuLora::load_checkpoint(const std::string& dir) {
    const std::string weights_path = join(dir, kAdapterWeightsFile), opt_path = join(dir, kOptimizerFile);
    std::error_code ec;
    QT_CHECK(fs::exists(weights_path, ec), "checkpoint '", dir, "': no ", kAdapterWeightsFile,
             " (not a checkpoint of a LoRA run: ", flag(&LoraOptions::rank), " differs from the run that wrote it)");
    QT_CHECK(fs::exists(opt_path, ec), "checkpoint '", dir, "': '", opt_path, "' does not exist");
    const SafeTensorsReader weights({weights_path}), optimizer({opt_path});
    std::vector<float> p(params_.size()), m(params_.size()), v(params_.size());
    read_adam_state(weights, optimizer, specs_, offsets_, p.data(), m.data(), v.data(), dir);
    const SafeTensorsFile opt_file(opt_path);
    const auto& meta = opt_file.metadata();
    const auto passes = meta.find("lora_dropout_passes");
    QT_CHECK(passes != meta.end() || lora_.dropout == 0.0f, "checkpoint '", dir, "': ", opt_path,
             " records no lora_dropout_passes (needed to resume ", flag(&LoraOptions::dropout), "'s masks)");
    params_.swap(p);
    scatter();
    m_.swap(m);
    v_.swap(v);
    passes_ = passes == meta.end() ? 0 : std::stoull(passes->second);
    zero_grads();
}

void CpuLora::merge_one(int l, LoraTarget t, float* w) const {
    if (!enabled() || a_offset_[slot(l, t)] < 0) return;
    const auto [out, in] = lora_target_shape(cfg_, t);
    const int r = lora_.rank;
    const float* a = params_.data() + a_offset_[slot(l, t)];
    const float* b = a + static_cast<int64_t>(r) * in;
    // W[out, in] += s * B[out, r] A[r, in]
    cpu::gemm(false, false, static_cast<int>(out), static_cast<int>(in), r, lora_.scale(), b, r, a,
              static_cast<int>(in), 1.0f, w, static_cast<int>(in));
}

void CpuLora::merge_tensor(const ParamSpec& s, float* w) const {
    if (!enabled()) return;
    // a --train-also tensor: its trained values replace the base's
    if (const auto it = index_.find(kPeftPrefix + s.name); it != index_.end() && it->second >= first_extra_) {
        const float* v = value(it->second);
        std::copy(v, v + s.numel(), w);
        return;
    }
    if (s.layer < 0) return;
    const std::string prefix = "model.layers." + std::to_string(s.layer) + ".";
    for (int t = 0; t < kLoraTargets; ++t) {
        const auto target = static_cast<LoraTarget>(t);
        if (s.name == prefix + lora_module_path(target) + ".weight") merge_one(s.layer, target, w);
    }
}

}  // namespace qtrain
