"""The xlgen version: `xlgen.__version__`, and the `xlgen.version` field of every workdir's config.json (a module of
the core layer, so that `xlgen.config` reads it without importing the package's API; tests/test_layers.py)."""

__version__ = "0.1.0"
