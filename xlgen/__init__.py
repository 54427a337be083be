"""xlgen: Transformer-XL, XLNet and Funnel-Transformer on JAX/Flax (NNX).

Public Python API:
    xlgen.from_pretrained(path, **kwargs) -> a callable model (see README, "Python API").
"""

from xlgen import platforms as _platforms
from xlgen.version import __version__

# No TPU probe (libtpu noise) on a machine without one unless the user asks for it (JAX_PLATFORMS / --platform).
_platforms.quiet_default()


def from_pretrained(path, **kwargs):
    """Load an xlgen workdir/checkpoint or a Hugging Face model directory. See `xlgen.pretrained`."""
    from xlgen.pretrained import from_pretrained as _from_pretrained

    _platforms.keep_freed_host_memory()  # host buffers reused across calls (XLGEN_HOST_MALLOC=default: off)

    return _from_pretrained(path, **kwargs)


__all__ = ["from_pretrained", "__version__"]
