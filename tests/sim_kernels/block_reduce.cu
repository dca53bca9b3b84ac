// Row sums: one block per row; each thread strides over the row, then the
// block combines by warp shuffles and a shared-memory tree.
#include "emmy_rt.cuh"

__global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ float scratch[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
  float total = emmy::block_reduce<emmy::Sum>(acc, scratch, 0.0f);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// The same by hand: shuffles down, then a tree over the warp sums in shared memory.
__global__ void row_max_tree(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ float warp_max[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  for (int half = warps / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) warp_max[threadIdx.x] = fmaxf(warp_max[threadIdx.x], warp_max[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = warp_max[0];
}
