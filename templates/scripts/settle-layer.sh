#!/bin/sh
# The last command of every RUN step: what the step wrote that would differ from build to build
# goes, so the layer's files are the same every time (their tar encoding, and every modification
# time, clamped to SOURCE_DATE_EPOCH, are the builder's: builder/engine/canonical.py).
# - Files the step wrote in log and cache directories go: their content names the moment.
# - /tmp is emptied.
# - On Pythons that write set constants into bytecode in hash order (3.9 here; 3.11 no longer),
#   the .pyc files Debian's byte-compilation wrote are compiled again: it runs Python with -E,
#   which ignores the build's PYTHONHASHSEED=0 (pip's compilation honours it).
# Modification times are not touched here: the canonical encoding clamps them, and a walk of the
# whole tree after every step cost more than the rest of the pass after the build.
set -eu
epoch=${SOURCE_DATE_EPOCH:?SOURCE_DATE_EPOCH must be set}
find /var/cache/apt /var/cache/ldconfig /var/log -xdev ! -type d -newermt "@$epoch" -delete
find /tmp -mindepth 1 -delete
if python3 -c 'import sys; sys.exit(sys.version_info >= (3, 11))' 2>/dev/null; then
  find /usr/lib/python3* -xdev -path '*/__pycache__/*.pyc' -newermt "@$epoch" \
    | sed -E 's#/__pycache__/([^/]+)\.cpython-[0-9]+(\.opt-[12])?\.pyc$#/\1.py#' | sort -u \
    | while read -r source; do [ ! -f "$source" ] || echo "$source"; done \
    | PYTHONHASHSEED=0 xargs -r python3 -m py_compile
  # ... and dated SOURCE_DATE_EPOCH, so that the next step's settle does not compile them again.
  find /usr/lib/python3* -xdev -path '*/__pycache__/*.pyc' -newermt "@$epoch" \
    -exec touch --no-dereference --date="@$epoch" {} +
fi
