"""Remove paths under site-packages that no runtime opens (data/layout.yaml says which and why).

Used as `python prune-paths.py SITE_PACKAGES PATTERN...` in the step that installed them, so
no layer carries them. Patterns are globs relative to site-packages (`**` spans folders).
Prints what it removed, by pattern. Standard library only: it runs with the image's own Python.
"""

import glob
import os
import shutil
import sys


def size_of(path):
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def main(root, patterns):
    for pattern in patterns:
        matched = sorted(glob.glob(os.path.join(root, pattern), recursive=True), reverse=True)
        freed = 0
        for path in matched:
            if not os.path.lexists(path):
                continue  # inside a folder removed just before
            freed += size_of(path)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        if matched:
            print("prune-paths: %s: %d paths, %.1f MB" % (pattern, len(matched), freed / 1e6))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
