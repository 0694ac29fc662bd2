#!/bin/sh
# Test setup: the report test opens `tailwatch report`'s HTML in headless Chromium (Debian's package).
# Installs it when absent and this user may (root, or password-less sudo); otherwise says why the
# browser test will skip (under CI=true that test fails instead of skipping).
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test setup: no chromium and no apt-get here: the report's browser test will skip" >&2
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "test setup: chromium is not installed and installing it needs root (apt-get install chromium):" \
         "the report's browser test will skip" >&2
    exit 0
fi
echo "test setup: installing Debian's chromium for the report's browser test" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may hold no package lists yet: update only when the first try cannot find the package.
$as_root apt-get install -y -q --no-install-recommends chromium >/dev/null \
    || { $as_root apt-get update -q >/dev/null && $as_root apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
    || echo "test setup: apt-get install chromium failed: the report's browser test will skip" >&2
exit 0
