#!/bin/sh
# Test setup: `sh tests/setup/debian.sh PACKAGE COMMAND "WHAT NEEDS IT"` installs Debian's PACKAGE when
# COMMAND is absent and this user may (root, or password-less sudo); otherwise says why the test that
# needs it will skip (under CI=true that test fails instead of skipping).
set -u
package=$1 command=$2 what=$3
if command -v "$command" >/dev/null 2>&1 || [ -x "/usr/sbin/$command" ] || [ -x "/usr/bin/$command" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test setup: no $command and no apt-get here: $what will skip" >&2
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "test setup: $package is not installed and installing it needs root (apt-get install $package):" \
         "$what will skip" >&2
    exit 0
fi
echo "test setup: installing Debian's $package for $what" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may hold no package lists yet: update only when the first try cannot find the package.
$as_root apt-get install -y -q --no-install-recommends "$package" >/dev/null \
    || { $as_root apt-get update -q >/dev/null && $as_root apt-get install -y -q --no-install-recommends "$package" >/dev/null; } \
    || echo "test setup: apt-get install $package failed: $what will skip" >&2
exit 0
