// torchrun and Slurm launch detection from the environment, through an injected lookup.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "comm/launch_env.h"
#include "core/error.h"

namespace qtrain::test {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<comm::LaunchEnv> detect(const Env& env) {
    return comm::detect_launch_env([&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    });
}

// The error detect() throws, or "" when it does not.
std::string error_of(const Env& env) {
    try {
        detect(env);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

const Env kTorchrun = {{"RANK", "5"},          {"WORLD_SIZE", "8"},           {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29500"},
                       {"TORCHELASTIC_RUN_ID", "job7"}};

Env with(Env env, const std::string& name, const char* value) {
    if (value) env[name] = value;
    else env.erase(name);
    return env;
}

TEST(CommLaunchEnv, NothingSetIsASingleProcess) { EXPECT_FALSE(detect({{"LOCAL_RANK", "0"}}).has_value()); }

TEST(CommLaunchEnv, ReadsTorchrunsVariables) {
    const auto l = detect(kTorchrun);
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->source, "torchrun");
    EXPECT_EQ(l->rank, 5);
    EXPECT_EQ(l->world, 8);
    EXPECT_EQ(l->local_rank, 1);
    EXPECT_EQ(l->local_world, 4);
    EXPECT_EQ(l->master_addr, "node-a");
    EXPECT_EQ(l->master_port, 29500);
    EXPECT_EQ(l->addr_from + ":" + l->port_from, "MASTER_ADDR:MASTER_PORT");  // named in the rendezvous's lines
    EXPECT_EQ(l->run_token, "job7");
    EXPECT_EQ(detect(with(kTorchrun, "QTRAIN_RUN_TOKEN", "mine"))->run_token, "mine");
    EXPECT_EQ(detect(with(kTorchrun, "LOCAL_WORLD_SIZE", nullptr))->local_world, 0);
}

TEST(CommLaunchEnv, ReadsSlurmsVariablesWithTheUsersMaster) {
    const Env slurm = {{"SLURM_PROCID", "3"},  {"SLURM_NTASKS", "4"},    {"SLURM_LOCALID", "1"},
                       {"SLURM_JOB_ID", "99"}, {"SLURM_STEP_ID", "2"},   {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "1"}};
    const auto l = detect(slurm);
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->source, "slurm");
    EXPECT_EQ(l->rank, 3);
    EXPECT_EQ(l->world, 4);
    EXPECT_EQ(l->local_rank, 1);
    EXPECT_EQ(l->master_addr, "10.0.0.1");
    EXPECT_EQ(l->master_port, 1);
    EXPECT_EQ(l->run_token, "99.2");
    // without MASTER_ADDR and without a node list to take it from
    const std::string e = error_of(with(slurm, "MASTER_ADDR", nullptr));
    EXPECT_NE(e.find("MASTER_ADDR is not set"), std::string::npos) << e;
    EXPECT_NE(e.find("SLURM_NODELIST"), std::string::npos) << e;
    EXPECT_NE(error_of(with(slurm, "SLURM_NTASKS", nullptr)).find("SLURM_NTASKS is not set"), std::string::npos);
    EXPECT_NE(error_of(with(slurm, "SLURM_PROCID", "4")).find("SLURM_PROCID=4 is not a rank of SLURM_NTASKS=4"),
              std::string::npos);
}

// Without MASTER_ADDR / MASTER_PORT, Slurm mode finds rank 0 on the first host of the step's node
// list (compressed lists read) and derives the port from the job id.
TEST(CommLaunchEnv, SlurmMasterFromTheNodeListAndPortFromTheJob) {
    const Env slurm = {{"SLURM_PROCID", "0"},      {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_JOB_ID", "1234567"}, {"SLURM_JOB_NODELIST", "other[1-9]"},
                       {"SLURM_STEP_NODELIST", "gpu[007-012,020],cpu1"}};
    const auto l = detect(slurm);
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->master_addr, "gpu007");  // the step's list wins over the job's
    EXPECT_EQ(l->master_port, 20000 + 1234567 % 20000);
    // where they came from, for the rendezvous's lines and errors
    EXPECT_EQ(l->addr_from, "the first host of SLURM_STEP_NODELIST");
    EXPECT_EQ(l->port_from, "20000 + SLURM_JOB_ID % 20000");
    EXPECT_EQ(detect(with(slurm, "SLURM_STEP_NODELIST", nullptr))->addr_from, "the first host of SLURM_JOB_NODELIST");
    EXPECT_EQ(detect(with(slurm, "MASTER_PORT", "4000"))->port_from, "MASTER_PORT");
    EXPECT_EQ(detect(with(slurm, "MASTER_ADDR", "10.1.1.1"))->addr_from, "MASTER_ADDR");
    EXPECT_EQ(detect(with(slurm, "SLURM_STEP_NODELIST", nullptr))->master_addr, "other1");
    EXPECT_EQ(detect(with(with(slurm, "MASTER_ADDR", "10.1.1.1"), "MASTER_PORT", "4000"))->master_addr, "10.1.1.1");
    EXPECT_EQ(detect(with(slurm, "MASTER_PORT", "4000"))->master_port, 4000);
    EXPECT_EQ(detect(with(slurm, "SLURM_JOB_ID", nullptr))->master_port, 29500);
    EXPECT_EQ(comm::first_slurm_host("node1,node2"), "node1");
    EXPECT_EQ(comm::first_slurm_host("rack[2-3]-n[05,07-09]"), "rack2-n05");
    EXPECT_EQ(comm::first_slurm_host("solo"), "solo");
    for (const char* bad : {"", "[1-2]x]", "a[[1]]", "a[1-2"}) {
        try {
            comm::first_slurm_host(bad);
            ADD_FAILURE() << "'" << bad << "' was accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("SLURM nodelist"), std::string::npos) << e.what();
        }
    }
}

TEST(CommLaunchEnv, Precedence) {
    // mpirun's own variables win (detect_mpi_launch handles them); torchrun's win over Slurm's.
    EXPECT_FALSE(detect(with(kTorchrun, "OMPI_COMM_WORLD_RANK", "0")).has_value());
    const auto l = detect(with(with(kTorchrun, "SLURM_PROCID", "0"), "SLURM_NTASKS", "1"));
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->source, "torchrun");
    EXPECT_EQ(l->rank, 5);
}

TEST(CommLaunchEnv, BadValuesAreErrorsNamingTheVariable) {
    const struct {
        const char* name;
        const char* value;
        const char* message;
    } cases[] = {
        {"RANK", nullptr, "RANK is not set although WORLD_SIZE is"},
        {"WORLD_SIZE", nullptr, "WORLD_SIZE is not set although RANK is"},
        {"LOCAL_RANK", nullptr, "LOCAL_RANK is not set"},
        {"MASTER_ADDR", nullptr, "MASTER_ADDR is not set"},
        {"MASTER_PORT", nullptr, "MASTER_PORT is not set"},
        {"MASTER_PORT", "0", "MASTER_PORT='0' is not an integer in 1..65535"},
        {"MASTER_PORT", "65536", "MASTER_PORT='65536'"},
        {"MASTER_PORT", "29500x", "MASTER_PORT='29500x'"},
        {"RANK", "8", "RANK=8 is not a rank of WORLD_SIZE=8"},
        {"RANK", "-1", "RANK='-1'"},
        {"WORLD_SIZE", "0", "WORLD_SIZE='0'"},
        {"LOCAL_RANK", "6", "LOCAL_RANK=6 exceeds RANK=5"},
        {"LOCAL_WORLD_SIZE", "1", "LOCAL_RANK=1 is not a rank of LOCAL_WORLD_SIZE=1"},
    };
    for (const auto& c : cases) {
        const std::string e = error_of(with(kTorchrun, c.name, c.value));
        EXPECT_NE(e.find(c.message), std::string::npos)
            << c.name << "=" << (c.value ? c.value : "(unset)") << ": got '" << e << "'";
        EXPECT_NE(e.find("torchrun launch"), std::string::npos) << e;
    }
}

}  // namespace
}  // namespace qtrain::test
