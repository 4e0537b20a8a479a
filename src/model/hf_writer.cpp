#include "model/hf_writer.h"

#include <filesystem>

#include "core/files.h"
#include "io/safetensors.h"

namespace qtrain {

namespace fs = std::filesystem;

void write_hf_model(const std::string& dir, const ModelConfig& config, DType store,
                    const std::function<std::vector<float>(const ParamSpec&)>& values) {
    fs::create_directories(dir);
    SafeTensorsWriter w;
    for (const ParamSpec& s : model_parameters(config))  // canonical HF order
        w.add_f32_deferred(s.name, s.shape, [&values, s] { return values(s); }, store);
    w.set_metadata("format", "pt");
    w.write((fs::path(dir) / "model.safetensors").string());
    ModelConfig out = config;
    out.torch_dtype = store == DType::BF16 ? "bfloat16" : "float32";
    write_text_file_atomic((fs::path(dir) / "config.json").string(), model_config_to_json(out));
}

}  // namespace qtrain
