#!/usr/bin/env bash
# build.sh builds the pinned components (tools/versions.env) into bin/,
# rebuilding only what is missing. Every binary is cached outside the clone,
# keyed by component, version and a hash of its build inputs, so a fresh clone
# on the same machine (as CI is) reuses it:
#   ${MARINA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/marina}/bin/<name>-<version>-<key>
# Outputs:
#   bin/etcd-<v>, bin/kube-{apiserver,controller-manager,scheduler,proxy}-<v>, bin/kubelet-<v>
#   bin/containerd-<v>, bin/containerd-shim-runc-v2-<v>, bin/ctr-<v>
#   bin/coredns-<v>             the cluster DNS addon (make images packs it)
#   bin/registry-<v>            the OCI registry marina up serves the images from
#   bin/kubectl-<newest>
#   bin/kubectl                 the newest kubectl
#   bin/k8s/<kube-version>/     etcd + kube-apiserver + kubectl, the layout
#                               envtest's KUBEBUILDER_ASSETS expects
# Usage: tools/build.sh [--only-newest]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source tools/versions.env
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

cache=${MARINA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/marina}/bin
mkdir -p "$cache" bin
gover=$(go env GOVERSION)
# The control-plane components are built for every release; kubectl only for
# the newest (it is the client of all of them), which saves minutes of a cold
# build.
control_plane="kube-apiserver kube-controller-manager kube-scheduler"
# What a real node runs beside its container runtime (issue 32): built for
# every release, as an InPlace upgrade upgrades the kubelet too.
node="kubelet kube-proxy"

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# key prints a short hash of everything that decides the binary's bytes.
key() {
  local dir=$1 flags=$2
  { cat "$dir"/go.mod "$dir"/go.sum; cat "$dir"/*.go 2>/dev/null || true
    echo "$gover $flags"; } | sha256sum | cut -c1-16
}

# progress reads `go build -v` output and prints a line every 200 packages,
# so a long build is visibly alive without flooding the terminal.
progress() {
  local what=$1 n=0 start=$SECONDS
  while IFS= read -r line; do
    case $line in
      # go build -v prints one import path per package; anything else
      # (compiler errors, "go: ..." messages) is shown as it is.
      *' '*|*:*) printf '%s\n' "$line" ;;
      *) n=$((n + 1)); if ((n % 200 == 0)); then log "$what: $n packages compiled ($((SECONDS - start))s)"; fi ;;
    esac
  done
}

# install links a cached binary into bin/ under its versioned name.
install_bin() {
  local cached=$1 name=$2
  ln -f "$cached" "bin/$name" 2>/dev/null || cp -f "$cached" "bin/$name"
}

# build_main builds the main package of tools/<name> (a tiny main around
# a pinned module) into bin/<name>-<version>.
build_main() {
  local name=$1 v=$2 minutes=$3 k out
  k=$(key "tools/$name" "")
  out="$cache/$name-$v-$k"
  if [[ ! -x $out ]]; then
    log "building $name $v (about $minutes min on 2 cores when the Go caches are cold)"
    local start=$SECONDS tmp
    tmp=$(mktemp -d "$cache/.build.XXXXXX")
    (cd "tools/$name" && go build -v -trimpath -ldflags "-s -w" -o "$tmp/$name" . 2>&1) | progress "$name $v"
    mv "$tmp/$name" "$out" && rmdir "$tmp"
    log "built $name $v in $((SECONDS - start))s"
  fi
  install_bin "$out" "$name-$v"
}

# build_containerd builds containerd's daemon, its runc shim and ctr from
# containerd's own module (tools/containerd). The tags are those of
# containerd's static release, less what a node does not use: the btrfs
# snapshotter (it needs cgo), devmapper and zfs, and the CLI's docs
# generator; the shim is built without gRPC, as containerd's Makefile does.
build_containerd() {
  local v=$CONTAINERD_VERSION m=github.com/containerd/containerd/v2 k c missing=""
  local bins="containerd containerd-shim-runc-v2 ctr"
  local tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
  local ldflags="-s -w -X $m/version.Version=$v"
  k=$(key tools/containerd "$ldflags -tags $tags")
  for c in $bins; do
    [[ -x "$cache/$c-$v-$k" ]] || missing+=" $c"
  done
  if [[ -n $missing ]]; then
    log "building containerd $v (about 3 min on 2 cores when the Go caches are cold)"
    local start=$SECONDS tmp
    tmp=$(mktemp -d "$cache/.build.XXXXXX")
    (cd tools/containerd &&
      go build -v -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "$m/cmd/containerd" "$m/cmd/ctr" 2>&1 &&
      go build -v -trimpath -tags "$tags no_grpc" -ldflags "$ldflags" -o "$tmp/" "$m/cmd/containerd-shim-runc-v2" 2>&1) |
      progress "containerd $v"
    for c in $bins; do mv "$tmp/$c" "$cache/$c-$v-$k"; done
    rmdir "$tmp"
    log "built containerd $v in $((SECONDS - start))s"
  fi
  for c in $bins; do install_bin "$cache/$c-$v-$k" "$c-$v"; done
}

build_kube() {
  local v=$1 components=$2 minor major=1 ldflags k missing="" c
  minor=${v#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  k=$(key "tools/kube-$v" "$ldflags")
  for c in $components; do
    [[ -x "$cache/$c-$v-$k" ]] || missing+=" $c"
  done
  if [[ -n $missing ]]; then
    log "building$missing $v (about 15 min on 2 cores when the Go caches are cold)"
    local start=$SECONDS tmp pkgs=""
    tmp=$(mktemp -d "$cache/.build.XXXXXX")
    for c in $missing; do pkgs+=" k8s.io/kubernetes/cmd/$c"; done
    # One invocation for all components: they share most packages, and the go
    # command schedules their compilation together.
    # shellcheck disable=SC2086
    (cd "tools/kube-$v" && go build -v -trimpath -ldflags "$ldflags" -o "$tmp/" $pkgs 2>&1) | progress "kubernetes $v"
    for c in $missing; do mv "$tmp/$c" "$cache/$c-$v-$k"; done
    rmdir "$tmp"
    log "built$missing $v in $((SECONDS - start))s"
  fi
  for c in $components; do install_bin "$cache/$c-$v-$k" "$c-$v"; done
  mkdir -p "bin/k8s/$v"
  ln -sfn "../../kube-apiserver-$v" "bin/k8s/$v/kube-apiserver"
  ln -sfn "../../etcd-$ETCD_VERSION" "bin/k8s/$v/etcd"
  # One client for every release: the newest kubectl speaks to the releases
  # before it.
  ln -sfn "../../kubectl-$newest" "bin/k8s/$v/kubectl"
}

versions=($KUBE_VERSIONS)
newest=${versions[-1]}
build_main etcd "$ETCD_VERSION" 5
# The newest release first: the tests that need only an API server use it.
build_kube "$newest" "$control_plane $node kubectl"
ln -sfn "kubectl-$newest" bin/kubectl
# The container runtime of real worker nodes, after what the API-server
# tests need.
build_containerd
build_main coredns "$COREDNS_VERSION" 4
build_main registry "$REGISTRY_VERSION" 1
if [[ ${1:-} != --only-newest ]]; then
  for v in "${versions[@]}"; do [[ $v == "$newest" ]] || build_kube "$v" "$control_plane $node"; done
fi
log "bin/ is ready: etcd $ETCD_VERSION, containerd $CONTAINERD_VERSION, coredns $COREDNS_VERSION, registry $REGISTRY_VERSION, kubernetes $KUBE_VERSIONS"
