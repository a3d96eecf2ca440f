"""vram.torch against a stand-in of PyTorch's interface (standins/torch):
torch_cases.py in a child python3 whose path finds the stand-in before any
installed torch."""

import os
import re
import subprocess
import sys
import unittest

import vram

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standins", "torch")
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(vram.__file__)))


class TestTorchStandin(unittest.TestCase):
    def test_cases(self):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=os.pathsep.join([STANDIN, PACKAGE, HERE]))
        r = subprocess.run([sys.executable, "-m", "unittest", "-v", "torch_cases"], env=env, cwd=HERE,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        ran = re.search(r"Ran (\d+) tests?", r.stderr)
        self.assertEqual(int(ran.group(1)) if ran else 0, 5, r.stderr)
        self.assertNotIn("skipped", r.stderr)


if __name__ == "__main__":
    unittest.main()
