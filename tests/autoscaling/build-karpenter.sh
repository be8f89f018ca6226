#!/usr/bin/env bash
# Builds Karpenter's kwok cloud provider (the real Karpenter controllers with a
# cloud provider whose "instances" are Node objects) from the Go module
# sigs.k8s.io/karpenter, and copies its CRDs (NodePool, NodeClaim, NodeOverlay,
# CapacityBuffer, KWOKNodeClass) out of the module's own files. Everything lands
# in the project's cache, keyed by version, so a machine builds once. Prints the
# version directory (bin/karpenter-kwok, crds/*.yaml) on success.
set -euo pipefail

KARPENTER_VERSION="${KARPENTER_VERSION:-1.15.0}"
# The module's go.mod asks for this Go release; the go command fetches that
# toolchain (itself a Go module) when the local one is older.
KARPENTER_GO="${KARPENTER_GO:-go1.26.9}"
CACHE="${SDCGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sdcguard}"
DIR="$CACHE/karpenter-v$KARPENTER_VERSION"

say() { printf '[build-karpenter] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

if [ -x "$DIR/bin/karpenter-kwok" ] && [ -f "$DIR/crds/.complete" ]; then
  echo "$DIR"
  exit 0
fi
command -v go >/dev/null || die "Go is not installed; install Go >= 1.24 (https://go.dev/doc/install) and rerun"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/go.mod" <<MOD
module sdcguard.dev/localkarpenter

go ${KARPENTER_GO#go}

require sigs.k8s.io/karpenter v$KARPENTER_VERSION
MOD
cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/karpenter/kwok"
GO
export GOTOOLCHAIN=auto  # the local Go, or the module's Go release when the local one is older
say "resolving sigs.k8s.io/karpenter v$KARPENTER_VERSION with $KARPENTER_GO (go mod tidy; fetches that toolchain once if needed)"
(cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >"$work/tidy.log" 2>&1) \
  || { tail -5 "$work/tidy.log" >&2; die "go module download failed for sigs.k8s.io/karpenter v$KARPENTER_VERSION; check that the Go module proxy is reachable (go env GOPROXY) and rerun"; }
src=$(cd "$work" && go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
[ -d "$src/kwok" ] || die "sigs.k8s.io/karpenter v$KARPENTER_VERSION has no kwok/ directory in $src"

mkdir -p "$DIR/bin" "$DIR/crds.tmp"
if [ ! -x "$DIR/bin/karpenter-kwok" ]; then
  say "go build sigs.k8s.io/karpenter/kwok (started $(date +%H:%M:%S); once per machine, 5-10 min on 2 cores)"
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=v$KARPENTER_VERSION" \
      -o "$DIR/bin/karpenter-kwok.tmp" sigs.k8s.io/karpenter/kwok) \
    || die "go build of sigs.k8s.io/karpenter/kwok v$KARPENTER_VERSION failed (see output above)"
  mv "$DIR/bin/karpenter-kwok.tmp" "$DIR/bin/karpenter-kwok"
  say "built $(date +%H:%M:%S)"
fi
# The CRDs as the module ships them: core ones with the kwok chart, the node class
# with the kwok APIs.
cp "$src"/kwok/charts/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$DIR/crds.tmp/"
chmod u+w "$DIR"/crds.tmp/*.yaml
touch "$DIR/crds.tmp/.complete"
rm -rf "$DIR/crds"; mv "$DIR/crds.tmp" "$DIR/crds"
echo "$DIR"
