#!/usr/bin/env bash
# Builds the local Kubernetes control plane (plrl-k8s: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, certs) and helm from the Go module in tests/controlplane, once per machine.
#
#   scripts/build-controlplane.sh            build both if needed; print both paths (plrl-k8s first)
#   scripts/build-controlplane.sh plrl-k8s   build/print only plrl-k8s
#   scripts/build-controlplane.sh helm       build/print only helm
#
# plrl-k8s lands in ~/.cache/plrl/controlplane-<k8s version>-<key>/bin, helm in ~/.cache/plrl/helm-<version>/bin.
# The key hashes the build's inputs only: go.mod, go.sum, *.go, the Go toolchain's version and the flags
# that change the binary (never the parallelism, and nothing from the environment such as nproc's
# OMP_NUM_THREADS), so every caller (make, this script by hand, tests.infra.cluster) finds the same
# binary. A cached binary is reused (the check takes milliseconds). Go builds with every core it may use
# (its default -p is GOMAXPROCS, which follows the CPU affinity and cgroup quota, not OMP_NUM_THREADS).
# The cold build compiles a few thousand packages: helm is built inside the same module, so the
# client-go/apimachinery packages it shares with Kubernetes compile once; no cgo, no DWARF, trimmed paths.
# Progress goes to stderr; only paths go to stdout. Concurrent callers wait on a lock.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MOD="$ROOT/tests/controlplane"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/plrl"
what="${1:-all}"
case "$what" in all | plrl-k8s | helm) ;; *) echo "usage: $0 [all|plrl-k8s|helm]" >&2; exit 2 ;; esac

k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$MOD/go.mod")"
helm_version="$(awk '$1 == "helm.sh/helm/v3" {print $2; exit}' "$MOD/go.mod")"
[[ -n "$k8s_version" && -n "$helm_version" ]] || { echo "build-controlplane: versions not found in $MOD/go.mod" >&2; exit 1; }

# The official Go tarball's place, for shells whose PATH lacks it.
[[ -x /usr/local/go/bin/go ]] && PATH="$PATH:/usr/local/go/bin"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
BUILD=(go build -trimpath)
# Version stamps the apiserver reports (kubectl version, helm's .Capabilities.KubeVersion).
minor="$(cut -d. -f2 <<<"$k8s_version")"
X=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  X+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
K8S_LDFLAGS="-s -w$X"
HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"

command -v go >/dev/null || { echo "build-controlplane: needs the Go toolchain (go 1.26+) on PATH" >&2; exit 1; }
go_version="$(go env GOVERSION)"
hash="$(cd "$MOD" && { cat go.mod go.sum ./*.go; echo "$go_version $CGO_ENABLED $GOFLAGS $K8S_LDFLAGS ${BUILD[*]}"; } | sha256sum | cut -c1-12)"
k8s_bin="$CACHE/controlplane-$k8s_version-$hash/bin/plrl-k8s"
helm_bin="$CACHE/helm-$helm_version/bin/helm"

# build OUT PKG LDFLAGS: build into a temporary file beside OUT, then rename, so a half-written binary is
# never mistaken for a finished one.
build() {
  local out="$1" pkg="$2" ldflags="$3" start=$SECONDS
  [[ -x "$out" ]] && return 0
  mkdir -p "$(dirname "$out")"
  echo "build-controlplane: building $pkg -> $out with $go_version (cold: ~20 CPU-minutes)" >&2
  (cd "$MOD" && "${BUILD[@]}" -ldflags "$ldflags" -o "$out.tmp.$$" "$pkg")
  mv -f "$out.tmp.$$" "$out"
  echo "build-controlplane: built $(basename "$out") in $((SECONDS - start)) s" >&2
}

need() { [[ "$what" == all || "$what" == "$1" ]]; }
if { need plrl-k8s && [[ ! -x "$k8s_bin" ]]; } || { need helm && [[ ! -x "$helm_bin" ]]; }; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.build-controlplane.lock"
  flock 9
  need plrl-k8s && build "$k8s_bin" . "$K8S_LDFLAGS"
  need helm && build "$helm_bin" helm.sh/helm/v3/cmd/helm "$HELM_LDFLAGS"
fi
need plrl-k8s && echo "$k8s_bin"
need helm && echo "$helm_bin"
exit 0
