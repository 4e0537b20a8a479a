// The flag names the models' messages print (model/flag_names.h) come from the option table: every
// field a model message names is registered by an entry, under that entry's name.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/flag_names.h"
#include "train/option_table.h"

using namespace qtrain;

namespace {

// The keys as the model sources spell them. A message naming a field not listed here fails the scan
// below: add the field, and the scan then checks that the table registers it.
#define QT_KEY(key) {#key, ModelFlag{key}}
const std::map<std::string, ModelFlag>& spelled_keys() {
    static const std::map<std::string, ModelFlag> keys = {
        QT_KEY(&ModelOptions::batch_size), QT_KEY(&ModelOptions::seq_len), QT_KEY(&ModelOptions::model_dtype),
        QT_KEY(&ModelOptions::matmul_dtype), QT_KEY(&ModelOptions::gradient_dtype),
        QT_KEY(&ModelOptions::opt_m_dtype), QT_KEY(&ModelOptions::opt_v_dtype), QT_KEY(&ModelOptions::master_dtype),
        QT_KEY(&ModelOptions::param_grad_dtype), QT_KEY(&ModelOptions::fp8_lm_head),
        QT_KEY(&ModelOptions::recompute_swiglu),
        QT_KEY(&ModelOptions::recompute_norm), QT_KEY(&ModelOptions::recompute_qkv),
        QT_KEY(&ModelOptions::recompute_ffn), QT_KEY(&ModelOptions::recompute_att),
        QT_KEY(&ModelOptions::recompute_block), QT_KEY(&ModelOptions::offload_residual),
        QT_KEY(&ModelOptions::offload_master), QT_KEY(&ModelOptions::offload_opt_m),
        QT_KEY(&ModelOptions::offload_opt_v), QT_KEY(&ModelOptions::offload_quants),
        QT_KEY(&ModelOptions::offload_gradients), QT_KEY(&ModelOptions::persistent_quants),
        QT_KEY(&ModelOptions::write_combined), QT_KEY(&ModelOptions::memcpy_all_gather),
        QT_KEY(&ModelOptions::offload_double_buffer), QT_KEY(&ModelOptions::shard_weights),
        QT_KEY(&ModelOptions::shard_gradients), QT_KEY(&ModelOptions::gpus), QT_KEY(&ModelOptions::use_cuda_graphs),
        QT_KEY(&ModelOptions::document_masking), QT_KEY(&ModelOptions::lmhead_chunks),
        QT_KEY(&ModelOptions::attn_bwd_chunks), QT_KEY(&ModelOptions::attention),
        QT_KEY(&ModelOptions::max_docs_per_row),
        QT_KEY(&ModelOptions::fp8_fast_accum), QT_KEY(&ModelOptions::fp8_transposes_jit),
        QT_KEY(&ModelOptions::gemm_autotune),
        QT_KEY(&ModelOptions::memory_limit), QT_KEY(&LoraOptions::rank), QT_KEY(&LoraOptions::alpha),
        QT_KEY(&LoraOptions::dropout), QT_KEY(&LoraOptions::targets), QT_KEY(&LoraOptions::init),
        QT_KEY(&LoraOptions::from), QT_KEY(&LoraOptions::merge), QT_KEY(&LoraOptions::train_also),
        QT_KEY(RunFlag::Device),
        QT_KEY(RunFlag::ZeroLevel), QT_KEY(RunFlag::GpuIds)};
    return keys;
}
#undef QT_KEY

std::string read_text(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

}  // namespace

// Every key in src/model names a field some entry registers, so a model message never meets a
// missing name (flag() would throw std::logic_error instead of the message). The model layer takes
// pointers to options fields only to name flags (flag(&ModelOptions::x), or lists of them such as the
// CPU model's GPU settings), so the scan takes every one, and every RunFlag.
TEST(ModelFlagNames, EveryFieldTheModelsNameIsRegisteredByTheTable) {
    (void)train_option_table();
    const std::regex call(R"((&(?:ModelOptions|LoraOptions)::\w+|RunFlag::\w+))");
    int calls = 0;
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(std::string(QTRAIN_SOURCE_DIR) + "/src/model")) {
        const std::string ext = entry.path().extension().string();
        if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
        const std::string text = read_text(entry.path());
        for (auto it = std::sregex_iterator(text.begin(), text.end(), call); it != std::sregex_iterator(); ++it) {
            ++calls;
            const std::string key = (*it)[1];
            const auto known = spelled_keys().find(key);
            if (known == spelled_keys().end()) {
                ADD_FAILURE() << entry.path() << " names " << key << ": add it to this test's spelled_keys()";
                continue;
            }
            EXPECT_TRUE(has_flag_name(known->second)) << entry.path() << " names " << key
                                                      << ", which no option-table entry registers (.model or .names)";
        }
    }
    EXPECT_GT(calls, 100);  // the scan found the messages (about 130 keys today)
}

namespace {

// The string literals of a C++ source, comments left out (src/model has no raw strings).
std::vector<std::string> string_literals(const std::string& text) {
    std::vector<std::string> out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text.compare(i, 2, "//") == 0) {
            i = std::min(text.find('\n', i), text.size());
        } else if (text.compare(i, 2, "/*") == 0) {
            i = std::min(text.find("*/", i) + 1, text.size());
        } else if (text[i] == '\'' || text[i] == '"') {
            const char quote = text[i];
            std::string literal;
            for (++i; i < text.size() && text[i] != quote; ++i) {
                if (text[i] == '\\') literal += text[i++];
                literal += text[i];
            }
            if (quote == '"') out.push_back(literal);
        }
    }
    return out;
}

}  // namespace

// No model message spells a flag: each takes its name from flag(), so the table is the one place that
// names it.
TEST(ModelFlagNames, NoModelMessageSpellsAFlag) {
    // Files not converted yet (by name), for work that cannot take the change at once: none now.
    const std::set<std::string> pending = {};
    const std::regex spelled(R"(--[a-z][a-z0-9-]*)");
    int literals = 0;
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(std::string(QTRAIN_SOURCE_DIR) + "/src/model")) {
        const std::string ext = entry.path().extension().string();
        if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
        if (pending.count(entry.path().filename().string())) continue;
        for (const std::string& literal : string_literals(read_text(entry.path()))) {
            ++literals;
            EXPECT_FALSE(std::regex_search(literal, spelled))
                << entry.path() << " spells a flag in \"" << literal << "\": use flag(...) (model/flag_names.h)";
        }
    }
    EXPECT_GT(literals, 500);  // the scan saw the sources' messages
}

// Each registered name is its entry's "--name"; the ones the messages use most, spelled out.
TEST(ModelFlagNames, NamesAreTheEntriesNames) {
    int registered = 0;
    for (const OptionSpec& spec : train_option_table()) {
        if (!spec.model_flag) continue;
        ++registered;
        EXPECT_EQ(flag(*spec.model_flag), flag_name(spec));
    }
    EXPECT_GT(registered, 40);
    EXPECT_EQ(flag(&ModelOptions::matmul_dtype), "--matmul-dtype");
    EXPECT_EQ(flag(&ModelOptions::batch_size), "--batch-size");  // the long name, not the alias --batch
    EXPECT_EQ(flag(&LoraOptions::merge), "--merge-lora");
    EXPECT_EQ(flag(RunFlag::Device), "--device");
    EXPECT_EQ(flag(RunFlag::ZeroLevel), "--zero-level");
    EXPECT_EQ(flag(RunFlag::GpuIds), "--gpu-ids");
}

// One field, one flag: a second name for a registered field is refused; the same name again is not.
TEST(ModelFlagNames, OneNamePerField) {
    (void)train_option_table();
    EXPECT_NO_THROW(register_flag_name(&ModelOptions::seq_len, "--seq-len"));
    EXPECT_THROW(register_flag_name(&ModelOptions::seq_len, "--sequence-length"), std::logic_error);
    EXPECT_EQ(flag(&ModelOptions::seq_len), "--seq-len");
    // a field no entry names (the optimizer's staging chunk is not a flag): a logic error, not a name
    EXPECT_FALSE(has_flag_name(&ModelOptions::optimizer_chunk));
    EXPECT_THROW(flag(&ModelOptions::optimizer_chunk), std::logic_error);
}
