"""vram's build backend (PEP 517, PEP 660): `pip install ./python` builds
libvram, the Go manager as a C shared library, and puts it in the wheel
beside the package, where vram._lib finds it: no environment variable, and
nothing from PyPI (the backend needs only Python's standard library, so
pip's isolated build environment has nothing to install).

What it needs: the Go toolchain (`go` on PATH, or $GO) and a C compiler
(cgo's: `go env CC`, gcc by default), run from a checkout (the Go module is
the directory above python/). The library is named by its ABI version
(SONAME libvram.so.N, as scripts/build-libvram.sh builds it). A C++
compiler (`go env CXX`) adds PyTorch's allocation hook, libvram_torch.so,
and CuPy's C hook, libvram_cupy.so; without one the wheel has neither, and
vram.torch.install() and vram.cupy.install(c_functions=True) say so. Go builds from its module cache; with no
network, `go mod download` in the checkout beforehand fills it.

Hooks: build_wheel, build_editable (libvram.so built into python/vram/,
the wheel a .pth naming python/), prepare_metadata_for_build_wheel and
_editable, get_requires_for_build_wheel and _editable (none), build_sdist
(refused: the source distribution is the checkout).
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
MODULE = os.path.dirname(PACKAGE)  # the Go module's root
NAME = "vram"


class BuildError(RuntimeError):
    """A build that cannot run here; its message says what is missing and
    what to do."""


def _project():
    """name, version, summary and requires-python from pyproject.toml."""
    with open(os.path.join(PACKAGE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    try:
        import tomllib  # Python 3.11

        project = tomllib.loads(text)["project"]
    except ImportError:  # older Pythons: the few plain strings we need
        project = dict(re.findall(r'^(\w[\w-]*)\s*=\s*"([^"]*)"', text, re.M))
    return {k: project.get(k, "") for k in ("name", "version", "description", "requires-python")}


def _tool(env, what, fix):
    path = shutil.which(env) if env else None
    if not path:
        raise BuildError("%s not found; %s" % (what, fix))
    return path


def toolchain(environ=None):
    """The go command and the C and C++ compilers cgo will use (the C++ one
    None when missing); BuildError naming what is missing."""
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", os.defpath)
    go = environ.get("GO") or shutil.which("go", path=path)
    if not go or not os.path.exists(go):
        raise BuildError("vram's wheel builds libvram with Go, and no `go` is on PATH (%s): install Go (the version go.mod names) "
                         "(https://go.dev/dl/, or your system's golang package), or set GO to its path" % path)

    def go_env(key):
        r = subprocess.run([go, "env", key], capture_output=True, text=True, env=environ)
        if r.returncode != 0:
            raise BuildError("`%s env %s` failed: %s" % (go, key, r.stderr.strip()))
        return r.stdout.strip()

    def compiler(key):
        cmd = go_env(key)
        first = cmd.split()[0] if cmd else ""
        return shutil.which(first, path=path) if first else None, cmd

    cc, cc_cmd = compiler("CC")
    if not cc:
        raise BuildError("libvram is a cgo library and the C compiler cgo uses, %r, is not on PATH: install one "
                         "(Debian: apt-get install gcc) or set CC to its path" % (cc_cmd or "gcc"))
    cxx, _ = compiler("CXX")
    return go, cc, cxx


def soname():
    """libvram.so.N, N libvram/vram.h's VRAM_ABI_VERSION: the name the
    library gives itself (as scripts/build-libvram.sh builds it)."""
    with open(os.path.join(MODULE, "libvram", "vram.h")) as f:
        m = re.search(r"^#define VRAM_ABI_VERSION (\d+)", f.read(), re.M)
    if not m:
        raise BuildError("libvram/vram.h defines no VRAM_ABI_VERSION")
    return "libvram.so." + m.group(1)


def build_libraries(out_dir, environ=None, log=sys.stderr):
    """Builds libvram.so (and libvram_torch.so and libvram_cupy.so where a
    C++ compiler is) into out_dir; returns the paths built."""
    environ = dict(os.environ if environ is None else environ)
    go, _, cxx = toolchain(environ)
    if not os.path.exists(os.path.join(MODULE, "go.mod")) or not os.path.isdir(os.path.join(MODULE, "libvram")):
        raise BuildError("%s is not in a vram checkout (no go.mod and libvram/ above it): build the wheel from the "
                         "repository's python/ directory" % PACKAGE)
    lib = os.path.join(out_dir, "libvram.so")
    environ["CGO_ENABLED"] = "1"
    print("vram: building %s with %s" % (lib, go), file=log)
    r = subprocess.run([go, "build", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname," + soname(), "-o", lib,
                        "./libvram"], cwd=MODULE, env=environ, capture_output=True, text=True)
    if r.returncode != 0:
        hint = ""
        if "GOPROXY" in r.stderr or "dial tcp" in r.stderr or "lookup" in r.stderr:
            hint = " (Go could not fetch a module: run `go mod download` in %s where the network is reachable)" % MODULE
        raise BuildError("go build -buildmode=c-shared ./libvram failed%s:\n%s" % (hint, r.stderr.strip()))
    os.remove(os.path.join(out_dir, "libvram.h"))  # the contract is libvram/vram.h
    built = [lib]
    if not cxx:
        print("vram: no C++ compiler: the wheel has no libvram_torch.so (PyTorch's hook) nor libvram_cupy.so "
              "(CuPy's C hook)", file=log)
        return built
    for hook, what in (("torch", "PyTorch's hook"), ("cupy", "CuPy's C hook")):
        path = os.path.join(out_dir, "libvram_%s.so" % hook)
        r = subprocess.run([cxx, "-shared", "-fPIC", "-O2", "-I", os.path.join(MODULE, "libvram"), "-o", path,
                            os.path.join(MODULE, "libvram", hook, "vram_%s.cc" % hook), "-L", out_dir, "-l:libvram.so",
                            "-Wl,-rpath,$ORIGIN"], env=environ, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError("building %s, libvram_%s.so, failed:\n%s" % (what, hook, r.stderr.strip()))
        built.append(path)
    return built


def _tag():
    return "py3-none-" + re.sub(r"[^\w]", "_", sysconfig.get_platform())


def _dist_info(project):
    return "%s-%s.dist-info" % (project["name"], project["version"])


def _metadata_files(project, tag):
    metadata = ["Metadata-Version: 2.1", "Name: " + project["name"], "Version: " + project["version"]]
    if project["description"]:
        metadata.append("Summary: " + project["description"])
    if project["requires-python"]:
        metadata.append("Requires-Python: " + project["requires-python"])
    wheel = ["Wheel-Version: 1.0", "Generator: vram_build", "Root-Is-Purelib: false", "Tag: " + tag]
    return {"METADATA": "\n".join(metadata) + "\n", "WHEEL": "\n".join(wheel) + "\n"}


def _write_metadata(metadata_directory):
    project = _project()
    d = os.path.join(metadata_directory, _dist_info(project))
    os.makedirs(d, exist_ok=True)
    for name, text in _metadata_files(project, _tag()).items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    return os.path.basename(d)


def _package_files():
    """(path in the wheel, path here) of the package's sources: vram/ less
    caches and libraries built in place."""
    root = os.path.join(PACKAGE, NAME)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith((".pyc", ".so")):
                continue
            full = os.path.join(dirpath, f)
            yield os.path.relpath(full, PACKAGE).replace(os.sep, "/"), full


def _write_wheel(wheel_directory, files):
    """Writes the wheel of files ({path in the wheel: bytes or a path
    here}) and its RECORD; returns its file name. Written beside its name
    and renamed once complete."""
    project = _project()
    tag = _tag()
    info = _dist_info(project)
    for name, text in _metadata_files(project, tag).items():
        files[info + "/" + name] = text.encode()
    name = "%s-%s-%s.whl" % (project["name"], project["version"], tag)
    record = []
    partial = os.path.join(wheel_directory, name + ".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for arc in sorted(files):
            src = files[arc]
            if isinstance(src, str):
                with open(src, "rb") as f:
                    data = f.read()
                mode = os.stat(src).st_mode & 0o777
            else:
                data, mode = src, 0o644
            zi = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append(info + "/RECORD,,")
        z.writestr(zipfile.ZipInfo(info + "/RECORD", date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    os.replace(partial, os.path.join(wheel_directory, name))
    return name


# ── PEP 517 ─────────────────────────────────────────────────────────────


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        with tempfile.TemporaryDirectory(prefix="vram-build-") as tmp:
            files = dict(_package_files())
            for lib in build_libraries(tmp):
                files[NAME + "/" + os.path.basename(lib)] = lib
            return _write_wheel(wheel_directory, files)
    except BuildError as e:
        raise SystemExit("vram: cannot build the wheel: %s" % e) from None


def build_sdist(sdist_directory, config_settings=None):
    raise SystemExit("vram: no source distribution: the package builds from its repository's checkout (the Go "
                     "module above python/); install with `pip install ./python` there")


# ── PEP 660 ─────────────────────────────────────────────────────────────


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel of one .pth naming python/, with the libraries built into
    python/vram/ (ignored by git), where vram._lib looks first."""
    try:
        build_libraries(os.path.join(PACKAGE, NAME))
    except BuildError as e:
        raise SystemExit("vram: cannot build the editable install: %s" % e) from None
    return _write_wheel(wheel_directory, {"__editable__.vram.pth": (PACKAGE + "\n").encode()})
