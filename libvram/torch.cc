// torch.cc: PyTorch's allocation hook. PyTorch's CUDAPluggableAllocator
// calls it through a std::function<void*(size_t, int, cudaStream_t)> and
// uses whatever it returns, NULL included (CUDAPluggableAllocator::malloc
// in torch/csrc/cuda/CUDAPluggableAllocator.cpp does not check), so a
// refusal must be thrown: PyTorch turns a std::exception into Python's
// RuntimeError with its message, as it does for RMM's allocator. The throw
// starts here, after the Go call has returned: no Go or C frame is
// unwound.
#include <stdexcept>
#include <string>

#include "internal.h"

namespace {

// vram_alloc_error is what an allocation the library refuses throws.
class vram_alloc_error : public std::runtime_error {
 public:
  explicit vram_alloc_error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace

extern "C" void* vram_torch_alloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // as cudaMalloc(0): no allocation
  void* p = nullptr;
  int rc = vram_hook_alloc_(VRAM_SOURCE_TORCH, device, 0, size, reinterpret_cast<vram_stream>(stream), 0, &p);
  if (rc == VRAM_OK) return p;
  std::string msg(vram_last_error(nullptr, 0) + 1, '\0');
  msg.resize(vram_last_error(&msg[0], msg.size()));
  if (rc == VRAM_ENOMEM) msg += " (vram.oom_report() in Python, vram_oom_report in C, has the manager's report at the refusal)";
  throw vram_alloc_error(msg);
}
