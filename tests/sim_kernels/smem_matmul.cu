// C = A @ B (row-major, M x K times K x N), 16 x 16 tiles staged through shared
// memory, one output element per thread; edges handled by zero padding.
#include "emmy_rt.cuh"

#define TILE 16

__global__ void smem_matmul(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                            int m, int n, int k) {
  __shared__ float a_tile[TILE][TILE + 1];
  __shared__ float b_tile[TILE][TILE + 1];
  const int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < k; k0 += TILE) {
    a_tile[threadIdx.y][threadIdx.x] = (row < m && k0 + threadIdx.x < k) ? a[row * k + k0 + threadIdx.x] : 0.0f;
    b_tile[threadIdx.y][threadIdx.x] = (col < n && k0 + threadIdx.y < k) ? b[(k0 + threadIdx.y) * n + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TILE; ++kk) acc += a_tile[threadIdx.y][kk] * b_tile[kk][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = acc;
}
