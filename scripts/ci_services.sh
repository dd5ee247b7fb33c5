#!/usr/bin/env bash
# The real services the test suite uses, on a fresh Debian machine (run as root; idempotent):
#   - packages: Slurm (slurmctld, slurmd, slurm-client) with munge; iproute2 and iputils-ping
#     for the network-namespace hosts; openssh-server/-client for the SSH tests; chromium (driven
#     by Playwright, which never downloads a browser of its own) and fonts for the dashboard
#     tests; tmux for the tests that run `regency top` and `regency shell` in a real terminal;
#     kubectl; fuse3 (and libfuse3-dev) for the remote and gather mount tests on real FUSE mounts;
#   - a running two-node Slurm cluster on this machine (scripts/slurm_cluster.sh).
# Tests that need a service skip, with the reason, when it is absent; in CI it is present.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(slurmctld slurmd slurm-client munge iproute2 iputils-ping openssh-server openssh-client
    chromium fonts-dejavu-core tmux fuse3 libfuse3-dev)

if [[ $(id -u) -ne 0 ]]; then
    echo "ci_services: must run as root" >&2
    exit 1
fi

scripts/apt_install.sh "${PACKAGES[@]}"
# kubectl, for the test that runs the real one: Debian's (kubernetes-client) unless one is here
# already (a kubectl from Kubernetes' own repository is a different package owning the same path).
command -v kubectl >/dev/null || scripts/apt_install.sh kubernetes-client
timeout 180 scripts/slurm_cluster.sh start
