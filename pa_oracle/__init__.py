"""paged-attention-oracle: a float64 reference for paged attention and a differential-testing suite
for the kernels serving engines run.

The package ``pa_oracle`` holds the repository's rooms (``ARCHITECTURE.md``) as links beside its own modules:
``pa_oracle.oracle`` (``oracle/``), ``pa_oracle.backends`` (``backends/``), ``pa_oracle.fuzz``
(``fuzz/``), ``pa_oracle.gates`` (``gates/``) and the data in ``pa_oracle.golden`` (``golden/``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("paged-attention-oracle")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"
