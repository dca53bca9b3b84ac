// emmy::rescale_exp and expf over n values, one a thread: on a GPU, rescale_exp (fused multiply-adds
// only) must match the simulator bit for bit, and expf (the special-function unit's ex2) shows its
// lean, which the one-pass softmax keeps out of its sum (emmy/egraph/lowering.py, _online_sum).
#include "emmy_rt.cuh"

__global__ void __launch_bounds__(256) exp_forms(const float* __restrict__ x, float* __restrict__ rescaled,
                                                 float* __restrict__ special, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    rescaled[i] = emmy::rescale_exp(x[i]);
    special[i] = expf(x[i]);
  }
}
