#!/bin/sh
# The installed packages that own the files matching each path glob, one per line: dpkg's
# database keeps the files a path-exclude left out, so a flavor that keeps them (data/layout.yaml's
# kept_by) knows what to reinstall. Fails, naming the glob, when no package owns a match: a
# restore that reinstalled nothing would pass unnoticed.
set -eu
owners=""
for glob in "$@"; do
    found=$(dpkg-query --search "$glob" 2>/dev/null) || { echo "owners-of: no package owns $glob" >&2; exit 1; }
    # "pkg1, pkg2:arch: /path" lines; dpkg-divert's "diversion by ..." lines name no owner.
    owners="$owners$(printf '%s\n' "$found" | grep -v '^diversion by' | sed 's/: .*//' | tr ',' '\n' | sed 's/^ *//')
"
done
printf '%s' "$owners" | sort -u
