"""A stand-in of jax: the memory fraction as jaxlib's xla_client.py reads it
(generate_pjrt_gpu_plugin_options), refusing both names at once."""
import os


def memory_fraction():
    fraction = os.getenv("XLA_CLIENT_MEM_FRACTION", "")
    deprecated = os.getenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
    if deprecated:
        if fraction:
            raise ValueError("XLA_CLIENT_MEM_FRACTION is specified together with XLA_PYTHON_CLIENT_MEM_FRACTION. "
                             "Remove the latter one, it is deprecated.")
        fraction = deprecated
    return float(fraction) if fraction else 0.75
