// The CUDA driver API, loaded on first use.
//
// TVM's CUDA runtime module calls a handful of driver functions (cuModuleLoadData,
// cuLaunchKernel, ...). Linking libcuda.so.1 would make the plugin unloadable on the
// machines that only compile CUDA (CI, laptops): they have the toolkit from PyPI but no
// driver. So the plugin defines those functions itself; each one opens the driver the
// first time any of them runs and forwards to it, or fails with a TVM error that says
// the driver is missing. -Wl,-Bsymbolic binds the TVM sources' calls to these.
#include <cuda.h>
#include <dlfcn.h>
#include <tvm/runtime/logging.h>
#include <tvm/runtime/registry.h>

#include <mutex>
#include <string>

namespace tvm_tcutils {
namespace cuda {

struct Driver {
  void* handle = nullptr;
  std::string error;
};

// Opened once: dlopen is thread-safe, the once_flag keeps the error message stable.
static const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (d.handle == nullptr) {
      const char* why = dlerror();
      d.error = why ? why : "libcuda.so.1 not found";
    }
  });
  return d;
}

static void* symbol(const char* name) {
  const Driver& d = driver();
  if (d.handle == nullptr) {
    LOG(FATAL) << "the CUDA driver is not available on this machine (" << d.error
               << "): CUDA code can be compiled and saved here, but running it needs an NVIDIA GPU and its driver";
  }
  void* fn = dlsym(d.handle, name);
  ICHECK(fn != nullptr) << "the CUDA driver has no " << name << " (driver too old for this toolkit?)";
  return fn;
}

}  // namespace cuda
}  // namespace tvm_tcutils

// One forwarding definition per driver entry point TVM's runtime sources use; the
// names are cuda.h's (after its _v2 macros), so they match the callers' references.
#define TCUTILS_FORWARD(name, params, args)                                         \
  extern "C" CUresult CUDAAPI name params {                                         \
    using Fn = CUresult(CUDAAPI*) params;                                           \
    static Fn fn = reinterpret_cast<Fn>(tvm_tcutils::cuda::symbol(#name));          \
    return fn args;                                                                 \
  }

TCUTILS_FORWARD(cuDeviceGetName, (char* name, int len, CUdevice dev), (name, len, dev))
TCUTILS_FORWARD(cuFuncSetAttribute, (CUfunction f, CUfunction_attribute attrib, int value),
                (f, attrib, value))
TCUTILS_FORWARD(cuLaunchKernel,
                (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                 unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,
                 void** params, void** extra),
                (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
TCUTILS_FORWARD(cuMemsetD32, (CUdeviceptr dst, unsigned int value, size_t n), (dst, value, n))
TCUTILS_FORWARD(cuModuleGetFunction, (CUfunction * f, CUmodule mod, const char* name), (f, mod, name))
TCUTILS_FORWARD(cuModuleGetGlobal, (CUdeviceptr * ptr, size_t* bytes, CUmodule mod, const char* name),
                (ptr, bytes, mod, name))
TCUTILS_FORWARD(cuModuleLoadData, (CUmodule * mod, const void* image), (mod, image))
TCUTILS_FORWARD(cuModuleUnload, (CUmodule mod), (mod))

// Error names are asked for while reporting another failure: answer even without a driver.
extern "C" CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  const tvm_tcutils::cuda::Driver& d = tvm_tcutils::cuda::driver();
  if (d.handle == nullptr) {
    *str = "CUDA_ERROR_NO_DRIVER";
    return CUDA_SUCCESS;
  }
  using Fn = CUresult(CUDAAPI*)(CUresult, const char**);
  static Fn fn = reinterpret_cast<Fn>(tvm_tcutils::cuda::symbol("cuGetErrorName"));
  return fn(error, str);
}

// "" when the driver loads, else why not: `tvm-tcutils info` and the tests read it.
TVM_REGISTER_GLOBAL("tvm_tcutils.cuda.driver_error").set_body_typed([]() {
  return tvm::runtime::String(tvm_tcutils::cuda::driver().error);
});
