"""`python -m builder`: the command line, or one line saying how to get the builder's dependencies."""

import sys

try:
    from builder.cli import main
except ModuleNotFoundError as missing:  # a Python without the builder's dependencies (the README's quick start)
    if (missing.name or "builder").split(".")[0] == "builder":
        raise  # the builder's own module: a bug, not the environment
    print(
        f"error: this Python ({sys.executable}) lacks the builder's dependencies ({missing}); "
        "run it from the environment any builder session makes (`./nox -s engine`, then "
        "`.nox/builder/bin/python -m builder ...`), or install requirements/builder.lock (README.md)",
        file=sys.stderr,
    )
    sys.exit(2)

sys.exit(main())
