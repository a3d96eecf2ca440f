// torch_harness.cc: calls vram_torch_alloc and vram_torch_free the way
// PyTorch does: dlsym'd from libvram_torch.so (CUDAPluggableAllocator
// looks both names up in the one library it is given), cast to the types
// of torch/csrc/cuda/Module.cpp's _cuda_customAllocator
// (void*(size_t, int, cudaStream_t) and void(void*, size_t, int,
// cudaStream_t)), and called through std::function, as
// CUDAPluggableAllocator::malloc and raw_delete do. The manager is opened
// through libvram.so loaded first by its own path, as the Python package
// does with ctypes: the hooks must see it (one library, one Go runtime). A
// refusal must arrive as a C++ exception carrying vram's message, which
// PyTorch raises in Python as RuntimeError.
//
//   torch_harness LIBVRAM LIBVRAM_TORCH
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "../vram.h"

typedef void* cudaStream_t;  // as cuda_runtime_api.h: a pointer
using MallocFuncType = void*(size_t, int, cudaStream_t);
using FreeFuncType = void(void*, size_t, int, cudaStream_t);

static int failures;
static void check(bool ok, const std::string& what) {
  std::printf("%s - %s\n", ok ? "ok" : "not ok", what.c_str());
  failures += !ok;
}

int main(int argc, char** argv) {
  if (argc != 3) return 100;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* torch = lib ? dlopen(argv[2], RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!torch) {
    std::printf("not ok - dlopen: %s\n", dlerror());
    return 100;
  }
  void* alloc_sym = dlsym(torch, "vram_torch_alloc");
  void* free_sym = dlsym(torch, "vram_torch_free");  // libvram.so's, through the dependency
  check(alloc_sym && free_sym, "both hooks found through libvram_torch.so");
  check(dlsym(lib, "vram_torch_alloc") == nullptr, "libvram.so itself has no vram_torch_alloc (no variant that returns NULL)");
  if (!alloc_sym || !free_sym) return 100;
  std::function<MallocFuncType> alloc = reinterpret_cast<MallocFuncType*>(alloc_sym);
  std::function<FreeFuncType> free_fn = reinterpret_cast<FreeFuncType*>(free_sym);
  auto open = reinterpret_cast<int (*)(const char*, uint64_t, vram_manager*)>(dlsym(lib, "vram_open"));

  // No manager yet: the hook throws, naming what to do.
  try {
    alloc(1 << 20, 0, nullptr);
    check(false, "alloc with no manager open throws");
  } catch (const std::exception& e) {
    check(std::strstr(e.what(), "no manager is open on device 0") != nullptr, std::string("no manager: ") + e.what());
  }
  vram_manager m = 0;
  check(open("sim:vram=64MiB", 8 << 20, &m) == VRAM_OK, "open a simulator with an 8 MiB cap");
  void* p = alloc(6 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
  check(p != nullptr, "6 MiB through std::function");
  try {
    alloc(4 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
    check(false, "4 MiB past the cap throws");
  } catch (const std::runtime_error& e) {
    check(std::strstr(e.what(), "would pass the cap of 8 MiB") != nullptr && std::strstr(e.what(), "vram.oom_report()") != nullptr,
          std::string("past the cap: ") + e.what());
  }
  check(alloc(0, 0, nullptr) == nullptr, "0 bytes: NULL, no exception");
  free_fn(p, 6 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
  free_fn(p, 6 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));  // a double free never throws
  check(true, "frees, a double one included, return without throwing");
  p = alloc(4 << 20, 0, nullptr);
  check(p != nullptr, "4 MiB once the 6 MiB are back");
  free_fn(p, 4 << 20, 0, nullptr);

  // torch.cuda.MemPool's route: libvram.so's own pool hook, which PyTorch's
  // caching allocator checks for NULL (its raw_alloc, allocPrimitive).
  void* pool_sym = dlsym(lib, "vram_torch_pool_alloc");
  check(pool_sym != nullptr, "libvram.so has vram_torch_pool_alloc");
  if (pool_sym == nullptr) return 100;
  std::function<MallocFuncType> pool_alloc = reinterpret_cast<MallocFuncType*>(pool_sym);
  p = pool_alloc(6 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
  check(p != nullptr, "a 6 MiB segment through the pool hook");
  try {
    check(pool_alloc(4 << 20, 0, reinterpret_cast<cudaStream_t>(0x40)) == nullptr, "a segment past the cap: NULL");
  } catch (const std::exception& e) {
    check(false, std::string("the pool hook never throws: ") + e.what());
  }
  free_fn(p, 6 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
  p = pool_alloc(4 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
  check(p != nullptr, "4 MiB once the segment is back");
  free_fn(p, 4 << 20, 0, reinterpret_cast<cudaStream_t>(0x40));
  check(pool_alloc(0, 0, nullptr) == nullptr, "0 bytes: NULL");
  std::printf("# %d failures\n", failures);
  return failures;
}
