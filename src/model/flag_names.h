// The `train` flags the models' messages name, looked up by what the model knows each flag as: the
// ModelOptions field it fills (`flag(&ModelOptions::matmul_dtype)` -> "--matmul-dtype"), a field of
// ModelOptions::lora, or a RunFlag for the few flags that reach the model without a field of their
// own. No name is spelled here: the option table (src/train/option_table.cpp, a layer above) is the
// one list of flags and registers each entry's "--name" under the field its `.model(...)` fills (or
// under what its `.names(...)` says) when it is built, which every way of making ModelOptions
// (TrainOptions::model_options) does first. So renaming a flag in the table renames it in every model
// message, and tests/train/model_flag_names_test.cpp fails when a model message names a field that no
// entry registers.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "model/model_options.h"

namespace qtrain {

// Flags that reach the model without a ModelOptions field: --device is which model was made (the
// backends choose it), --zero-level arrives as set_communicator's level, --gpu-ids as device_index.
enum class RunFlag { Device, ZeroLevel, GpuIds };

// What a model message names a flag by (its ModelOptions field, a LoRA field, or a RunFlag).
using ModelFlag =
    std::variant<bool ModelOptions::*, int ModelOptions::*, int64_t ModelOptions::*, uint64_t ModelOptions::*,
                 DType ModelOptions::*, AttentionImpl ModelOptions::*, Fp8FastAccum ModelOptions::*,
                 bool LoraOptions::*, int LoraOptions::*, float LoraOptions::*, uint32_t LoraOptions::*,
                 uint64_t LoraOptions::*, std::string LoraOptions::*, RunFlag>;

// The option table's registration of one entry: `name` with its "--". Registering a key again with the
// same name is a no-op; with another name it is a std::logic_error (one field, one flag).
void register_flag_name(const ModelFlag& key, const std::string& name);

// "--name" of the flag registered under `key`. A key nothing registered is a std::logic_error naming the
// option table: a program that makes models without the table, or an entry that lacks its `.model` /
// `.names` (the test above catches the latter).
std::string flag(const ModelFlag& key);

// Whether `key` is registered (for that test).
bool has_flag_name(const ModelFlag& key);

}  // namespace qtrain
