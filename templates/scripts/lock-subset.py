"""Print the entries of a hash-pinned lock for the named packages only (one layer's group).

Used as `python lock-subset.py LOCK NAME... > group.txt`, then `pip install --require-hashes
-r group.txt`: the same lock and the same sha256 checks, split into layers. A name the lock
does not hold is an error. Standard library only: it runs with the image's own Python.
"""

import re
import sys


def entries(text):
    """(normalized name, the entry's lines joined) for each `name==version --hash=...` entry."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = " ".join(line.split("#", 1)[0].split())
        if line:
            yield re.sub(r"[-_.]+", "-", line.split("==", 1)[0]).lower(), line


def main(lock, names):
    with open(lock) as handle:
        found = dict(entries(handle.read()))
    missing = [name for name in names if name not in found]
    if missing:
        sys.exit("lock-subset: not in %s: %s" % (lock, ", ".join(missing)))
    for name in names:
        print(found[name])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
