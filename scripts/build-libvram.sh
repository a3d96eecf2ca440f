#!/usr/bin/env bash
# build-libvram.sh [--strip] DIR — build vram's C library into DIR:
#
#   DIR/libvram.so        the library (cgo: a C compiler), with the SONAME
#                         libvram.so.N, N vram.h's VRAM_ABI_VERSION, so that
#                         what links against it records that name
#   DIR/libvram.so.N      a symbolic link to it, the name a dependent asks for
#   DIR/libvram_torch.so  PyTorch's allocation hook, and
#   DIR/libvram_cupy.so   CuPy's C allocation hook (C++: built where g++ is,
#                         else left out, saying so), each finding libvram.so.N
#                         beside itself ($ORIGIN)
#
# --strip leaves out the symbol tables (go's -s -w, g++'s -s): what ships,
# smaller by about a third. libvram's Go tests build the library with the
# same SONAME (TestSoname).
set -euo pipefail
strip=()
if [ "${1:-}" = --strip ]; then
	strip=(-s)
	shift
fi
out=${1:?usage: build-libvram.sh [--strip] DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
abi=$(sed -n 's/^#define VRAM_ABI_VERSION \([0-9][0-9]*\).*/\1/p' "$repo/libvram/vram.h")
[ -n "$abi" ] || { echo "build-libvram: no VRAM_ABI_VERSION in libvram/vram.h" >&2; exit 1; }
soname=libvram.so.$abi
ldflags="-extldflags=-Wl,-soname,$soname"
[ ${#strip[@]} = 0 ] || ldflags="-s -w $ldflags"
(cd "$repo" && CGO_ENABLED=1 go build -buildmode=c-shared -ldflags="$ldflags" -o "$out/libvram.so" ./libvram)
rm -f "$out/libvram.h" # cgo's header of the Go exports; vram.h is the contract
ln -sf libvram.so "$out/$soname"
if ! command -v g++ >/dev/null; then
	echo "build-libvram: no g++: libvram_torch.so and libvram_cupy.so (C++) are not built" >&2
	exit 0
fi
for hook in torch cupy; do
	g++ -shared -fPIC -O2 "${strip[@]}" -I "$repo/libvram" -o "$out/libvram_$hook.so" "$repo/libvram/$hook/vram_$hook.cc" \
		-L "$out" -l:libvram.so -Wl,-rpath,'$ORIGIN'
done
