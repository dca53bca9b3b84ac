// The simulator's stand-in for CUDA's <cuda_bf16.h>: plain CUDA files include it as nvcc's would.
#pragma once
#include "emmy_sim.h"
