// A runtime module for one partition of a library-style Collage toolchain (onnxruntime, OpenVINO, BLAS).
//
// The Python path (tvm_tcutils/collage/toolchains/packed_call.py) compiles, per partition, a small TIR
// function with LLVM whose body calls the toolchain's `run` packed function with the partition's key and
// tensors, and `load` with the embedded payload when `run` answers that the key is unknown. That is
// 40-60 ms of lowering and code generation per partition: a BERT-base whose greedy onnxruntime
// partitioning has 373 partitions spent 25 s of its 53 s relay.build there. This module does the same
// calls without generating code: it holds the symbol, the two packed-function names, the key and the
// payload, and forwards the executor's arguments as they are (tensors as DLTensor handles, after the key).
//
// It is binary-serializable (export_library keeps it in the library's module blob), and loading such a
// library needs this plugin: `runtime.module.loadbinary_tcutils_packed_call` is registered here.
#include <dmlc/io.h>
#include <tvm/runtime/module.h>
#include <tvm/runtime/packed_func.h>
#include <tvm/runtime/registry.h>

#include <string>
#include <utility>
#include <vector>

namespace tvm_tcutils {

using tvm::runtime::Module;
using tvm::runtime::ModuleNode;
using tvm::runtime::ModulePropertyMask;
using tvm::runtime::Object;
using tvm::runtime::ObjectPtr;
using tvm::runtime::PackedFunc;
using tvm::runtime::String;
using tvm::runtime::TVMArgs;
using tvm::runtime::TVMRetValue;

namespace {

// Layout of the serialized module; a reader refuses a layout it does not know.
constexpr uint32_t kFormat = 1;

const PackedFunc& Required(const std::string& name) {
  const PackedFunc* func = tvm::runtime::Registry::Get(name);
  ICHECK(func != nullptr) << "tcutils_packed_call: packed function '" << name
                          << "' is not registered (import tvm_tcutils in this process)";
  return *func;
}

class PackedCallModuleNode final : public ModuleNode {
 public:
  PackedCallModuleNode(std::string symbol, std::string run, std::string load, std::string key,
                       std::string payload, int64_t inputs, int64_t lifted)
      : symbol_(std::move(symbol)),
        run_(std::move(run)),
        load_(std::move(load)),
        key_(std::move(key)),
        payload_(std::move(payload)),
        inputs_(inputs),
        lifted_(lifted) {}

  const char* type_key() const final { return "tcutils_packed_call"; }

  int GetPropertyMask() const final {
    return ModulePropertyMask::kBinarySerializable | ModulePropertyMask::kRunnable;
  }

  PackedFunc GetFunction(const String& name, const ObjectPtr<Object>& sptr_to_self) final {
    if (name == "tcutils_packed_call_fields") {
      // For tests: what the module holds (not the payload, which may be large).
      return PackedFunc([sptr_to_self, this](TVMArgs, TVMRetValue* rv) {
        *rv = symbol_ + "\n" + run_ + "\n" + load_ + "\n" + key_ + "\n" + std::to_string(inputs_) + "\n" +
              std::to_string(lifted_);
      });
    }
    if (name != symbol_) return PackedFunc();
    return PackedFunc([sptr_to_self, this](TVMArgs args, TVMRetValue* rv) { Call(args); });
  }

  void SaveToBinary(dmlc::Stream* stream) final {
    stream->Write(kFormat);
    stream->Write(symbol_);
    stream->Write(run_);
    stream->Write(load_);
    stream->Write(key_);
    stream->Write(payload_);
    stream->Write(inputs_);
    stream->Write(lifted_);
  }

  static Module Load(dmlc::Stream* stream) {
    uint32_t format = 0;
    std::string symbol, run, load, key, payload;
    int64_t inputs = 0, lifted = 0;
    ICHECK(stream->Read(&format)) << "tcutils_packed_call: truncated module";
    ICHECK_EQ(format, kFormat) << "tcutils_packed_call: module layout " << format
                               << " is not this plugin's (" << kFormat << "): rebuild the library";
    ICHECK(stream->Read(&symbol) && stream->Read(&run) && stream->Read(&load) && stream->Read(&key) &&
           stream->Read(&payload) && stream->Read(&inputs) && stream->Read(&lifted))
        << "tcutils_packed_call: truncated module";
    return Module(
        tvm::runtime::make_object<PackedCallModuleNode>(symbol, run, load, key, payload, inputs, lifted));
  }

 private:
  // run(key, tensors...); when it answers that the key is unknown here, load(key, payload, lifted
  // weights...) once and run again: what the generated TIR function of the Python path does.
  void Call(const TVMArgs& args) {
    const int n = args.size();
    std::vector<TVMValue> values(n + 1);
    std::vector<int> codes(n + 1);
    values[0].v_str = key_.c_str();
    codes[0] = kTVMStr;
    for (int i = 0; i < n; ++i) {
      values[i + 1] = args.values[i];
      // An NDArray handle (the VM's calls) is its DLTensor's address: passed as the graph executor's are.
      codes[i + 1] = args.type_codes[i] == kTVMNDArrayHandle ? kTVMDLTensorHandle : args.type_codes[i];
    }
    const PackedFunc& run = Required(run_);
    TVMRetValue status;
    run.CallPacked(TVMArgs(values.data(), codes.data(), n + 1), &status);
    if (static_cast<int>(status) == 0) return;
    ICHECK_LE(inputs_, n) << "tcutils_packed_call: " << symbol_ << " takes " << inputs_
                          << " inputs but was called with " << n << " arguments";
    // The lifted weights are the last inputs (the outputs follow the inputs); +1: after the key.
    const int first = static_cast<int>(inputs_ - lifted_) + 1;
    std::vector<TVMValue> load_values = {values[0], TVMValue()};
    std::vector<int> load_codes = {kTVMStr, kTVMStr};
    load_values[1].v_str = payload_.c_str();
    for (int i = first; i < first + lifted_; ++i) {
      load_values.push_back(values[i]);
      load_codes.push_back(codes[i]);
    }
    TVMRetValue ignored;
    Required(load_).CallPacked(
        TVMArgs(load_values.data(), load_codes.data(), static_cast<int>(load_values.size())), &ignored);
    run.CallPacked(TVMArgs(values.data(), codes.data(), n + 1), &status);
    ICHECK_EQ(static_cast<int>(status), 0)
        << "tcutils_packed_call: " << run_ << " refused key " << key_ << " after loading it";
  }

  std::string symbol_, run_, load_, key_, payload_;
  int64_t inputs_, lifted_;
};

}  // namespace

TVM_REGISTER_GLOBAL("tvm_tcutils.native.packed_call_module")
    .set_body_typed([](String symbol, String run, String load, String key, String payload,
                       int64_t inputs, int64_t lifted) {
      ICHECK(0 <= lifted && lifted <= inputs) << "tcutils_packed_call: need 0 <= lifted <= inputs";
      return Module(tvm::runtime::make_object<PackedCallModuleNode>(symbol, run, load, key, payload,
                                                                      inputs, lifted));
    });

TVM_REGISTER_GLOBAL("runtime.module.loadbinary_tcutils_packed_call")
    .set_body_typed([](void* stream) {
      return PackedCallModuleNode::Load(static_cast<dmlc::Stream*>(stream));
    });

}  // namespace tvm_tcutils
