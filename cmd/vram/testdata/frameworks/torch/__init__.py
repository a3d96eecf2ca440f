"""A stand-in of torch: torch.version and torch.cuda (see cuda/)."""
from . import version  # noqa: F401  (written by the test: __version__)
from . import cuda  # noqa: F401  (torch/__init__.py imports torch.cuda)
