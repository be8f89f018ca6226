#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd), kubectl at the control plane's version and the local
# node's kubelet with Go, from one wrapper module per Kubernetes version; helm
# from its own Go module; and two small test programs of this project
# (tests/cluster/node: the test device plugin and the sandbox "pause" binary).
# Everything lands in a cache outside the checkout, keyed by version (the test
# programs by their source), so a machine builds once. Prints the bin
# directories on success.
set -euo pipefail

# The control plane and the etcd its release names (build/dependencies.yaml
# and go.mod of k8s.io/kubernetes v1.37.2: etcd 3.7.0). 1.37 serves DRA
# DeviceTaintRules in resource.k8s.io/v1, on by default. Go 1.26 builds it
# (its go.mod says go 1.26.0; an older go command fetches that toolchain).
K8S_VERSION="${K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-3.7.0}"
# The real node's kubelet is a separate setting, so the control plane can
# move first: a kubelet up to three minor versions older than the apiserver
# is within Kubernetes' supported version skew (1.34 under 1.37 is). The
# 1.37.2 kubelet runs on this kind of host (cgroup v1, containerd 1.6.20):
# realnode.py sets failCgroupV1: false, which kubelets from 1.35 need on v1.
KUBELET_VERSION="${KUBELET_VERSION:-1.37.2}"
# helm from its Go module (helm.sh/helm/v4). 4.3.2 builds against client-go
# v0.37.2, the control plane's own release, so its default kubeVersion for
# `helm template` and its API discovery match the cluster.
HELM_VERSION="${HELM_VERSION:-4.3.2}"
CACHE="${SDCGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sdcguard}"
K8S_BIN="$CACHE/k8s-v$K8S_VERSION/bin"
ETCD_BIN="$CACHE/etcd-v$ETCD_VERSION/bin"
# kubectl comes from the control plane's module and version: within the
# one-minor skew kubectl supports by construction.
KUBECTL_BIN="$CACHE/k8s-v$K8S_VERSION/kubectl-bin"
HELM_BIN="$CACHE/helm-v$HELM_VERSION/bin"
NODE_BIN="$CACHE/k8s-v$KUBELET_VERSION/node-bin"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODE_SRC="$HERE/node"
NODE_SRC_KEY=$(cd "$NODE_SRC" && cat deviceplugin/main.go pause/main.go | sha256sum | cut -c1-12)
TESTBIN="$CACHE/node-tools-$KUBELET_VERSION-$NODE_SRC_KEY/bin"

say() { printf '[build-binaries] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "Go is not installed; install Go >= 1.24 (https://go.dev/doc/install) and rerun"
minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
[ "${minor:-0}" -ge 24 ] || die "Go $(go env GOVERSION) is too old to build Kubernetes $K8S_VERSION; install Go >= 1.24"

# The wrapper module: k8s.io/kubernetes at a version ($2) with its staging
# modules pinned to the matching v0.x releases. The staging list is read from
# that version's own go.mod (its `k8s.io/X => ./staging/src/k8s.io/X` lines),
# since it changes between minors (1.37 added cri-streaming and streaming).
write_wrapper_module() {
  local work=$1 version=$2 minor_k8s modfile staging
  minor_k8s=$(echo "$version" | cut -d. -f2)
  modfile=$(cd "$work" && printf 'module tmp\n\ngo 1.24\n' > go.mod && go mod download -json "k8s.io/kubernetes@v$version" 2>"$work/download.log" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -n "$modfile" ] && [ -f "$modfile" ] || { tail -5 "$work/download.log" >&2; die "go module download failed for k8s.io/kubernetes v$version; check that the Go module proxy is reachable (go env GOPROXY) and rerun"; }
  staging=$(sed -n 's#^[[:space:]]*k8s.io/\([a-z0-9-]*\) => ./staging/src/k8s.io/.*#\1#p' "$modfile")
  [ -n "$staging" ] || die "found no staging modules in the go.mod of k8s.io/kubernetes v$version"
  {
    echo "module sdcguard.dev/localkube"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes v$version"
    echo
    echo "replace ("
    for m in $staging; do echo "  k8s.io/$m => k8s.io/$m v0.$minor_k8s.${version##*.}"; done
    echo ")"
  } > "$work/go.mod"
}

k8s_ldflags() {
  local version=$1 minor_k8s; minor_k8s=$(echo "$version" | cut -d. -f2)
  local pkg=k8s.io/component-base/version
  local ld="-s -w -X $pkg.gitVersion=v$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor_k8s -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  echo "$ld -X k8s.io/client-go/pkg/version.gitVersion=v$version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor_k8s"
}

# The local node: the kubelet (at KUBELET_VERSION, which may differ from the
# control plane's) and the project's test device plugin and pause binary.
build_node() {
  local need_kubelet=1 need_tools=1
  [ -x "$NODE_BIN/kubelet" ] && need_kubelet=0
  [ -x "$TESTBIN/deviceplugin" ] && [ -x "$TESTBIN/pause" ] && need_tools=0
  [ $need_kubelet = 0 ] && [ $need_tools = 0 ] && return 0
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  write_wrapper_module "$work" "$KUBELET_VERSION"
  mkdir -p "$work/deviceplugin" "$work/pause"
  cp "$NODE_SRC/deviceplugin/main.go" "$work/deviceplugin/"
  cp "$NODE_SRC/pause/main.go" "$work/pause/"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  say "resolving modules for the local node (go mod tidy)"
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >"$work/tidy.log" 2>&1) || { tail -5 "$work/tidy.log" >&2; die "go module download failed for k8s.io/kubernetes v$KUBELET_VERSION; check that the Go module proxy is reachable (go env GOPROXY) and rerun"; }
  if [ $need_kubelet = 1 ]; then
    say "go build kubelet v$KUBELET_VERSION (once per machine; a few minutes on 2 cores; started $(date +%H:%M:%S))"
    mkdir -p "$NODE_BIN.tmp"
    (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$(k8s_ldflags "$KUBELET_VERSION")" -o "$NODE_BIN.tmp/kubelet" k8s.io/kubernetes/cmd/kubelet) \
      || die "go build of kubelet failed (see output above)"
    rm -rf "$NODE_BIN"; mv "$NODE_BIN.tmp" "$NODE_BIN"
  fi
  if [ $need_tools = 1 ]; then
    say "go build the test device plugin and the pause binary"
    mkdir -p "$TESTBIN.tmp"
    for t in deviceplugin pause; do
      (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$TESTBIN.tmp/$t" "./$t") \
        || die "go build of tests/cluster/node/$t failed (see output above)"
    done
    rm -rf "$TESTBIN"; mv "$TESTBIN.tmp" "$TESTBIN"
  fi
}

build_k8s() {
  if [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ] && [ -x "$K8S_BIN/kube-scheduler" ]; then
    return 0
  fi
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  say "building Kubernetes v$K8S_VERSION control plane with $(go env GOVERSION) (once per machine; 20-70 min on 2 cores)"
  write_wrapper_module "$work" "$K8S_VERSION"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  say "resolving modules (go mod tidy)"
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >"$work/tidy.log" 2>&1) || { tail -5 "$work/tidy.log" >&2; die "go module download failed for k8s.io/kubernetes v$K8S_VERSION; check that the Go module proxy is reachable (go env GOPROXY) and rerun"; }
  local ld; ld=$(k8s_ldflags "$K8S_VERSION")
  mkdir -p "$K8S_BIN.tmp"
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    say "go build $c (started $(date +%H:%M:%S))"
    (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ld" -o "$K8S_BIN.tmp/$c" "k8s.io/kubernetes/cmd/$c") \
      || die "go build of $c failed (see output above); a failed module download means the Go module proxy is unreachable"
  done
  rm -rf "$K8S_BIN"; mv "$K8S_BIN.tmp" "$K8S_BIN"
}

build_etcd() {
  [ -x "$ETCD_BIN/etcd" ] && return 0
  say "building etcd v$ETCD_VERSION with Go (once per machine; a few minutes)"
  # etcd's server module carries replace directives, so `go install` refuses
  # it; a wrapper module requiring it (and its siblings at the same version)
  # builds the same etcdmain entry point.
  local work; work=$(mktemp -d)
  cat > "$work/go.mod" <<MOD
module sdcguard.dev/localetcd

go 1.24

require (
  go.etcd.io/etcd/server/v3 v$ETCD_VERSION
  go.etcd.io/etcd/api/v3 v$ETCD_VERSION
  go.etcd.io/etcd/client/pkg/v3 v$ETCD_VERSION
  go.etcd.io/etcd/client/v3 v$ETCD_VERSION
  go.etcd.io/etcd/pkg/v3 v$ETCD_VERSION
)
MOD
  cat > "$work/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy >"$work/tidy.log" 2>&1) \
    || { tail -5 "$work/tidy.log" >&2; rm -rf "$work"; die "go module download failed for etcd v$ETCD_VERSION; check that the Go module proxy is reachable (go env GOPROXY) and rerun"; }
  mkdir -p "$ETCD_BIN"
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN/etcd.tmp" .) \
    || { rm -rf "$work"; die "go build of etcd v$ETCD_VERSION failed (see output above)"; }
  mv "$ETCD_BIN/etcd.tmp" "$ETCD_BIN/etcd"; rm -rf "$work"
}

build_kubectl() {
  [ -x "$KUBECTL_BIN/kubectl" ] && return 0
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  write_wrapper_module "$work" "$K8S_VERSION"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  say "resolving modules for kubectl (go mod tidy)"
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >"$work/tidy.log" 2>&1) || { tail -5 "$work/tidy.log" >&2; die "go module download failed for k8s.io/kubernetes v$K8S_VERSION; check that the Go module proxy is reachable (go env GOPROXY) and rerun"; }
  say "go build kubectl v$K8S_VERSION (once per machine; started $(date +%H:%M:%S))"
  mkdir -p "$KUBECTL_BIN.tmp"
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$(k8s_ldflags "$K8S_VERSION")" -o "$KUBECTL_BIN.tmp/kubectl" k8s.io/kubernetes/cmd/kubectl) \
    || die "go build of kubectl failed (see output above)"
  rm -rf "$KUBECTL_BIN"; mv "$KUBECTL_BIN.tmp" "$KUBECTL_BIN"
}

# helm's go.mod has no replace directives, so `go install module@version`
# builds it as released; the ldflags are the ones its Makefile sets for a tag.
build_helm() {
  [ -x "$HELM_BIN/helm" ] && return 0
  say "go build helm v$HELM_VERSION (once per machine; started $(date +%H:%M:%S))"
  local pkg=helm.sh/helm/v4/internal/version
  rm -rf "$HELM_BIN.tmp"; mkdir -p "$HELM_BIN.tmp"
  GOBIN="$HELM_BIN.tmp" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X $pkg.version=v$HELM_VERSION -X $pkg.metadata= -X $pkg.gitTreeState=clean" \
    "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION" \
    || die "go install of helm v$HELM_VERSION failed (see output above); a failed module download means the Go module proxy is unreachable"
  rm -rf "$HELM_BIN"; mv "$HELM_BIN.tmp" "$HELM_BIN"
}

PATHS="$K8S_BIN:$ETCD_BIN:$KUBECTL_BIN:$HELM_BIN:$NODE_BIN:$TESTBIN"
# Everything there already: no lock, so a build of another version in the same
# cache does not hold up test runs of this one.
if [ -x "$HELM_BIN/helm" ] && [ -x "$KUBECTL_BIN/kubectl" ] && [ -x "$ETCD_BIN/etcd" ] \
  && [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ] \
  && [ -x "$K8S_BIN/kube-scheduler" ] && [ -x "$NODE_BIN/kubelet" ] \
  && [ -x "$TESTBIN/deviceplugin" ] && [ -x "$TESTBIN/pause" ]; then
  echo "$PATHS"
  exit 0
fi

# One build at a time per cache (two test runs starting together would
# otherwise both compile Kubernetes on the same cores).
mkdir -p "$CACHE"
exec 9>"$CACHE/.build-binaries.lock"
flock 9
build_etcd
build_k8s
build_kubectl
build_helm
build_node
echo "$PATHS"
