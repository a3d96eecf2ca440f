// vram_torch.cc: PyTorch's allocation hook, built into libvram_torch.so
// beside libvram.so (C++, so it is not part of the Go package: the rest of
// the module builds with a C compiler alone):
//
//   g++ -shared -fPIC -O2 -I libvram -o DIR/libvram_torch.so
//       libvram/torch/vram_torch.cc -L DIR -l:libvram.so -Wl,-rpath,'$ORIGIN'
//
// (one command line), DIR holding libvram.so: the hook links against it
// and asks for it by its SONAME, libvram.so.N (the ABI version), beside itself
// (scripts/build-libvram.sh builds both and the link between the names).
//
// PyTorch's CUDAPluggableAllocator calls vram_torch_alloc through a
// std::function<void*(size_t, int, cudaStream_t)> and uses whatever it
// returns, NULL included (CUDAPluggableAllocator::malloc in
// torch/csrc/cuda/CUDAPluggableAllocator.cpp does not check), so a refusal
// must be thrown: PyTorch turns a std::exception into Python's
// RuntimeError with its message, as it does for RMM's allocator. The throw
// starts here, after libvram's call has returned: no Go or C frame is
// unwound. vram_torch_free and vram_torch_empty_cache, which never throw,
// are libvram's own; dlsym through this library finds them in libvram.so,
// its dependency, as PyTorch's CUDAPluggableAllocator(path, alloc, free)
// looks both names up in one library.
#include <stdexcept>
#include <string>

#include "vram.h"

namespace {

// vram_alloc_error is what an allocation the library refuses throws.
class vram_alloc_error : public std::runtime_error {
 public:
  explicit vram_alloc_error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void* vram_torch_alloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // as cudaMalloc(0): no allocation
  void* p = nullptr;
  int rc = vram_alloc_on_device(device, VRAM_SOURCE_TORCH, size, reinterpret_cast<vram_stream>(stream), &p);
  if (rc == VRAM_OK) return p;
  std::string msg(vram_last_error(nullptr, 0) + 1, '\0');
  msg.resize(vram_last_error(&msg[0], msg.size()));
  if (rc == VRAM_ENOMEM) msg += " (vram.oom_report() in Python, vram_oom_report in C, has the manager's report at the refusal)";
  throw vram_alloc_error(msg);
}
