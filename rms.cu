#include "emmy_rt.cuh"

// k_rms_norm: row reduction 32 x 2048 with sweep
// knobs WORK=t1024,TILE=f2/v2,REDUCE=coop,STAGE=regs,RASTER=
// source ops: k_rms_norm writes rms_norm
extern "C" __global__ void __launch_bounds__(1024, 1) k_rms_norm(const float* __restrict__ g_w, const float* __restrict__ g_x, float* __restrict__ g_rms_norm) {
  __shared__ __align__(16) float sum_partials[32];

  // one block per row
  const int row = blockIdx.x;
  const int a0 = (row / 1) % 32;

  float acc0 = 0.0f;
  // a1 in 0..2048: 1024 thread(s) striding, 2-wide, 1 vector(s) a step
  emmy::Vec<2, float> in0_v_held[1][1];  // kept for the row's later loops
  {  // its own scope: a row has several element loops
  const int lo = 0, hi = 2048;
  // a constant count of steps, unrolled: the held vectors' indices are constants (registers)
#pragma unroll
  for (int held_step = 0; held_step < 1; ++held_step) {
    const int step = lo + held_step * 2048;
    if (step >= hi) break;
#pragma unroll
    for (int r = 0; r < 1; ++r) {
      const int base = step + (r * 1024 + threadIdx.x) * 2;
      if (base >= hi) break;
      const emmy::Vec<2, float> in0_v = emmy::load_vec<2>(&g_x[2048 * a0 + base]);
      in0_v_held[held_step][r] = in0_v;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        [[maybe_unused]] const int a1 = base + u;
        const float in0 = emmy::to_reg(in0_v.v[u]);
        const float v0 = (in0 * in0);
        acc0 = (acc0 + v0);
      }
    }
  }
  }
  // warp shuffles (sum): every lane ends with its warp's value; lane 0 leaves it in sum_partials
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float acc0_other = __shfl_xor_sync(0xffffffffu, acc0, offset);
    acc0 = acc0 + acc0_other;
  }
  if (threadIdx.x % 32 == 0) {
    sum_partials[threadIdx.x / 32 * 1 + 0] = acc0;
  }
  __syncthreads();
  // the first warp combines the 32 warp values (sum)
  if (threadIdx.x < 32) {
    float acc0_w = threadIdx.x < 32 ? sum_partials[threadIdx.x * 1 + 0] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float acc0_w_other = __shfl_xor_sync(0xffffffffu, acc0_w, offset);
      acc0_w = acc0_w + acc0_w_other;
    }
    if (threadIdx.x == 0) {
      sum_partials[0] = acc0_w;
    }
  }
  __syncthreads();

  acc0 = sum_partials[0];
  __syncthreads();

  const float v1 = (0.00048828125f * acc0);
  const float v2 = (1e-06f + v1);
  const float v3 = rsqrtf(v2);
  // a2 in 0..2048: 1024 thread(s) striding, 2-wide, 1 vector(s) a step
  {  // its own scope: a row has several element loops
  const int lo = 0, hi = 2048;
  // a constant count of steps, unrolled: the held vectors' indices are constants (registers)
#pragma unroll
  for (int held_step = 0; held_step < 1; ++held_step) {
    const int step = lo + held_step * 2048;
    if (step >= hi) break;
#pragma unroll
    for (int r = 0; r < 1; ++r) {
      const int base = step + (r * 1024 + threadIdx.x) * 2;
      if (base >= hi) break;
      const emmy::Vec<2, float> in1_v = emmy::load_vec<2>(&g_w[base]);
      const emmy::Vec<2, float> in2_v = in0_v_held[held_step][r];  // no second load
      emmy::Vec<2, float> rms_norm_s;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        [[maybe_unused]] const int a2 = base + u;
        const float in1 = emmy::to_reg(in1_v.v[u]);
        const float in2 = emmy::to_reg(in2_v.v[u]);
        const float v4 = (in2 * v3);
        const float v5 = (in1 * v4);
        rms_norm_s.v[u] = emmy::from_reg<float>(v5);
      }
      emmy::store_vec<2>(&g_rms_norm[2048 * a0 + base], rms_norm_s);
    }
  }
  }
}
