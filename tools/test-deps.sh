#!/usr/bin/env bash
# test-deps.sh installs what the tests need beside Go and the binaries make
# setup builds: podman and runc, which the e2e suite runs marina's image
# with (test/e2e/image_test.go), and what real worker nodes need beside the
# containerd make setup builds: runc, the CNI reference plugins (bridge,
# host-local, loopback, portmap in /usr/lib/cni), iptables and conntrack
# for kube-proxy. Debian's packages, installed as root; a user who is not
# root is told what to install. With --node, only what real nodes need
# (make run).
set -euo pipefail
# have says whether a command is installed, also in /usr/sbin, which is
# not on the PATH of a user who is not root.
have() { command -v "$1" >/dev/null || [[ -x /usr/sbin/$1 ]]; }
missing=()
[[ ${1:-} == --node ]] || have podman || missing+=(podman)
have runc || missing+=(runc)
have iptables || missing+=(iptables)
have conntrack || missing+=(conntrack)
for plugin in bridge host-local loopback portmap; do
  if [[ ! -x /usr/lib/cni/$plugin ]]; then
    missing+=(containernetworking-plugins)
    break
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "real worker nodes and the e2e tests need ${missing[*]}: install Debian's packages (sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "[test-deps] installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
echo "[test-deps] installed: $(podman --version 2>/dev/null || echo no podman), $(runc --version | head -1), $(iptables --version)," \
  "$(conntrack --version), CNI plugins $(dpkg-query -W -f '${Version}' containernetworking-plugins)"
