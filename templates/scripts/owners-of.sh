#!/bin/sh
# The installed packages that own the files matching the path globs, one per line: dpkg's
# database keeps the files a path-exclude left out, so a flavor that keeps them (data/layout.yaml's
# kept_by) knows what to reinstall. A glob may match nothing on one distro (gcc keeps lto1 in
# /usr/lib on one release and /usr/libexec on another); when none matches, it fails: a restore
# that reinstalled nothing would pass unnoticed.
set -eu
owners=""
for glob in "$@"; do
    found=$(dpkg-query --search "$glob" 2>/dev/null) || continue
    # "pkg1, pkg2:arch: /path" lines; dpkg-divert's "diversion by ..." lines name no owner.
    owners="$owners$(printf '%s\n' "$found" | grep -v '^diversion by' | sed 's/: .*//' | tr ',' '\n' | sed 's/^ *//')
"
done
[ -n "$owners" ] || { echo "owners-of: no package owns any of: $*" >&2; exit 1; }
printf '%s' "$owners" | sort -u
