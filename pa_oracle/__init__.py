"""paged-attention-oracle: a float64 reference for paged attention and a differential-testing suite
for the kernels serving engines run.

The installed package ``pa_oracle`` maps the repository's rooms (``ARCHITECTURE.md``):
``pa_oracle.oracle`` (``oracle/``), ``pa_oracle.backends`` (``backends/``), ``pa_oracle.fuzz``
(``fuzz/``), ``pa_oracle.gates`` (``gates/``) and the data in ``pa_oracle.golden`` (``golden/``).
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("paged-attention-oracle")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

# A source checkout on sys.path (no install, e.g. a GPU box without pip access): the rooms are the
# checkout's folders beside this one. An installed copy has them inside and never looks outside.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "oracle" / "case.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821 - the package's own search path
