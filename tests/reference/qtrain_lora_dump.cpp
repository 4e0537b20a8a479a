// qtrain_lora_dump: the qtrain side of tests/reference/compare_peft_cpu.py (issue 33). Loads a HF model
// directory into a model made as the trainer makes it (create_model: the CPU reference model, or with
// --device cuda the GPU model, in --dtype fp32|bf16) with LoRA adapters from a PEFT adapter directory,
// runs forward+backward on one batch (int32 inputs then targets, B*T each, from a raw file) and writes
// the loss and every adapter gradient (PEFT names, read through IModel::read_tensor) into a safetensors
// file; then K AdamW steps on the same batch (the losses and the final adapters written too), the
// adapter exported to --export-dir and the merged model (--merge-lora's export) to --merged-dir.
//
// usage: qtrain_lora_dump --model DIR --adapter DIR --rank R --alpha A --targets all --tokens FILE
//        --batch B --seq-len T --out OUT.safetensors [--steps K --lr LR --weight-decay WD --beta1 B1
//        --beta2 B2 --eps E] [--export-dir DIR] [--merged-dir DIR] [--train-also norms,embeddings]
//        [--device cpu|cuda] [--dtype fp32|bf16]
// --dtype bf16 (the model, matmul and activation-gradient dtypes; the adapters' master, gradients and
// moments stay fp32) needs --device cuda: the CPU reference model is fp32 only.
// With --train-also the trained base tensors are among the specs (PEFT's modules_to_save names) and
// are written with the adapters.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/files.h"
#include "backends/model_backends.h"
#include "io/safetensors.h"
#include "model/cpu/cpu_model.h"
#include "model/model_config.h"
#include "train/option_table.h"

using namespace qtrain;

int main(int argc, char** argv) {
    std::string model_dir, adapter_dir, targets = "all", tokens_path, out_path, export_dir, merged_dir, train_also,
        device = "cpu", dtype = "fp32";
    int rank = 8, B = 2, T = 16, steps = 0;
    float alpha = 16.0f, lr = 1e-3f, weight_decay = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    CLI::App app{"qtrain_lora_dump"};
    app.add_option("--model", model_dir)->required();
    app.add_option("--adapter", adapter_dir)->required();
    app.add_option("--rank", rank);
    app.add_option("--alpha", alpha);
    app.add_option("--targets", targets);
    app.add_option("--tokens", tokens_path)->required();
    app.add_option("--batch", B);
    app.add_option("--seq-len", T);
    app.add_option("--out", out_path)->required();
    app.add_option("--steps", steps);
    app.add_option("--lr", lr);
    app.add_option("--weight-decay", weight_decay);
    app.add_option("--beta1", beta1);
    app.add_option("--beta2", beta2);
    app.add_option("--eps", eps);
    app.add_option("--export-dir", export_dir);
    app.add_option("--merged-dir", merged_dir);
    app.add_option("--train-also", train_also);
    app.add_option("--device", device)->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--dtype", dtype)->check(CLI::IsMember({"fp32", "bf16"}));
    CLI11_PARSE(app, argc, argv);
    (void)qtrain::train_option_table();  // the flag names the model's messages print (model/flag_names.h)
    try {
        device = resolve_device(device);  // --device=cuda without a GPU (or CUDA build): refused by name
        QT_CHECK(dtype == "fp32" || device == "cuda", "--dtype=", dtype,
                 " needs --device=cuda (the CPU reference model is fp32 only)");
        const ModelConfig cfg = load_model_config(model_dir + "/config.json");
        ModelOptions opt = CpuModel::fp32_options(B, T);  // fp32 optimizer state and master on either device
        if (dtype == "bf16") opt.model_dtype = opt.matmul_dtype = opt.gradient_dtype = DType::BF16;
        opt.lora.rank = rank;
        opt.lora.alpha = alpha;
        opt.lora.targets = parse_lora_targets(targets, "--targets");
        opt.lora.from = adapter_dir;
        opt.lora.base_model = model_dir;
        opt.lora.train_also = parse_lora_train_also(train_also, "--train-also");
        // the adapters (PEFT names, A before B per target) and the --train-also tensors, in the CPU
        // model's order (CpuLora::specs)
        std::vector<ParamSpec> specs = lora_parameters(cfg, opt.lora);
        for (ParamSpec& s : lora_train_also_parameters(cfg, opt.lora)) specs.push_back(std::move(s));
        const std::unique_ptr<IModel> model = create_model(cfg, opt, device);
        model->load_hf(model_dir);

        const std::vector<uint8_t> raw = read_binary_file(tokens_path);
        const size_t n = static_cast<size_t>(B) * T;
        QT_CHECK(raw.size() == 2 * n * sizeof(int32_t), tokens_path, ": expected ", 2 * n, " int32 (inputs, targets)");
        std::vector<int32_t> in(n), tgt(n);
        std::memcpy(in.data(), raw.data(), n * sizeof(int32_t));
        std::memcpy(tgt.data(), raw.data() + n * sizeof(int32_t), n * sizeof(int32_t));
        const Batch batch{in.data(), tgt.data(), B, T};

        SafeTensorsWriter w;
        std::vector<std::vector<float>> keep;  // the writer holds pointers until write()
        model->forward_backward(batch, 1.0f);
        for (const ParamSpec& s : specs) {
            keep.push_back(model->read_tensor(s.name, IModel::TensorKind::Gradient));
            w.add_f32("grad." + s.name, s.shape, keep.back().data());
        }
        std::vector<float> losses;
        OptimizerParams p;
        p.learning_rate = lr;
        p.weight_decay = weight_decay;
        p.beta1 = beta1;
        p.beta2 = beta2;
        p.epsilon = eps;
        p.grad_clip = 0.0f;
        for (int k = 1; k <= steps; ++k) {
            if (k > 1) model->forward_backward(batch, 1.0f);
            p.step = k;
            losses.push_back(model->optimizer_step(p).loss);
        }
        // the loss of the first forward_backward: the first step's (IModel has no other reading of it),
        // or without steps that of a forward pass (dropout 0: the same loss)
        keep.push_back({losses.empty() ? model->evaluate(batch) : losses.front()});
        w.add_f32("loss", {1}, keep.back().data());
        keep.push_back(losses);
        if (!losses.empty()) w.add_f32("losses", {static_cast<int64_t>(losses.size())}, keep.back().data());
        for (const ParamSpec& s : specs) {
            keep.push_back(model->read_tensor(s.name, IModel::TensorKind::Weights));
            w.add_f32("param." + s.name, s.shape, keep.back().data());
        }
        w.write(out_path);
        if (!export_dir.empty()) model->save_hf(export_dir);
        if (!merged_dir.empty()) {
            QT_CHECK(!export_dir.empty(), "--merged-dir needs --export-dir (the trained adapter it merges)");
            ModelOptions merge = opt;
            merge.lora.from = export_dir;
            merge.lora.merge = true;
            const std::unique_ptr<IModel> merged = create_model(cfg, merge, device);
            merged->load_hf(model_dir);
            merged->save_hf(merged_dir);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
