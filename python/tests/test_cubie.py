"""vram.cubie's tests (cubie_cases.py), run in a child python3 under Numba's
CUDA simulator (NUMBA_ENABLE_CUDASIM=1 must be set before Numba is
imported, and this process's Numba may be the real one). Skipped without
numba or numpy.
"""

import importlib.util
import os
import re
import subprocess
import sys
import unittest

import vram

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(vram.__file__)))
MISSING = [m for m in ("numba", "numpy") if importlib.util.find_spec(m) is None]


@unittest.skipIf(MISSING, "%s not installed" % ", ".join(MISSING))
class TestDropIn(unittest.TestCase):
    def test_cases(self):
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1", VRAM_DEVICE="",
                   PYTHONPATH=os.pathsep.join([PACKAGE, HERE]))
        r = subprocess.run([sys.executable, "-m", "unittest", "-v", "cubie_cases"], env=env, cwd=HERE,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        ran = re.search(r"Ran (\d+) tests?", r.stderr)
        self.assertGreaterEqual(int(ran.group(1)) if ran else 0, 13, r.stderr)
        self.assertNotIn("skipped", r.stderr)


if __name__ == "__main__":
    unittest.main()
