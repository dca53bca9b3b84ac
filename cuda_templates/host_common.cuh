// host_common.cuh: what every GPU host library emmy builds exports through ctypes (emmy/gpu.py):
// allocation, copies, the device, error text and TMA descriptors. The per-program library
// (host_library.cu.j2) and the cubin loader (module_loader.cu) both include it. Driver-API results
// travel as DRIVER_RESULT + the CUresult, so one error code space holds both APIs' reasons.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

constexpr int DRIVER_RESULT = 100000;

// A driver function through the runtime: no link against libcuda (absent where the library is built).
template <class F>
inline cudaError_t emmy_driver_function(const char* name, F** out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) return e;
  if (!fn || found != cudaDriverEntryPointSuccess) return cudaErrorSymbolNotFound;
  *out = reinterpret_cast<F*>(fn);
  return cudaSuccess;
}

inline int emmy_from_driver(CUresult r) { return r == CUDA_SUCCESS ? 0 : DRIVER_RESULT + (int)r; }

extern "C" int emmy_gpu_alloc(void** p, size_t n) { return (int)cudaMalloc(p, n); }
extern "C" int emmy_gpu_free(void* p) { return (int)cudaFree(p); }
extern "C" int emmy_gpu_put(void* d, const void* h, size_t n) { return (int)cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); }
extern "C" int emmy_gpu_get(void* h, const void* d, size_t n) { return (int)cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }
extern "C" int emmy_gpu_fill(void* d, int byte, size_t n) {
  cudaError_t e = cudaMemset(d, byte, n);
  return (int)(e == cudaSuccess ? cudaDeviceSynchronize() : e);
}
// Which GPU the following calls use (a program called on tensors of cuda:N runs on device N).
extern "C" int emmy_gpu_set_device(int device) { return (int)cudaSetDevice(device); }
extern "C" const char* emmy_gpu_error(int rc) {
  if (rc < DRIVER_RESULT) return cudaGetErrorString((cudaError_t)rc);
  decltype(&cuGetErrorString) text;
  const char* reason = nullptr;
  if (emmy_driver_function("cuGetErrorString", &text) != cudaSuccess || text((CUresult)(rc - DRIVER_RESULT), &reason))
    return "a CUDA driver error";
  return reason;
}
extern "C" int emmy_gpu_arch(int* major, int* minor) {
  int device = 0;
  int rc = (int)cudaGetDevice(&device);
  if (rc) return rc;
  rc = (int)cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  return rc ? rc : (int)cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
}
extern "C" int emmy_gpu_tensormap(void* out, void* base, unsigned long rows, unsigned long cols,
                                  unsigned long row_bytes, unsigned box_rows, unsigned box_cols, unsigned element_bytes) {
  cuuint64_t dims[2] = {cols, rows}, strides[1] = {row_bytes};
  cuuint32_t box[2] = {box_cols, box_rows}, unit[2] = {1, 1};
  decltype(&cuTensorMapEncodeTiled) encode;
  if (emmy_driver_function("cuTensorMapEncodeTiled", &encode) != cudaSuccess) return -1;
  // the copy is bitwise: only the element size matters (bf16 travels as 16-bit integers)
  const CUtensorMapDataType type = element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return emmy_from_driver(encode((CUtensorMap*)out, type, 2, base, dims, strides, box, unit,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// `reps` samples, each `batch` back-to-back launches (`enqueue()`, returning a CUDA status) between two
// events, the `flush_bytes` at `flush` overwritten before each (so the L2 holds none of the kernel's
// data); ms[i]: sample i's time per launch. Both host libraries time kernels through it.
template <class Enqueue>
inline int emmy_samples(Enqueue enqueue, int reps, int batch, void* flush, size_t flush_bytes, float* ms) {
  int rc = 0;
  cudaEvent_t* events = new cudaEvent_t[2 * reps];
  int made = 0;
  for (; made < 2 * reps && rc == 0; ++made) rc = (int)cudaEventCreate(&events[made]);
  for (int r = 0; r < reps && rc == 0; ++r) {
    if (flush_bytes) rc = (int)cudaMemsetAsync(flush, r & 0xff, flush_bytes, 0);
    if (rc == 0) rc = (int)cudaEventRecord(events[2 * r], 0);
    for (int i = 0; i < batch && rc == 0; ++i) rc = enqueue();
    if (rc == 0) rc = (int)cudaEventRecord(events[2 * r + 1], 0);
  }
  if (rc == 0) rc = (int)cudaDeviceSynchronize();
  for (int r = 0; r < reps && rc == 0; ++r) {
    rc = (int)cudaEventElapsedTime(&ms[r], events[2 * r], events[2 * r + 1]);
    ms[r] /= (float)batch;
  }
  for (int i = 0; i < made; ++i) cudaEventDestroy(events[i]);
  delete[] events;
  return rc ? rc : (int)cudaGetLastError();
}
