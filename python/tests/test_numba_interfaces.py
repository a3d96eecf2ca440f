"""vram's Numba EMM plugins against the EMM interface of each Numba users
have, as stand-ins (standins/, read from each project's source): numba 0.56's
built-in CUDA target under its ctypes binding and under NVIDIA's,
numba-cuda 0.21.2 and later, and numba-cuda-mlir. Each runs emm_flavour.py
in a child python3 whose path finds the stand-in before any installed Numba,
so that a plugin reading a name its Numba no longer has (numba-cuda 0.21's
removal of driver.USE_NV_BINDING) fails here, without a GPU.
"""

import os
import re
import subprocess
import sys
import unittest

import vram

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "standins")
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(vram.__file__)))  # where this vram comes from

# name: (stand-in directory, plugin module, interface module, driver module, environment)
FLAVOURS = {
    "numba 0.56, ctypes binding": ("numba_0_56", "vram.numba", "numba.cuda", "numba.cuda.cudadrv.driver", {}),
    "numba 0.56, NVIDIA binding": ("numba_0_56", "vram.numba", "numba.cuda", "numba.cuda.cudadrv.driver",
                                   {"NUMBA_CUDA_USE_NVIDIA_BINDING": "1"}),
    "numba-cuda": ("numba_cuda", "vram.numba", "numba.cuda", "numba.cuda.cudadrv.driver", {}),
    "numba-cuda-mlir": ("numba_cuda_mlir", "vram.numba_mlir", "numba_cuda_mlir.cuda",
                        "numba_cuda_mlir.numba_cuda.cudadrv.driver", {}),
}

TESTS = 10  # emm_flavour.TestPlugin's tests


class TestInterfaces(unittest.TestCase):
    def test_flavours(self):
        for name, (standin, plugin, cuda, driver, extra) in FLAVOURS.items():
            with self.subTest(name):
                env = dict(os.environ, **extra)
                env.update(VRAM_EMM_PLUGIN=plugin, VRAM_EMM_CUDA=cuda, VRAM_EMM_DRIVER=driver,
                           NUMBA_CUDA_MEMORY_MANAGER=plugin, PYTHONDONTWRITEBYTECODE="1",
                           PYTHONPATH=os.pathsep.join([os.path.join(STANDINS, standin), STANDINS, PACKAGE, HERE]))
                r = subprocess.run([sys.executable, "-m", "unittest", "-v", "emm_flavour"], env=env, cwd=HERE,
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                ran = re.search(r"Ran (\d+) tests?", r.stderr)
                self.assertEqual(int(ran.group(1)) if ran else 0, TESTS, r.stderr)
                self.assertNotIn("skipped", r.stderr)
                self.assertIn(os.path.join(STANDINS, standin), self.numba_file(env, cuda), "the stand-in, not an installed Numba")

    def numba_file(self, env, cuda):
        """Where the child imports the interface module from."""
        code = "import importlib; print(importlib.import_module(%r).__file__)" % cuda
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


if __name__ == "__main__":
    unittest.main()
