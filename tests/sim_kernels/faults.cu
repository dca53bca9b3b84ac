// Kernels with planted bugs: the simulator must name each one and never hang.
#include "emmy_rt.cuh"

// No tail check: the last block reads and writes past the end of the arrays.
__global__ void add_no_tail_check(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  c[i] = a[i] + b[i];
}

// Reverses each block's slice through shared memory, without the barrier
// between the writes and the reads of other threads' elements.
__global__ void reverse_missing_sync(const float* x, float* y) {
  __shared__ float tile[128];
  tile[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  y[blockIdx.x * blockDim.x + threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

// The same with the barrier: correct.
__global__ void reverse(const float* x, float* y) {
  __shared__ float tile[128];
  tile[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

// A barrier only half the block reaches.
__global__ void sync_in_branch(float* y) {
  if (threadIdx.x < 16) {
    __syncthreads();
  }
  y[threadIdx.x] = 1.0f;
}

// Two different barriers in the two arms of a branch.
__global__ void sync_in_both_arms(float* y) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  y[threadIdx.x] = 1.0f;
}

// A warp shuffle that half of the warp skips.
__global__ void shuffle_in_branch(float* y) {
  float v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
  y[threadIdx.x] = v;
}
