#!/bin/sh
# The last command of every RUN step: the layer leaves the step already normalized, so the
# builder keeps it byte for byte instead of rewriting it after the build (see builder/repro/normalize.py).
# - Files the step wrote in log and cache directories go: their content names the moment.
# - /tmp is emptied.
# - On Pythons that write set constants into bytecode in hash order (3.9 here; 3.11 no longer),
#   the .pyc files Debian's byte-compilation wrote are compiled again: it runs Python with -E,
#   which ignores the build's PYTHONHASHSEED=0 (pip's compilation honours it).
# - Every path the step touched gets SOURCE_DATE_EPOCH as its modification time.
# Docker's per-container files (its init layer and mounts) are left alone: touching them
# would copy them into the layer.
set -eu
epoch=${SOURCE_DATE_EPOCH:?SOURCE_DATE_EPOCH must be set}
find /var/cache/apt /var/cache/ldconfig /var/log -xdev ! -type d -newermt "@$epoch" -delete
find /tmp -mindepth 1 -delete
if python3 -c 'import sys; sys.exit(sys.version_info >= (3, 11))' 2>/dev/null; then
  find /usr/lib/python3* -xdev -path '*/__pycache__/*.pyc' -newermt "@$epoch" \
    | sed -E 's#/__pycache__/([^/]+)\.cpython-[0-9]+(\.opt-[12])?\.pyc$#/\1.py#' | sort -u \
    | while read -r source; do [ ! -f "$source" ] || echo "$source"; done \
    | PYTHONHASHSEED=0 xargs -r python3 -m py_compile
fi
find / -xdev -mindepth 1 \( -path /proc -o -path /sys -o -path /dev -o -path /.dockerenv \
    -o -path /etc/hosts -o -path /etc/hostname -o -path /etc/resolv.conf -o -path /etc/mtab \) -prune \
    -o -newermt "@$epoch" -exec touch --no-dereference --date="@$epoch" {} +
