// vram_cupy.cc: CuPy's C allocator hook, built into libvram_cupy.so beside
// libvram.so (C++, so it is not part of the Go package: the rest of the
// module builds with a C compiler alone):
//
//   g++ -shared -fPIC -O2 -I libvram -o DIR/libvram_cupy.so
//       libvram/cupy/vram_cupy.cc -L DIR -l:libvram.so -Wl,-rpath,'$ORIGIN'
//
// (one command line), DIR holding libvram.so: the hook links against it
// and asks for it by its SONAME, libvram.so.N (the ABI version), beside itself
// (scripts/build-libvram.sh builds both and the link between the names).
//
// cupy.cuda.memory.CFunctionAllocator calls its malloc through a function
// pointer of type void*(void*, size_t, int) and uses whatever it returns:
// a NULL it would take for memory at address 0, and the first kernel on it
// would fault the process. Since CuPy 14.2 (cupy/cuda/memory.pyx) that
// pointer type is declared `except +`, so Cython turns a C++ exception it
// throws into a Python exception: std::bad_alloc into MemoryError (with
// what() as the message), anything else into RuntimeError. So a refusal
// is thrown: out of memory (the cap's refusal included) as a bad_alloc
// carrying vram's message, any other failure as a runtime_error. With an
// older CuPy the exception would end the process (its hook is declared
// noexcept there): vram's Python package refuses to install this hook on
// one. The throw starts here, after libvram's call has returned: no Go or
// C frame is unwound. vram_cupy_free, which never throws, is libvram.so's.
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "vram.h"

namespace {

// vram_out_of_memory is what an allocation refused for want of memory
// throws: Cython raises it as MemoryError with this message.
class vram_out_of_memory : public std::bad_alloc {
 public:
  explicit vram_out_of_memory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

std::string last_error() {
  std::string msg(vram_last_error(nullptr, 0) + 1, '\0');
  msg.resize(vram_last_error(&msg[0], msg.size()));
  return msg;
}

}  // namespace

// vram_cupy_malloc allocates size bytes for CuPy from the manager open on
// device; param is NULL, or that manager's handle cast to a pointer (any
// other manager is refused). Unordered: CuPy names no stream.
extern "C" __attribute__((visibility("default"))) void* vram_cupy_malloc(void* param, size_t size, int device) {
  if (size == 0) return nullptr;  // CuPy never asks for 0 bytes here
  void* p = nullptr;
  vram_manager m = static_cast<vram_manager>(reinterpret_cast<intptr_t>(param)), on = 0;
  if (m && (vram_manager_for_device(device, &on) != VRAM_OK || on != m)) {
    throw std::runtime_error("vram_cupy_malloc: CuPy asked for memory on device " + std::to_string(device) +
                             " from manager " + std::to_string(m) + ", which is not the manager open on that device");
  }
  int rc = vram_alloc_on_device(device, VRAM_SOURCE_CUPY, size, VRAM_STREAM_UNORDERED, &p);
  if (rc == VRAM_OK) return p;
  std::string msg = last_error();
  if (rc == VRAM_ENOMEM) {
    throw vram_out_of_memory(msg + " (vram.oom_report() in Python, vram_oom_report in C, has the manager's report at the refusal)");
  }
  throw std::runtime_error(msg);
}
