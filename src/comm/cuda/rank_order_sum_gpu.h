// The GPU twin of comm/rank_order_sum.h, for the GPU backends: element i of the output is
// ((x_0[i] + x_1[i]) + x_2[i]) + ... in rank order, in fp32, rounded once to the dtype (bf16: to
// nearest even, NaN kept quiet, exactly as core's float_to_bf16), so a GPU rank gets the bits the CPU
// function gives. Of the n sources one is the rank's own buffer, read where it is; the other n - 1
// are its peers' blocks, copied one after another into the backend's staging buffer
// (comm/block_layout.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/dtype.h"

namespace qtrain::comm {

struct RankOrderSources {
    int n = 1;                      // sources (the world size)
    int own_rank = 0;               // which source is `own`
    const void* own = nullptr;      // source own_rank
    const void* staging = nullptr;  // the others, in rank order, `stride` elements apart
    std::size_t stride = 0;
};

// Queues out[i] = the rank-order sum of the sources' element i, i < count, on `stream`. dtype is F32
// or BF16. `out` may be `own` exactly (each element is read before it is written); it must not
// overlap a staging slot.
void sum_in_rank_order_gpu(const RankOrderSources& sources, std::size_t count, DType dtype, void* out,
                           cudaStream_t stream);

}  // namespace qtrain::comm
