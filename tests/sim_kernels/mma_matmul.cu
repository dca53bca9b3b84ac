// C (f32, M x N) = A (M x K, row-major) @ B (K x N, row-major), f16 or bf16 operands, on
// tensor cores: one warp per 16 x 8 tile of C; per 16-wide K step the warp stages A's
// 16 x 16 and B's 16 x 8 tiles in shared memory, loads A with ldmatrix.x4 and B with
// ldmatrix.x2.trans into mma fragments and issues one m16n8k16 mma.
#include "emmy_rt.cuh"

template <class T, bool BF16>
__device__ void mma_tile(const T* a, const T* b, float* c, int n, int k) {
  __shared__ __align__(16) T a_s[16][16];
  __shared__ __align__(16) T b_s[16][8];
  const int lane = threadIdx.x, row0 = blockIdx.y * 16, col0 = blockIdx.x * 8;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < k; k0 += 16) {
    for (int i = lane; i < 16 * 16; i += 32) a_s[i / 16][i % 16] = a[(row0 + i / 16) * k + k0 + i % 16];
    for (int i = lane; i < 16 * 8; i += 32) b_s[i / 8][i % 8] = b[(k0 + i / 8) * n + col0 + i % 8];
    __syncwarp();
    uint32_t a_frag[4], b_frag[2];
    // lane l gives row (l % 8) + 8 ((l / 8) % 2), column 8 (l / 16) of A: matrices in fragment order
    emmy::ldmatrix<4, false>(a_frag, &a_s[lane % 8 + 8 * ((lane / 8) % 2)][8 * (lane / 16)]);
    // lanes 0-15 give the rows k = 0..15 of B (k-major): transposed, each lane holds two k of one n
    emmy::ldmatrix<2, true>(b_frag, &b_s[lane % 16][0]);
    if constexpr (BF16)
      emmy::mma_m16n8k16_bf16_f32(acc, a_frag, b_frag, acc);
    else
      emmy::mma_m16n8k16_f16_f32(acc, a_frag, b_frag, acc);
    __syncwarp();
  }
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) c[(row0 + g + 8 * (i / 2)) * n + col0 + 2 * t + i % 2] = acc[i];
}

__global__ void mma_matmul_f16(const __half* a, const __half* b, float* c, int n, int k) {
  mma_tile<__half, false>(a, b, c, n, k);
}

__global__ void mma_matmul_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c, int n, int k) {
  mma_tile<__nv_bfloat16, true>(a, b, c, n, k);
}
