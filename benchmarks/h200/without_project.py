"""Run a script with paged-attention-oracle unimportable: ``python without_project.py SCRIPT [ARGS]``.

Any import of ``pa_oracle`` raises ImportError, and the exit status says so (3) if the script
tried; otherwise it is the script's own.
"""

import runpy
import sys


class _Refuse:
    tried = False

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name == "pa_oracle" or name.startswith("pa_oracle."):
            _Refuse.tried = True
            raise ImportError(f"{name}: this project must not be imported by a standalone repro")
        return None


sys.meta_path.insert(0, _Refuse())
script, sys.argv = sys.argv[1], sys.argv[1:]
code = 0
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit_:
    code = exit_.code if isinstance(exit_.code, int) else 1
if _Refuse.tried or any(m == "pa_oracle" or m.startswith("pa_oracle.") for m in sys.modules):
    print("the repro imported pa_oracle", file=sys.stderr)
    code = 3
sys.exit(code)
