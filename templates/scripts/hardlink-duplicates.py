"""Replace byte-identical files that this pip step installed with hard links to one copy.

Wheels cannot hold symlinks, so packages ship libfoo.so, libfoo.so.13 and libfoo.so.13.2 as
three full copies of one library. Linking them keeps every path working and stores the
library once.

Only the files of the packages this step installed are considered: the step's lock names
them, and each installed package's RECORD (written by pip) lists its files. Linking to a file
of a lower layer would copy that file up into this layer, so those are never looked at, nor
read: the layers below are not walked at all. Modification times say nothing here (the
canonical encoding clamps them after the build, not the steps).

Usage: hardlink-duplicates.py ROOT LOCK [LOCK ...]. Standard library only: it runs with the
image's own Python (3.9 and later).
"""

import csv
import glob
import hashlib
import os
import re
import sys
import time
from collections import defaultdict

MINIMUM = 1 << 16  # smaller files are not worth a link
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", re.MULTILINE)


def canonical(name):
    """A project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_projects(lock_paths):
    """The projects the step's locks name."""
    projects = set()
    for path in lock_paths:
        with open(path, encoding="utf-8") as handle:
            projects.update(canonical(name) for name in REQUIREMENT.findall(handle.read()))
    return projects


def installed_files(root, projects):
    """Every regular file the given projects' RECORDs list, under root (each once)."""
    files = set()
    real_root = os.path.realpath(root)
    for site in glob.glob(os.path.join(root, "lib", "python3*", "site-packages")):
        for record in glob.glob(os.path.join(site, "*.dist-info", "RECORD")):
            project = os.path.basename(os.path.dirname(record)).split("-")[0]
            if canonical(project) not in projects:
                continue
            with open(record, encoding="utf-8", newline="") as handle:
                for row in csv.reader(handle):
                    if not row:
                        continue
                    path = os.path.normpath(os.path.join(site, row[0]))
                    if os.path.realpath(os.path.dirname(path)).startswith(real_root + os.sep):
                        files.add(path)
    return files


def link_duplicates(paths, minimum=MINIMUM):
    """Link each group of byte-identical files to its first path (in byte order); returns the
    bytes saved and the bytes read."""
    by_size = defaultdict(list)
    for path in paths:
        try:
            status = os.lstat(path)
        except FileNotFoundError:  # pruned after pip wrote it
            continue
        if status.st_size >= minimum and (status.st_mode & 0o170000) == 0o100000:
            by_size[status.st_size].append(path)
    saved = read = 0
    for size, group in by_size.items():
        if len(group) < 2:
            continue
        first_by_digest = {}
        for path in sorted(group):
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            read += size
            first = first_by_digest.setdefault(digest.hexdigest(), path)
            if first != path and os.stat(first).st_ino != os.stat(path).st_ino:
                os.unlink(path)
                os.link(first, path)
                saved += size
    return saved, read


def main(root, lock_paths):
    started = time.monotonic()
    files = installed_files(root, locked_projects(lock_paths))
    saved, read = link_duplicates(files)
    print(
        f"hardlink-duplicates: {saved / 1e6:.1f} MB stored once instead of twice among the {len(files)} files "
        f"this step installed ({read / 1e6:.1f} MB read, {time.monotonic() - started:.1f} s)"
    )


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: hardlink-duplicates.py ROOT LOCK [LOCK ...]")
    main(sys.argv[1], sys.argv[2:])
