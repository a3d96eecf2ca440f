// cupy_harness.cc: calls vram_cupy_malloc and vram_cupy_free the way
// CuPy's CFunctionAllocator does (cupy/cuda/memory.pyx): through function
// pointers of types void*(void*, size_t, int) and void(void*, void*, int),
// the malloc found in libvram_cupy.so and the free in libvram.so, each
// call to malloc in a C++ try, as Cython compiles a call through a pointer
// declared `except +` (CuPy 14.2 and newer): it raises a std::bad_alloc as
// MemoryError with its what(), anything else as RuntimeError. A refusal
// must arrive as one of those, never as NULL. The manager is opened
// through libvram.so loaded first by its own path, as the Python package
// does.
//
//   cupy_harness LIBVRAM LIBVRAM_CUPY
#include <dlfcn.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "../vram.h"

using MallocFunc = void* (*)(void*, size_t, int);
using FreeFunc = void (*)(void*, void*, int);

static int failures;
static void check(bool ok, const std::string& what) {
  std::printf("%s - %s\n", ok ? "ok" : "not ok", what.c_str());
  failures += !ok;
}

// refusal calls malloc as CuPy does and says how it refused: "bad_alloc: …",
// "runtime_error: …", or "returned …" when it did not throw.
static std::string refusal(MallocFunc malloc_fn, void* param, size_t size, int device) {
  try {
    void* p = malloc_fn(param, size, device);
    return "returned " + std::to_string(reinterpret_cast<uintptr_t>(p));
  } catch (const std::bad_alloc& e) {
    return std::string("bad_alloc: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("runtime_error: ") + e.what();
  }
}

static double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc != 3) return 100;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* cupy = lib ? dlopen(argv[2], RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!cupy) {
    std::printf("not ok - dlopen: %s\n", dlerror());
    return 100;
  }
  auto malloc_fn = reinterpret_cast<MallocFunc>(dlsym(cupy, "vram_cupy_malloc"));
  auto free_fn = reinterpret_cast<FreeFunc>(dlsym(lib, "vram_cupy_free"));
  auto open = reinterpret_cast<int (*)(const char*, uint64_t, vram_manager*)>(dlsym(lib, "vram_open"));
  auto stats = reinterpret_cast<int (*)(vram_manager, struct vram_stats*)>(dlsym(lib, "vram_stats"));
  auto close = reinterpret_cast<int (*)(vram_manager)>(dlsym(lib, "vram_close"));
  check(malloc_fn && free_fn && open && stats && close, "vram_cupy_malloc in libvram_cupy.so, the rest in libvram.so");
  if (!malloc_fn || !free_fn || !open || !stats || !close) return 100;

  std::string r = refusal(malloc_fn, nullptr, 1 << 20, 0);
  check(r.rfind("runtime_error: ", 0) == 0 && r.find("no manager is open on device 0") != std::string::npos,
        "no manager open: a RuntimeError naming the device (" + r + ")");
  vram_manager m = 0;
  check(open("sim:vram=64MiB", 8 << 20, &m) == VRAM_OK, "open a simulator with an 8 MiB cap");
  void* param = reinterpret_cast<void*>(static_cast<intptr_t>(m));
  void* c = malloc_fn(nullptr, 5 << 20, 0);
  void* c2 = malloc_fn(param, 1 << 20, 0);
  check(c && c2, "by device and by the manager's handle");
  r = refusal(malloc_fn, param, 1 << 20, 1);
  check(r.rfind("runtime_error: ", 0) == 0 && r.find("device 1") != std::string::npos,
        "device 0's manager asked for device 1: a RuntimeError (" + r + ")");
  r = refusal(malloc_fn, nullptr, 64 << 20, 0);
  check(r.rfind("bad_alloc: ", 0) == 0 && r.find("cap") != std::string::npos && r.find("vram.oom_report()") != std::string::npos,
        "past the cap: a MemoryError with vram's message (" + r + ")");
  check(malloc_fn(nullptr, 0, 0) == nullptr, "0 bytes: NULL, no exception");
  struct vram_stats st{};
  st.size = sizeof st;
  stats(m, &st);
  check(st.sources[VRAM_SOURCE_CUPY].in_use == 6 << 20 && st.hook_errors == 0,
        "cupy's 6 MiB counted under cupy; a refusal thrown is no hook error (" + std::to_string(st.hook_errors) + ")");
  free_fn(nullptr, c, 0);
  free_fn(param, c2, 0);
  stats(m, &st);
  check(st.sources[VRAM_SOURCE_CUPY].in_use == 0, "vram_cupy_free gives them back");

  enum { N = 200000 };
  double t0 = now_ns();
  for (int i = 0; i < N; i++) free_fn(nullptr, malloc_fn(nullptr, 1 << 20, 0), 0);
  std::printf("bench alloc+free 1 MiB via the cupy hooks (libvram_cupy.so): %.0f ns/pair\n", (now_ns() - t0) / N);
  check(close(m) == VRAM_OK, "close");
  std::printf("# %d failures\n", failures);
  return failures;
}
