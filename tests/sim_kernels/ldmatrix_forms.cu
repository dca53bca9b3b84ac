// Every ldmatrix form (x1, x2, x4, each plain and .trans) on four 8x8 matrices of 16-bit values
// held in shared memory; lane l gives the address of row l (matrix l / 8, row l % 8) and writes
// the registers it receives to out[form][l][0..3] (unused registers stay 0).
#include "emmy_rt.cuh"

__global__ void ldmatrix_forms(const unsigned short* m, unsigned* out) {
  __shared__ __align__(16) unsigned short s[32][8];
  for (int i = threadIdx.x; i < 32 * 8; i += 32) s[i / 8][i % 8] = m[i];
  __syncwarp();
  const unsigned short* row = &s[threadIdx.x][0];
  unsigned* mine = out + threadIdx.x * 4;
  uint32_t r1[1], r2[2], r4[4];
  emmy::ldmatrix<1, false>(r1, row);
  mine[0 * 128] = r1[0];
  emmy::ldmatrix<1, true>(r1, row);
  mine[1 * 128] = r1[0];
  emmy::ldmatrix<2, false>(r2, row);
  for (int j = 0; j < 2; ++j) mine[2 * 128 + j] = r2[j];
  emmy::ldmatrix<2, true>(r2, row);
  for (int j = 0; j < 2; ++j) mine[3 * 128 + j] = r2[j];
  emmy::ldmatrix<4, false>(r4, row);
  for (int j = 0; j < 4; ++j) mine[4 * 128 + j] = r4[j];
  emmy::ldmatrix<4, true>(r4, row);
  for (int j = 0; j < 4; ++j) mine[5 * 128 + j] = r4[j];
  // a broadcast from lane 5, through the runtime header
  out[6 * 128 + threadIdx.x] = emmy::warp_broadcast(threadIdx.x * 3u, 5);
}
