// Park TVM's thread-pool workers while a long packed-function call runs on the calling thread.
//
// A library-style Collage toolchain (onnxruntime, BLAS) is called from TVM-compiled code
// and runs on threads of its own. Between parallel TVM operators TVM's pool workers keep
// spinning (sched_yield, up to TVM_THREAD_POOL_SPIN_COUNT times), so where there are as
// many cores as TVM threads the library's threads share cores with spinning TVM workers
// for the whole call (an Inception-v3 mix of 94 onnxruntime and 28 TVM partitions:
// 107 ms, and 89 ms with the workers parked). The spin count is read once per process,
// so it cannot be lowered only around these calls. Instead the wrapper hands each pool
// worker a task that sleeps on a condition variable until the call is done; TVM's own
// operators keep the spinning that makes their back-to-back launches cheap.
//
// Parking costs one wake-up of each worker per call (tens of microseconds on a VM), more
// than a short call loses to the spinning, so only calls whose previous run with the same
// payload key (the first argument) took at least `min_us` microseconds are parked.
#include <tvm/runtime/c_backend_api.h>
#include <tvm/runtime/packed_func.h>
#include <tvm/runtime/registry.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace tvm_tcutils {

using tvm::runtime::PackedFunc;
using tvm::runtime::TVMArgs;
using tvm::runtime::TVMRetValue;

namespace {

// Calls made with the pool parked, for tests and diagnostics.
std::atomic<int64_t> parked_calls{0};

struct ParkedCall {
  const PackedFunc* inner;
  const TVMArgs* args;
  TVMRetValue* result;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
};

// Task 0 runs on the launching thread (TVM keeps worker 0's slot for it) and makes the
// call; every other task is a pool worker that sleeps until the call has finished.
int ParkedTask(int task_id, TVMParallelGroupEnv*, void* data) {
  auto* call = static_cast<ParkedCall*>(data);
  if (task_id == 0) {
    try {
      call->inner->CallPacked(*call->args, call->result);
    } catch (...) {
      // Thrown again on the launching thread once every worker has returned.
      call->error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(call->mutex);
      call->done = true;
    }
    call->finished.notify_all();
  } else {
    std::unique_lock<std::mutex> lock(call->mutex);
    call->finished.wait(lock, [call] { return call->done; });
  }
  return 0;
}

void CallParked(const PackedFunc& inner, const TVMArgs& args, TVMRetValue* result) {
  ParkedCall call;
  call.inner = &inner;
  call.args = &args;
  call.result = result;
  parked_calls.fetch_add(1, std::memory_order_relaxed);
  int status = TVMBackendParallelLaunch(ParkedTask, &call, 0);  // 0: one task per pool thread
  if (call.error) std::rethrow_exception(call.error);
  ICHECK_EQ(status, 0) << "tvm_tcutils.native.park_pool: TVM's parallel launch failed";
}

// Last duration of each payload key's call, in microseconds.
struct Durations {
  std::mutex mutex;
  std::unordered_map<std::string, double> last_us;
};

PackedFunc ParkPool(PackedFunc inner, double min_us) {
  auto durations = std::make_shared<Durations>();
  return PackedFunc([inner, min_us, durations](TVMArgs args, TVMRetValue* result) {
    if (args.num_args < 1 || args.type_codes[0] != kTVMStr) {
      inner.CallPacked(args, result);  // not a toolchain call; ``inner`` reports the misuse
      return;
    }
    std::string key(args.values[0].v_str);
    bool park = false;
    {
      std::lock_guard<std::mutex> lock(durations->mutex);
      auto found = durations->last_us.find(key);
      park = found != durations->last_us.end() && found->second >= min_us;
    }
    auto start = std::chrono::steady_clock::now();
    if (park) {
      CallParked(inner, args, result);
    } else {
      inner.CallPacked(args, result);
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(durations->mutex);
    durations->last_us[key] = us;
  });
}

}  // namespace

TVM_REGISTER_GLOBAL("tvm_tcutils.native.park_pool").set_body_typed(ParkPool);
TVM_REGISTER_GLOBAL("tvm_tcutils.native.parked_calls").set_body_typed([]() {
  return parked_calls.load(std::memory_order_relaxed);
});

}  // namespace tvm_tcutils
