// The models' messages name flags by the names the option table registers (model/flag_names.h); a
// program registers them by building the table, as TrainOptions::model_options does before any model
// exists. These tests make models from ModelOptions directly, so they build it first.
#include <gtest/gtest.h>

#include "train/option_table.h"

namespace {

class OptionTableNames : public ::testing::Environment {
public:
    void SetUp() override { (void)qtrain::train_option_table(); }
};

::testing::Environment* const kOptionTableNames = ::testing::AddGlobalTestEnvironment(new OptionTableNames);

}  // namespace
