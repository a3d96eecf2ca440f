"""The build backend of `pip install ./python` (build_backend/vram_build.py)
without building: its errors when Go or a C compiler is missing, the
metadata pip reads, and a wheel's RECORD. The build itself is
scripts/pip-install.sh's, run by .ci/run.
"""

import base64
import hashlib
import importlib.util
import os
import shutil
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = os.path.join(os.path.dirname(HERE), "build_backend", "vram_build.py")


def load_backend():
    spec = importlib.util.spec_from_file_location("vram_build", BACKEND)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TestBackend(unittest.TestCase):
    def setUp(self):
        self.b = load_backend()
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def test_no_go(self):
        env = {"PATH": self.tmp}  # nothing on it
        with self.assertRaises(self.b.BuildError) as cm:
            self.b.toolchain(env)
        msg = str(cm.exception)
        self.assertIn("no `go` is on PATH (%s)" % self.tmp, msg)
        self.assertIn("install Go", msg)
        self.assertEqual(msg.count("\n"), 0, "one line")
        with self.assertRaises(SystemExit) as cm:  # what pip shows
            old = os.environ["PATH"]
            os.environ["PATH"] = self.tmp
            try:
                self.b.build_wheel(self.tmp)
            finally:
                os.environ["PATH"] = old
        self.assertIn("vram: cannot build the wheel: vram's wheel builds libvram with Go", str(cm.exception))
        self.assertEqual(os.listdir(self.tmp), [], "nothing left behind")

    def test_no_c_compiler(self):
        go = shutil.which("go")
        if go is None:
            self.skipTest("no go on PATH to ask for its C compiler")
        env = {"PATH": self.tmp, "GO": go, "HOME": self.tmp, "GOCACHE": os.path.join(self.tmp, "cache"),
               "GOPATH": os.path.join(self.tmp, "gopath"), "CC": "no-such-cc"}
        with self.assertRaises(self.b.BuildError) as cm:
            self.b.toolchain(env)
        self.assertIn("the C compiler cgo uses, 'no-such-cc', is not on PATH", str(cm.exception))
        self.assertIn("apt-get install gcc", str(cm.exception))

    def test_no_cxx_is_no_error(self):
        go, cc = shutil.which("go"), shutil.which("gcc") or shutil.which("cc")
        if go is None or cc is None:
            self.skipTest("needs go and a C compiler on PATH")
        os.symlink(cc, os.path.join(self.tmp, "cc"))
        env = {"PATH": self.tmp, "GO": go, "HOME": self.tmp, "GOCACHE": os.path.join(self.tmp, "cache"),
               "GOPATH": os.path.join(self.tmp, "gopath"), "CC": "cc", "CXX": "no-such-c++"}
        got_go, got_cc, got_cxx = self.b.toolchain(env)
        self.assertEqual((got_go, got_cc, got_cxx), (go, os.path.join(self.tmp, "cc"), None))

    def test_metadata(self):
        name = self.b.prepare_metadata_for_build_wheel(self.tmp)
        project = self.b._project()
        self.assertEqual(name, "vram-%s.dist-info" % project["version"])
        with open(os.path.join(self.tmp, name, "METADATA")) as f:
            meta = f.read()
        self.assertIn("Name: vram\n", meta)
        self.assertIn("Version: %s\n" % project["version"], meta)
        with open(os.path.join(self.tmp, name, "WHEEL")) as f:
            wheel = f.read()
        self.assertIn("Root-Is-Purelib: false", wheel, "the wheel holds a native library")
        self.assertRegex(wheel, r"Tag: py3-none-\w+\n")
        self.assertEqual(self.b.get_requires_for_build_wheel(), [], "nothing for pip to fetch")

    def test_wheel_record(self):
        lib = os.path.join(self.tmp, "libvram.so")
        with open(lib, "wb") as f:
            f.write(b"\x7fELF stand-in")
        files = dict(self.b._package_files())
        self.assertIn("vram/__init__.py", files)
        self.assertFalse([p for p in files if p.endswith((".so", ".pyc"))], "built libraries and caches stay out")
        files["vram/libvram.so"] = lib
        name = self.b._write_wheel(self.tmp, files)
        self.assertFalse([f for f in os.listdir(self.tmp) if f.endswith(".partial")])
        with zipfile.ZipFile(os.path.join(self.tmp, name)) as z:
            info = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")][0]
            rows = [line.split(",") for line in z.read(info).decode().splitlines()]
            self.assertEqual(sorted(r[0] for r in rows), sorted(z.namelist()))
            for path, digest, size in rows:
                if path == info:
                    continue
                data = z.read(path)
                want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((digest, int(size)), (want, len(data)), path)
            self.assertEqual(z.read("vram/libvram.so"), b"\x7fELF stand-in")

    def test_soname(self):
        """The library is named by the ABI version the package checks at
        load (libvram.so.N, N vram.h's VRAM_ABI_VERSION)."""
        from vram import _lib

        self.assertEqual(self.b.soname(), "libvram.so.%d" % _lib.ABI_VERSION)

    def test_no_sdist(self):
        with self.assertRaises(SystemExit) as cm:
            self.b.build_sdist(self.tmp)
        self.assertIn("pip install ./python", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
