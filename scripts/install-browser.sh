#!/usr/bin/env bash
# install-browser.sh - install the headless Chromium that the browser tests (tests/browser) drive
# through playwright, to check report.html in a real browser. Debian/Ubuntu with apt; run as root.
#
#   scripts/install-browser.sh        # then: pytest -m browser
#
# Installs Debian's `chromium` package (/usr/bin/chromium) and a font, quietly. Playwright's own
# browser download (`playwright install`) is not used: it fetches at test time and pins a build,
# while playwright launches any recent Chromium given its path (executable_path). The playwright
# Python package itself comes with the test extra: pip install -e '.[test]'.
#
# Idempotent: when $GPUSCALE_CHROMIUM (default /usr/bin/chromium) already runs, it says so and
# changes nothing. Prints what it did; exits non-zero with the reason when it cannot install.
set -euo pipefail

BROWSER=${GPUSCALE_CHROMIUM:-/usr/bin/chromium}

say() { echo "install-browser: $*"; }

version() {
  # Debian's launcher script prints a harmless shell warning on stderr; the version goes to stdout.
  "$BROWSER" --version 2>/dev/null
}

if [[ -x $BROWSER ]] && version >/dev/null; then
  say "$(version) is already at $BROWSER; nothing to do"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  say "$BROWSER is missing and installing it needs root: sudo $0" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  say "no apt-get here; install Chromium with this system's package manager and set GPUSCALE_CHROMIUM to its path" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
say "apt-get update"
apt-get update -qq
say "apt-get install chromium fonts-dejavu-core"
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
if ! version >/dev/null; then
  say "installed the chromium package, but $BROWSER --version fails" >&2
  exit 1
fi
say "installed $(version) at $BROWSER"
