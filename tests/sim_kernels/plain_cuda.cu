// A plain CUDA file, as a user writes one for nvcc: no emmy header, CUDA's own half header.
#include <cuda_fp16.h>

// Column sums of an f16 matrix read as __half2 pairs: a 2-D block of 32 x 4 threads walks
// rows in steps of 4, each warp reduces its partial by shuffles, warps meet in dynamic shared
// memory, and blocks combine by atomicAdd.
__global__ void column_pair_sums(const __half2* __restrict__ x, float* __restrict__ sums, int rows, int pairs) {
  extern __shared__ float partial[];  // [blockDim.y][2]
  const int pair = blockIdx.x;
  float lo = 0.0f, hi = 0.0f;
  for (int r = blockIdx.y * blockDim.y * 32 + threadIdx.y * 32 + threadIdx.x; r < rows;
       r += gridDim.y * blockDim.y * 32) {
    __half2 scaled = __hmul2(x[r * pairs + pair], __float2half2_rn(2.0f));
    float2 v = __half22float2(scaled);
    lo += v.x;
    hi += v.y;
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    lo += __shfl_down_sync(0xffffffffu, lo, offset);
    hi += __shfl_down_sync(0xffffffffu, hi, offset);
  }
  if (threadIdx.x == 0) {
    partial[2 * threadIdx.y] = lo;
    partial[2 * threadIdx.y + 1] = hi;
  }
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    float a = 0.0f, b = 0.0f;
    for (int w = 0; w < blockDim.y; ++w) {
      a += partial[2 * w];
      b += partial[2 * w + 1];
    }
    atomicAdd(&sums[2 * pair], a);
    atomicAdd(&sums[2 * pair + 1], b);
  }
}

// The same meeting without the barrier: thread (0, 0) reads what other warps write.
__global__ void racy_meeting(float* __restrict__ out) {
  extern __shared__ float partial[];
  if (threadIdx.x == 0) partial[threadIdx.y] = float(threadIdx.y);
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    float total = 0.0f;
    for (int w = 0; w < blockDim.y; ++w) total += partial[w];
    out[0] = total;
  }
}
