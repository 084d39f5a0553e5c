// CUDA C++ to machine code with NVRTC, for an architecture named by the caller.
//
// TVM's own NVRTC path (build_cuda_on.cc) compiles to PTX for the architecture of GPU 0,
// and falls back to compute_30, which CUDA 12+ rejects, where there is no GPU. The
// package's `tvm_callback_cuda_compile` calls this instead, with the target's -arch, so
// a machine without a GPU produces the same cubin as one with it.
#include <nvrtc.h>
#include <tvm/runtime/logging.h>
#include <tvm/runtime/packed_func.h>
#include <tvm/runtime/registry.h>

#include <string>
#include <vector>

namespace tvm_tcutils {
namespace cuda {

// Bumped whenever a packed function's signature changes (checked by tvm_tcutils/cuda.py).
constexpr int kAbiVersion = 1;

#define TCUTILS_NVRTC(call)                                                             \
  do {                                                                                  \
    nvrtcResult status = (call);                                                        \
    ICHECK_EQ(status, NVRTC_SUCCESS) << #call << ": " << nvrtcGetErrorString(status);   \
  } while (0)

// Owns the program so that every exit path, the LOG(FATAL) ones included, frees it.
struct Program {
  nvrtcProgram prog = nullptr;
  ~Program() {
    if (prog != nullptr) nvrtcDestroyProgram(&prog);
  }
};

// Returns the cubin for `arch` (e.g. "sm_80"); on a compile error, fails with NVRTC's log.
static std::string CompileToCubin(const std::string& code, const std::string& arch,
                                  const std::string& include_dir, const std::string& name) {
  Program p;
  TCUTILS_NVRTC(nvrtcCreateProgram(&p.prog, code.c_str(), name.c_str(), 0, nullptr, nullptr));
  // A real architecture (sm_XX, not compute_XX) makes NVRTC emit SASS, not PTX.
  std::vector<std::string> options = {"--gpu-architecture=" + arch, "--std=c++17"};
  if (!include_dir.empty()) options.push_back("--include-path=" + include_dir);
  std::vector<const char*> argv;
  for (const std::string& option : options) argv.push_back(option.c_str());
  nvrtcResult compiled = nvrtcCompileProgram(p.prog, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  TCUTILS_NVRTC(nvrtcGetProgramLogSize(p.prog, &log_size));
  std::string log(log_size, '\0');
  if (log_size > 0) TCUTILS_NVRTC(nvrtcGetProgramLog(p.prog, &log[0]));
  ICHECK_EQ(compiled, NVRTC_SUCCESS) << "NVRTC could not compile " << name << " for " << arch
                                     << ":\n" << log;
  size_t size = 0;
  TCUTILS_NVRTC(nvrtcGetCUBINSize(p.prog, &size));
  std::string cubin(size, '\0');
  TCUTILS_NVRTC(nvrtcGetCUBIN(p.prog, &cubin[0]));
  return cubin;
}

TVM_REGISTER_GLOBAL("tvm_tcutils.cuda.abi_version").set_body_typed([]() { return kAbiVersion; });

TVM_REGISTER_GLOBAL("tvm_tcutils.cuda.nvrtc_version").set_body_typed([]() {
  int major = 0, minor = 0;
  TCUTILS_NVRTC(nvrtcVersion(&major, &minor));
  return tvm::runtime::String(std::to_string(major) + "." + std::to_string(minor));
});

// (code, arch, include_dir) -> bytes: the cubin.
TVM_REGISTER_GLOBAL("tvm_tcutils.cuda.nvrtc_compile")
    .set_body([](tvm::runtime::TVMArgs args, tvm::runtime::TVMRetValue* rv) {
      std::string code = args[0];
      std::string arch = args[1];
      std::string include_dir = args[2];
      std::string cubin = CompileToCubin(code, arch, include_dir, "tvm_kernels.cu");
      TVMByteArray bytes{cubin.data(), cubin.size()};
      *rv = bytes;
    });

}  // namespace cuda
}  // namespace tvm_tcutils
