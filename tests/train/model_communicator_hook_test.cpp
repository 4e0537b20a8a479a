// The hook for a model communicator of its own (backends/model_backends.h, ModelCommunicatorFactory), as
// the GPU model's NCCL one will plug in: the trainer calls it once per rank with the host
// communicator and the rank's device; the model's collectives then go over what it returned, while the
// trainer's own agreements (the start, each step's agreement, evaluation, checkpoints) stay on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "comm/thread_communicator.h"
#include "comm/thread_world.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"
#include "train/trainer.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

namespace {

struct Counts {
    std::atomic<int> all_reduce{0}, reduce_scatter{0}, reduce{0}, all_gather{0}, broadcast{0}, barrier{0};
};

// Passes every collective on to `inner`, counting them.
class CountingCommunicator : public comm::Communicator {
public:
    CountingCommunicator(std::unique_ptr<comm::Communicator> inner, Counts& counts)
        : inner_(std::move(inner)), counts_(counts) {}
    int rank() const override { return inner_->rank(); }
    int world() const override { return inner_->world(); }
    std::string backend() const override { return "counting " + inner_->backend(); }

protected:
    void do_all_reduce(const void* s, void* r, std::size_t n, DType t, void* st) override {
        ++counts_.all_reduce;
        inner_->all_reduce(s, r, n, t, st);
    }
    void do_reduce_scatter(const void* s, void* r, std::size_t n, DType t, void* st) override {
        ++counts_.reduce_scatter;
        inner_->reduce_scatter(s, r, n, t, st);
    }
    void do_reduce(const void* s, void* r, std::size_t n, DType t, int root, void* st) override {
        ++counts_.reduce;
        inner_->reduce(s, r, n, t, root, st);
    }
    void do_all_gather(const void* s, void* r, std::size_t n, DType t, void* st) override {
        ++counts_.all_gather;
        inner_->all_gather(s, r, n, t, st);
    }
    void do_broadcast(void* b, std::size_t n, DType t, int root, void* st) override {
        ++counts_.broadcast;
        inner_->broadcast(b, n, t, root, st);
    }
    void do_barrier() override {
        ++counts_.barrier;
        inner_->barrier();
    }

private:
    std::unique_ptr<comm::Communicator> inner_;
    Counts& counts_;
};

TrainOptions parse(const std::string& command_line) {
    std::vector<std::string> words;
    std::istringstream in(command_line);
    for (std::string w; in >> w;) words.push_back(w);
    std::vector<const char*> argv;
    for (const auto& w : words) argv.push_back(w.c_str());
    TrainOptions o;
    EXPECT_FALSE(parse_train_options(static_cast<int>(argv.size()), argv.data(), o).has_value()) << command_line;
    return o;
}

struct Call {
    int rank, device_index;
    std::string host_backend;
};

}  // namespace

TEST(ModelCommunicatorHook, EachRanksModelUsesWhatTheHookReturnsAndTheTrainerTheHost) {
    Fixture f;
    const std::string common = " --steps=4 --eval-every-n-steps=2 --ckpt-interval=2 --gpus=2";
    auto plain = run_command("timeout 120 " + f.base_cmd("plain") + common);
    ASSERT_EQ(plain.exit_code, 0) << plain.output;

    Counts counts;
    comm::ThreadWorld model_world(2);  // the models' own world, apart from the trainer's
    std::mutex mutex;
    std::vector<Call> calls;
    Trainer trainer(parse(f.base_cmd("hooked") + common));
    trainer.set_model_communicator_factory([&](comm::Communicator& host, int device_index) {
        {
            std::lock_guard lock(mutex);
            calls.push_back({host.rank(), device_index, host.backend()});
        }
        return std::make_unique<CountingCommunicator>(comm::make_thread_communicator(model_world, host.rank()),
                                                      counts);
    });
    ASSERT_EQ(trainer.run(), 0);

    ASSERT_EQ(calls.size(), 2u);
    std::sort(calls.begin(), calls.end(), [](const Call& a, const Call& b) { return a.rank < b.rank; });
    for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(calls[r].rank, r);
        EXPECT_EQ(calls[r].device_index, r) << "threads mode's default: rank r on device r";
        EXPECT_EQ(calls[r].host_backend, "threads");
    }
    // both ranks' models summed their gradients over it (ZeRO-1: an all-reduce per step each) ...
    EXPECT_GE(counts.all_reduce.load(), 2 * 4);
    EXPECT_GT(counts.all_gather.load(), 0);
    // ... and nothing of the trainer's came its way: its start broadcast and checkpoint barriers
    EXPECT_EQ(counts.broadcast.load(), 0);
    EXPECT_EQ(counts.barrier.load(), 0);
    // the same sums in the same order: the same run
    EXPECT_EQ(step_losses(f.dir / "hooked/log.jsonl"), step_losses(f.dir / "plain/log.jsonl"));
    EXPECT_EQ(event_values(f.dir / "hooked/log.jsonl", "eval", "loss"),
              event_values(f.dir / "plain/log.jsonl", "eval", "loss"));
    EXPECT_EQ(read_file(f.dir / "hooked/model.safetensors"), read_file(f.dir / "plain/model.safetensors"));
}

TEST(ModelCommunicatorHook, OneRankHasNoModelCommunicator) {
    Fixture f;
    int calls = 0;
    Trainer trainer(parse(f.base_cmd("one") + " --steps=2 --eval-every-n-steps=0"));
    trainer.set_model_communicator_factory([&](comm::Communicator&, int) {
        ++calls;
        return std::unique_ptr<comm::Communicator>();
    });
    ASSERT_EQ(trainer.run(), 0);
    EXPECT_EQ(calls, 0);
}
