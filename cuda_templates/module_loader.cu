// module_loader.cu: kernels from a cubin, loaded and launched through the CUDA driver API, for the
// tuner (emmy/gpu.py ModuleGpu). One library serves every cubin, so a candidate needs only its
// device code (emmy/batch_build.py builds many in one nvcc call) and no host library of its own.
// The driver functions come through the runtime (host_common.cuh), which also makes its primary
// context current: allocations by emmy_gpu_alloc and the loaded modules share it.
#include "host_common.cuh"

extern "C" int emmy_module_load(const char* path, void** module) {
  cudaError_t e = cudaFree(nullptr);  // the runtime's primary context, current on this thread
  decltype(&cuModuleLoad) load;
  if (e == cudaSuccess) e = emmy_driver_function("cuModuleLoad", &load);
  return e != cudaSuccess ? (int)e : emmy_from_driver(load(reinterpret_cast<CUmodule*>(module), path));
}

extern "C" int emmy_module_unload(void* module) {
  decltype(&cuModuleUnload) unload;
  cudaError_t e = emmy_driver_function("cuModuleUnload", &unload);
  return e != cudaSuccess ? (int)e : emmy_from_driver(unload(static_cast<CUmodule>(module)));
}

extern "C" int emmy_module_function(void* module, const char* name, void** function) {
  decltype(&cuModuleGetFunction) get;
  cudaError_t e = emmy_driver_function("cuModuleGetFunction", &get);
  return e != cudaSuccess ? (int)e
                          : emmy_from_driver(get(reinterpret_cast<CUfunction*>(function), static_cast<CUmodule>(module), name));
}

// One launch on the legacy default stream; a kernel with grid barriers launches cooperatively (the
// driver refuses a grid whose blocks cannot all be resident rather than deadlock).
static int emmy_module_enqueue(void* function, const unsigned* g, const unsigned* b, unsigned long smem, void** argv,
                               int cooperative) {
  CUfunction f = static_cast<CUfunction>(function);
  if (smem > 48 * 1024) {
    decltype(&cuFuncSetAttribute) set;
    cudaError_t e = emmy_driver_function("cuFuncSetAttribute", &set);
    if (e != cudaSuccess) return (int)e;
    if (int rc = emmy_from_driver(set(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem))) return rc;
  }
  if (cooperative) {
    decltype(&cuLaunchCooperativeKernel) launch;
    cudaError_t e = emmy_driver_function("cuLaunchCooperativeKernel", &launch);
    return e != cudaSuccess ? (int)e
                            : emmy_from_driver(launch(f, g[0], g[1], g[2], b[0], b[1], b[2], (unsigned)smem, nullptr, argv));
  }
  decltype(&cuLaunchKernel) launch;
  cudaError_t e = emmy_driver_function("cuLaunchKernel", &launch);
  return e != cudaSuccess ? (int)e
                          : emmy_from_driver(launch(f, g[0], g[1], g[2], b[0], b[1], b[2], (unsigned)smem, nullptr, argv,
                                                    nullptr));
}

extern "C" int emmy_module_launch(void* function, const unsigned* g, const unsigned* b, unsigned long smem, void** argv,
                                  int cooperative) {
  int rc = emmy_module_enqueue(function, g, b, smem, argv, cooperative);
  return rc ? rc : (int)cudaDeviceSynchronize();
}

// timed samples of one kernel (host_common.cuh: emmy_samples)
extern "C" int emmy_module_samples(void* function, const unsigned* g, const unsigned* b, unsigned long smem,
                                   void** argv, int cooperative, int reps, int batch, void* flush, size_t flush_bytes,
                                   float* ms) {
  return emmy_samples([&] { return emmy_module_enqueue(function, g, b, smem, argv, cooperative); }, reps, batch, flush,
                      flush_bytes, ms);
}
