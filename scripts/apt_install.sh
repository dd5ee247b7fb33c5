#!/usr/bin/env bash
# Install the given Debian packages (with --no-install-recommends) unless all are installed.
# Needs root. Package init scripts are not allowed to start daemons (a temporary
# /usr/sbin/policy-rc.d when there is none): the scripts here start the daemons they need.
# Package lists are refreshed only when the install cannot proceed without them.
set -euo pipefail

missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
    echo "apt_install: must run as root to install ${missing[*]}" >&2
    exit 1
fi
echo "apt_install: installing ${missing[*]}" >&2
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
