// Row sums streamed through a 3-stage cp.async pipeline: each block owns a row; a stage holds
// blockDim.x * 4 floats (one 16-byte cp.async per thread, zero-filled past the row's end).
// Thread i sums the elements other threads copied (i, i + blockDim.x, ...), so each stage needs
// the wait, then a barrier before it is read and another before it is refilled.
#include "emmy_rt.cuh"

__global__ void pipelined_row_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  extern __shared__ __align__(16) float stages[];  // 3 stages of blockDim.x * 4 floats
  __shared__ float scratch[32];
  const int per_stage = blockDim.x * 4, tiles = (cols + per_stage - 1) / per_stage;
  const float* row = x + (size_t)blockIdx.x * cols;
  float acc = 0.0f;
  for (int t = 0; t < 2; ++t) {  // prologue: two stages in flight
    const int col = t * per_stage + threadIdx.x * 4, valid = t < tiles ? cols - col : 0;
    emmy::cp_async<16>(&stages[(t % 3) * per_stage + threadIdx.x * 4], row + (valid > 0 ? col : 0),
                       valid >= 4 ? 16u : (valid > 0 ? 4u * valid : 0u));
    emmy::cp_async_commit();
  }
  for (int t = 0; t < tiles; ++t) {
    const int next = t + 2, col = next * per_stage + threadIdx.x * 4, valid = next < tiles ? cols - col : 0;
    emmy::cp_async<16>(&stages[(next % 3) * per_stage + threadIdx.x * 4], row + (valid > 0 ? col : 0),
                       valid >= 4 ? 16u : (valid > 0 ? 4u * valid : 0u));
    emmy::cp_async_commit();  // groups past the end are empty copies: the wait count stays uniform
    emmy::cp_async_wait<2>();  // stage t has landed (for this thread's copies)
    __syncthreads();           // ... and for every thread's
    for (int j = 0; j < 4; ++j) acc += stages[(t % 3) * per_stage + j * blockDim.x + threadIdx.x];
    __syncthreads();  // stage t is read: it may be refilled
  }
  emmy::cp_async_wait<0>();
  const float total = emmy::block_reduce<emmy::Sum>(acc, scratch, 0.0f);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}
