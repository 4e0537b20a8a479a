// The one summation every backend uses, so "the sum over ranks" means the same bits everywhere: for
// each element, acc = x_0; acc += x_1; ...; acc += x_{n-1} in fp32 (ranks in order), then one rounding
// to the buffer's dtype (none for fp32; nearest even for bf16). Backends that cannot make their
// library sum in this order move the raw blocks instead and call this locally.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace qtrain::comm {

// out[i] = sources[0][i] + sources[1][i] + ... + sources[n-1][i], i < count, as above. `dtype` is F32
// or BF16. `out` may be one of the sources exactly (in place); it must not partly overlap any.
void sum_in_rank_order(const void* const* sources, int n, std::size_t count, DType dtype, void* out);

}  // namespace qtrain::comm
