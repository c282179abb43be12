"""The suite in two parts that may run at once, one pytest process each (`nox -s tests` does).

"host": the integration tests on the host's engine, which share its images, its build cache and
one build of the cell, so they run one after the other in one process.
"beside": everything else: the unit tests, those that need only the network, and integration
tests marked `beside`, which bring what they touch with them (the hosted-runner test: an engine,
a user and a view of the host's packages of its own).

On a 2-core machine the host's tests leave a core idle much of the time (a build waits on one
pip or one hash at a time): the beside part uses it. Every test selected belongs to exactly one
part, so the two runs together are the one run.
"""

from __future__ import annotations

from collections.abc import Iterable

PARTS = ("host", "beside")
VARIABLE = "TORCH_IMAGES_TESTS_PART"  # which part this process runs; unset: all of them


def part_of(markers: Iterable[str]) -> str:
    """The part a test with these marker names belongs to."""
    names = set(markers)
    return "host" if "integration" in names and "beside" not in names else "beside"
