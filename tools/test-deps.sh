#!/usr/bin/env bash
# test-deps.sh installs what the tests need beside Go and the binaries make
# setup builds: podman and runc, which the e2e suite runs marina's image
# with (test/e2e/image_test.go). Debian's packages, installed as root; a
# user who is not root is told what to install.
set -euo pipefail
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "the e2e tests need ${missing[*]}: install Debian's packages (sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "[test-deps] installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq podman runc >/dev/null
echo "[test-deps] installed: $(podman --version), $(runc --version | head -1)"
