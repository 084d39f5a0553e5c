// Identification of the native helper library, so that Python can check that the
// library it loaded is the one it expects (and that registration through TVM's
// registry works with the wheel's libtvm.so).
#include <tvm/runtime/packed_func.h>
#include <tvm/runtime/registry.h>

#include <string>

namespace tvm_tcutils {

// Bumped whenever a packed function's signature changes.
constexpr int kAbiVersion = 2;

TVM_REGISTER_GLOBAL("tvm_tcutils.native.abi_version").set_body_typed([]() { return kAbiVersion; });

}  // namespace tvm_tcutils
