"""Replace byte-identical files under a directory with hard links to one copy.

Wheels cannot hold symlinks, so packages ship libfoo.so, libfoo.so.13 and libfoo.so.13.2 as
three full copies of one library. Linking them keeps every path working and stores the
library once. Only files this build step wrote are considered (modified after
SOURCE_DATE_EPOCH: every earlier step settled its files to it): linking to a file of a lower
layer would copy that file up into this one. Standard library only: it runs with the image's
own Python.
"""

import hashlib
import os
import sys
from collections import defaultdict


def main(root: str, minimum: int = 1 << 16) -> None:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    by_size = defaultdict(list)
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            status = os.stat(path)
            if status.st_size >= minimum and status.st_mtime > epoch:
                by_size[status.st_size].append(path)
    saved = 0
    for size, paths in by_size.items():
        if len(paths) < 2:
            continue
        first_by_digest = {}
        for path in sorted(paths):
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            first = first_by_digest.setdefault(digest, path)
            if first != path and os.stat(first).st_ino != os.stat(path).st_ino:
                os.unlink(path)
                os.link(first, path)
                saved += size
    print(f"hardlink-duplicates: {saved / 1e6:.1f} MB stored once instead of twice under {root}")


if __name__ == "__main__":
    main(sys.argv[1])
