#!/bin/sh
# The last command of every RUN step: the layer leaves the step already normalized, so the
# builder keeps it byte for byte instead of rewriting it after the build (see builder/repro.py).
# - Files the step wrote in log and cache directories go: their content names the moment.
# - /tmp is emptied.
# - Every path the step touched gets SOURCE_DATE_EPOCH as its modification time.
# Docker's per-container files (its init layer and mounts) are left alone: touching them
# would copy them into the layer.
set -eu
epoch=${SOURCE_DATE_EPOCH:?SOURCE_DATE_EPOCH must be set}
find /var/cache/apt /var/cache/ldconfig /var/log -xdev ! -type d -newermt "@$epoch" -delete
find /tmp -mindepth 1 -delete
find / -xdev -mindepth 1 \( -path /proc -o -path /sys -o -path /dev -o -path /.dockerenv \
    -o -path /etc/hosts -o -path /etc/hostname -o -path /etc/resolv.conf -o -path /etc/mtab \) -prune \
    -o -newermt "@$epoch" -exec touch --no-dereference --date="@$epoch" {} +
