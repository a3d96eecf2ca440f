"""vram lease's import hook: the lease's memory limit for the frameworks
whose limit is an API call or that have none of their own.

`vram lease` writes this file into a directory of its own, puts that
directory first on the command's PYTHONPATH, and removes it when the
command ends. Python's site module imports it at startup as sitecustomize;
it then runs the sitecustomize it hides (the next one on sys.path), so an
installation's own still runs. It does nothing unless VRAM_LEASE_BYTES is
set, and imports no framework itself: it acts when the program imports
one, through a finder first on sys.meta_path.

  torch       PyTorch 2.10 and later (torch/version.py, read before torch
              loads), unless PYTORCH_CUDA_ALLOC_CONF names
              backend:cudaMallocAsync: per_process_memory_fraction in the
              allocator configuration PyTorch reads (c10/cuda/
              CUDAAllocatorConfig.h; PR #161035), which each device's
              caching allocator takes when it is made. Otherwise, and for
              earlier releases, which refuse a key they do not know:
              torch.cuda.set_per_process_memory_fraction for every device,
              queued with torch.cuda._lazy_call to run when PyTorch
              initializes CUDA (importing torch must not initialize CUDA).
  tensorflow  tf.config.set_logical_device_configuration with a
              memory_limit of the lease in MiB on every GPU, before
              TensorFlow initializes them (vram lease sets
              TF_FORCE_GPU_ALLOW_GROWTH=true, so TensorFlow takes memory as
              it needs it, up to the limit). TensorFlow refuses
              set_memory_growth on a device so configured; the hook makes
              tf.config.experimental.set_memory_growth(gpu, True) a no-op
              there while growth is on, as the program asked.
  numba       NUMBA_CUDA_MEMORY_MANAGER=vram.numba (vram's EMM plugin,
              whose manager's cap is VRAM_ALLOC_CONF's limit: the lease),
              set before Numba reads its configuration, where vram's Python
              package is importable and the variable is unset. Numba has no
              limit of its own; without the plugin, importing numba.cuda
              says that Numba is not capped.

A limit the program sets itself afterwards replaces the hook's. Every
failure of the hook is one line on stderr and leaves the import as it was.
The hook imports nothing at startup beyond os and sys (re and importlib's
helpers only when a framework is imported): every Python the command
starts runs it.
"""

import os
import sys

_PREFIX = "vram lease: "


def _say(msg):
    sys.stderr.write(_PREFIX + msg + "\n")


def _lease():
    """(bytes, fraction) of the lease, or None outside one."""
    try:
        return int(os.environ["VRAM_LEASE_BYTES"]), float(os.environ["VRAM_LEASE_FRACTION"])
    except (KeyError, ValueError):
        return None


# -- PyTorch -----------------------------------------------------------------

TORCH_KEY = "per_process_memory_fraction"
TORCH_KEY_SINCE = (2, 10)  # the first release whose allocator configuration knows the key


def torch_version(spec):
    """(major, minor) of the torch package spec finds, from its version.py
    (read, not imported), or None."""
    import re

    for d in spec.submodule_search_locations or ():
        try:
            with open(os.path.join(d, "version.py")) as f:
                m = re.search(r"""__version__\s*=\s*['"](\d+)\.(\d+)""", f.read())
        except OSError:
            continue
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def torch_conf_name():
    """The variable PyTorch reads its CUDA allocator configuration from:
    PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (CUDAAllocatorConfig::
    instance()); the first when neither is set."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" in os.environ:
        return "PYTORCH_ALLOC_CONF"
    return "PYTORCH_CUDA_ALLOC_CONF"


def torch_conf(conf, fraction):
    """conf with per_process_memory_fraction set to fraction, or kept where
    it is lower; its other options as they were."""
    import re

    m = re.search(TORCH_KEY + r"\s*:\s*([0-9.eE+-]+)", conf)
    if m:
        try:
            if float(m.group(1)) <= fraction:
                return conf
        except ValueError:
            pass
        return conf[:m.start(1)] + repr(fraction) + conf[m.end(1):]
    return (conf + "," if conf.strip() else "") + "%s:%r" % (TORCH_KEY, fraction)


def torch_before(spec, lease):
    """Sets the allocator configuration's key where the PyTorch about to
    load knows it; returns whether it did."""
    import re

    name = torch_conf_name()
    conf = os.environ.get(name, "")
    v = torch_version(spec)
    if v is None or v < TORCH_KEY_SINCE or re.search(r"backend\s*:\s*cudaMallocAsync", conf):
        return False
    os.environ[name] = torch_conf(conf, lease[1])
    return True


def torch_after(torch, lease):
    """Queues set_per_process_memory_fraction for every device, for when
    PyTorch initializes CUDA."""
    cuda = torch.cuda
    fraction = lease[1]

    def apply():
        for i in range(cuda.device_count()):
            cuda.set_per_process_memory_fraction(fraction, i)

    if not hasattr(cuda, "_lazy_call"):
        _say("PyTorch is not capped: this torch has no torch.cuda._lazy_call; "
             "call torch.cuda.set_per_process_memory_fraction(float(os.environ['VRAM_LEASE_FRACTION'])) first thing")
        return
    cuda._lazy_call(apply)


# -- TensorFlow --------------------------------------------------------------

def tf_after(tf, lease):
    """A logical device of the lease's MiB on every GPU, and
    set_memory_growth(gpu, True) a no-op on them while growth is on."""
    cfg = tf.config
    limit = lease[0] >> 20
    gpus = list(cfg.list_physical_devices("GPU"))
    for g in gpus:
        cfg.set_logical_device_configuration(g, [cfg.LogicalDeviceConfiguration(memory_limit=limit)])
    exp = cfg.experimental
    own = exp.set_memory_growth

    def set_memory_growth(device, enable):
        if enable and device in gpus and os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH") == "true":
            return  # growth is on (TF_FORCE_GPU_ALLOW_GROWTH), under vram lease's memory limit
        return own(device, enable)

    set_memory_growth.__doc__ = own.__doc__
    exp.set_memory_growth = set_memory_growth


# -- Numba -------------------------------------------------------------------

_numba = {"plugin": False}


def numba_before(spec, lease):
    """NUMBA_CUDA_MEMORY_MANAGER=vram.numba where vram is importable and
    the variable is unset."""
    import importlib.util

    if "NUMBA_CUDA_MEMORY_MANAGER" in os.environ:
        _numba["plugin"] = os.environ["NUMBA_CUDA_MEMORY_MANAGER"] == "vram.numba"
        _numba["other"] = os.environ["NUMBA_CUDA_MEMORY_MANAGER"]
        return
    if importlib.util.find_spec("vram") is None:
        return
    os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "vram.numba"
    _numba["plugin"] = True


def numba_cuda_before(spec, lease):
    """Says, once, when Numba's CUDA target loads without vram's plugin."""
    if _numba["plugin"]:
        return
    other = _numba.get("other")
    if other is not None and other != "default":
        _say("Numba's memory manager is %s (NUMBA_CUDA_MEMORY_MANAGER): the lease binds Numba only if it keeps to a limit" % other)
    else:
        _say("Numba is not capped: it has no memory limit of its own, and vram's Numba plugin (Python package vram, "
             "pip install ./python from vram's source) is not importable here")


# -- The finder --------------------------------------------------------------

# module name → (before(spec, lease), after(module, lease)), each optional.
ACTIONS = {
    "torch": (torch_before, None),
    "tensorflow": (None, tf_after),
    "numba": (numba_before, None),
    "numba.cuda": (numba_cuda_before, None),
}


class LeaseFinder:
    """A meta path finder that finds nothing itself: for a module of
    ACTIONS, it asks the finders after it, runs the module's before action,
    and has its after action run once the module has executed."""

    def __init__(self, lease):
        self.lease = lease
        self.pending = dict(ACTIONS)

    def find_spec(self, name, path, target=None):
        actions = self.pending.pop(name, None)
        if actions is None:
            return None
        spec = self._others(name, path, target)
        if spec is None:
            return None
        before, after = actions
        done = False
        if before is not None:
            done = self._guard(name, before, spec)
        if name == "torch" and not done:
            after = torch_after
        if after is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            self._after(name, spec.loader, after)
        return spec

    def _others(self, name, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
        return None

    def _guard(self, name, fn, arg):
        try:
            return fn(arg, self.lease)
        except Exception as e:  # the hook never breaks an import
            _say("could not cap %s: %s: %s" % (name, type(e).__name__, e))
            return False

    def _after(self, name, loader, fn):
        own = loader.exec_module
        finder = self

        def exec_module(module):
            own(module)
            finder._guard(name, fn, module)

        loader.exec_module = exec_module


def _chain():
    """Runs the sitecustomize this one hides, the next on sys.path."""
    import importlib.machinery  # loaded already: site imports through it

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = type(sys)(spec.name)  # importlib.util.module_from_spec, without importing it
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _install():
    lease = _lease()
    if lease is not None and not any(isinstance(f, LeaseFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, LeaseFinder(lease))


if __name__ == "sitecustomize":
    _install()
    _chain()
