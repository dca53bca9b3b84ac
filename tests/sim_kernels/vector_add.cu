// c = a + b over n elements: one element per thread, the last block partly idle.
#include "emmy_rt.cuh"

__global__ void __launch_bounds__(256) vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                                  float* __restrict__ c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
