#!/usr/bin/env bash
# Headless Chromium for tests/test_report.py (the report rendered as a person opens it): Debian's `chromium`
# package, installed when missing. If it cannot be installed (no root, no apt, no mirror) this says so in one line
# and the suite goes on: the report test then FAILS (it never skips), naming this script.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; fi
fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; }; then
  if $sudo apt-get install -y -q chromium >/dev/null 2>&1 || \
     { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q chromium >/dev/null 2>&1; }; then
    echo "installed chromium ($(chromium --version 2>/dev/null))"
    exit 0
  fi
fi
echo "chromium could not be installed (needs apt-get as root and a Debian mirror): tests/test_report.py will fail" >&2
exit 0
