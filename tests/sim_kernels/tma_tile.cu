// sm_90: a 16 x 32 tile of a row-major f32 matrix per block, loaded by TMA into shared memory
// and completed on an mbarrier; every thread waits on the barrier, then writes twice the tile
// out. Tiles past the matrix's edge come back zero-filled and are not written.
#include "emmy_rt.cuh"

__global__ void tma_tile_double(const __grid_constant__ CUtensorMap map, float* out, int rows, int cols) {
  __shared__ __align__(128) float tile[16][32];
  __shared__ __align__(8) uint64_t bar;
  const int r0 = blockIdx.y * 16, c0 = blockIdx.x * 32;
  if (threadIdx.x == 0) emmy::mbarrier_init(&bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    emmy::mbarrier_arrive_expect_tx(&bar, sizeof(tile));
    emmy::tma_load_2d(&tile[0][0], &map, c0, r0, &bar);
  }
  emmy::mbarrier_wait(&bar, 0);
  for (int i = threadIdx.x; i < 16 * 32; i += blockDim.x) {
    const int r = r0 + i / 32, c = c0 + i % 32;
    if (r < rows && c < cols) out[r * cols + c] = 2.0f * tile[i / 32][i % 32];
  }
}
