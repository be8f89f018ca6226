#!/usr/bin/env bash
# Installs what a real local node and the image builds need from Debian's
# packages: containerd + runc (the container runtime), the CNI plugins (pod
# network), iptables (the CNI bridge's masquerade rule and kube-proxy), buildah
# (daemonless OCI image builds) and mmdebstrap (a base image from Debian
# packages, since no container registry is needed), and tmux, zsh and
# bash-completion (the CLI's completion tests drive real shells). Idempotent: installs only
# what is missing, and runs `apt-get update` once when it installs anything.
set -euo pipefail

say() { printf '[setup-host] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# command name -> Debian package
declare -A NEED=(
  [containerd]=containerd
  [runc]=runc
  [iptables]=iptables
  [buildah]=buildah
  [mmdebstrap]=mmdebstrap
  [tmux]=tmux
  [zsh]=zsh
)
missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
  || missing+=(containernetworking-plugins)
[ -f /usr/share/bash-completion/bash_completion ] || missing+=(bash-completion)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
[ "$(uname -s)" = Linux ] || die "a real node needs Linux (found $(uname -s))"
[ "$(id -u)" = 0 ] || die "installing ${missing[*]} needs root; rerun as root or install them: apt-get install ${missing[*]}"
command -v apt-get >/dev/null || die "apt-get not found; install these Debian packages (or your distribution's equivalents): ${missing[*]}"
say "installing ${missing[*]} from Debian packages (once per machine)"
say "apt-get update"
DEBIAN_FRONTEND=noninteractive apt-get update -q >/tmp/sdcguard-apt-update.log 2>&1 \
  || { tail -5 /tmp/sdcguard-apt-update.log >&2; die "apt-get update failed (see above)"; }
say "apt-get install ${missing[*]}"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
  >/tmp/sdcguard-apt-install.log 2>&1 \
  || { tail -10 /tmp/sdcguard-apt-install.log >&2; die "apt-get install ${missing[*]} failed (see above)"; }
# Debian's containerd package enables a system service on install; the local
# node runs its own containerd (own root, state and socket), so the system one
# is not needed. It is left as the package set it up.
say "installed: $(containerd --version 2>/dev/null | awk '{print $3}') containerd, runc $(runc --version | awk 'NR==1{print $3}'), buildah $(buildah --version | awk '{print $3}')"
