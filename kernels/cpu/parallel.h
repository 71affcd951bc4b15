// OpenMP helpers shared by the CPU kernels.
#pragma once

#include <omp.h>

#include <cstdint>

#include "../geometry.h"

namespace tinygpt::cpu {

/// Below this many elements a loop runs on one thread: starting a team costs more than it saves.
inline constexpr int64_t kParallelGrain = 1 << 14;

}  // namespace tinygpt::cpu
