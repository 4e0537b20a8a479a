// Which CUDA device each rank of a run uses (ModelOptions::device_index; the GPU model makes it
// current). --gpu-ids lists one device per rank; without it, threads mode puts rank r on device r and
// mpirun puts each process on its local rank (the usual one-process-per-GPU layout of a node).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace qtrain {

// --gpu-ids' value: comma-separated non-negative device indices ("0,1,2,3"; repeats allowed, "0,0"
// puts two ranks on one device). A qtrain::Error naming the flag for anything else.
std::vector<int> parse_gpu_ids(const std::string& value);

// The number of entries must be the number of ranks: an error naming --gpu-ids and `ranks_source`
// (how the rank count was given, e.g. "--gpus=2" or "mpirun -np 2") otherwise. Empty ids pass.
void check_gpu_ids_count(const std::vector<int>& ids, int world, const std::string& ranks_source);

// The device of rank `rank` of `world`: ids[rank] when --gpu-ids was given, else `mpi_local_rank`
// under mpirun, else `rank`.
int rank_device_index(const std::vector<int>& ids, int rank, std::optional<int> mpi_local_rank);

}  // namespace qtrain
