#!/bin/sh
# Test setup: the log-shipping test drives the real logrotate binary (Debian's package). Installs it when
# absent and this user may (root, or password-less sudo); otherwise says why that test will skip (under
# CI=true it fails instead of skipping).
set -u
if command -v logrotate >/dev/null 2>&1 || [ -x /usr/sbin/logrotate ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test setup: no logrotate and no apt-get here: the logrotate test will skip" >&2
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "test setup: logrotate is not installed and installing it needs root (apt-get install logrotate):" \
         "the logrotate test will skip" >&2
    exit 0
fi
echo "test setup: installing Debian's logrotate for the log-shipping test" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may hold no package lists yet: update only when the first try cannot find the package.
$as_root apt-get install -y -q --no-install-recommends logrotate >/dev/null \
    || { $as_root apt-get update -q >/dev/null && $as_root apt-get install -y -q --no-install-recommends logrotate >/dev/null; } \
    || echo "test setup: apt-get install logrotate failed: the logrotate test will skip" >&2
exit 0
