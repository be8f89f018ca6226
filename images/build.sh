#!/usr/bin/env bash
# Builds the project's container images with buildah, without a daemon and
# without a container registry:
#
#   base      Debian bookworm + python3 from Debian's packages (mmdebstrap), the
#             BASE_IMAGE of the others here, named by its digest (users build FROM
#             their own, by digest too: the Dockerfiles refuse a tag).
#   operator  images/operator/Dockerfile
#   probe     jobs/images/Dockerfile.probe (torch from PyPI: CUDA and CPU)
#   xla       jobs/images/Dockerfile.xla (torch + torch-xla[tpu])
#   pause     the local node's sandbox image (tests/cluster/node/pause)
#
#   bash images/build.sh [operator] [probe] [xla] [pause]   (default: pause operator probe)
#
# Each image is tagged by the hash of what goes into it (Dockerfile, build
# context files, base image, build arguments) as localhost/sdcguard-NAME:HASH
# and saved as an OCI archive under $SDCGUARD_CACHE/images, so a machine
# builds each content once; `ctr images import` takes the archive. Python
# packages come from a wheelhouse in the cache (pip download once, keyed by
# the pinned versions) and are installed in the build with --no-index, so the
# several GB of torch wheels are downloaded once per machine, not once per build.
# Prints one line per image on stdout: NAME REFERENCE ARCHIVE. Beside each archive
# of operator, probe and xla lies its CycloneDX SBOM, NAME-HASH.cdx.json
# (images/sbom.py: the image's Python distributions and Debian packages).
#
# Why buildah: it builds Dockerfiles without a daemon, runs as a plain command
# (RUN steps under chroot isolation, no user-namespace setup), writes OCI
# archives directly, and ships as a Debian package. Its overlay storage and
# layer cache live in the cache too, so a change of the probe's code rebuilds
# only the layers above torch.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SDCGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sdcguard}"
OUT="$CACHE/images"
WHEELS="$CACHE/wheelhouse-py311"
STORE="$CACHE/buildah-overlay"
SUITE=bookworm
# libstdc++6: torch and pydantic-core link it (python:3.11-slim carries it too).
BASE_PACKAGES="python3,python3-venv,ca-certificates,libstdc++6"

say() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

[ "$(uname -s)" = Linux ] || die "building images needs Linux (found $(uname -s))"
[ "$(id -u)" = 0 ] || die "building images with buildah here needs root (chroot isolation); rerun as root"
bash "$REPO/tests/cluster/node/setup-host.sh"

BUILDAH=(buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver overlay)
rm -rf "$CACHE/buildah"  # the vfs store of earlier versions of this script
mkdir -p "$OUT" "$WHEELS" "$STORE"
exec 8>"$OUT/.lock"
flock 8

PY="${PY:-}"
if [ -z "$PY" ]; then
  PY=$(ls -d "$CACHE"/venv-py311-*/bin/python 2>/dev/null | head -1 || true)
fi
[ -n "$PY" ] || PY=python3

sha() { sha256sum | cut -c1-12; }

# base: a rootfs from Debian packages, imported as localhost/sdcguard-base:KEY.
base_image() {
  local key; key=$(printf '%s %s %s' "$SUITE" "$BASE_PACKAGES" "$(mmdebstrap --version)" | sha)
  local ref="localhost/sdcguard-base:$key" tar="$OUT/base-$key.rootfs.tar"
  if ! "${BUILDAH[@]}" inspect --type image "$ref" >/dev/null 2>&1; then
    if [ ! -s "$tar" ]; then
      local t0=$SECONDS
      say "base: mmdebstrap $SUITE with $BASE_PACKAGES (once per machine, about 1-2 min)"
      # (the output's extension tells mmdebstrap to write a tarball)
      rm -rf "$tar.tmp.tar"
      mmdebstrap --quiet --variant=essential --include="$BASE_PACKAGES" "$SUITE" "$tar.tmp.tar" \
        || die "mmdebstrap failed (see above); it needs Debian's package mirror, as apt-get does"
      mv "$tar.tmp.tar" "$tar"
      say "base: rootfs $(du -h "$tar" | cut -f1) in $((SECONDS - t0))s"
    fi
    local ctr; ctr=$("${BUILDAH[@]}" from --pull-never scratch)
    "${BUILDAH[@]}" add "$ctr" "$tar" / >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd /bin/sh "$ctr"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$ref" >/dev/null
    say "base: $ref"
  fi
  BASE_ID=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$ref")
  # The images name their base by digest (their Dockerfiles refuse a tag).
  BASE_REF="localhost/sdcguard-base@$("${BUILDAH[@]}" inspect --type image \
    --format '{{.FromImageDigest}}' "$ref")"
}

# wheelhouse REQUIREMENT...: download the wheels once per set of pins.
wheelhouse() {
  # What pip needs to build the project's own wheels in an image (--no-index):
  # the build backend its pyproject.toml files name.
  local build=("setuptools>=77" wheel)
  local key; key=$(printf '%s\n' "$@" "${build[@]}" | sort | sha)
  [ -e "$WHEELS/.complete-$key" ] && return 0
  say "wheelhouse: pip download $* (once per machine; torch is about 4 GB)"
  # The venv's pip runs on this machine's Python 3.11 (bookworm's, like the
  # base), so it picks the wheels the image's Python takes.
  "$PY" -m pip download --quiet --progress-bar off --only-binary=:all: -d "$WHEELS" "$@" "${build[@]}" \
    || die "pip download failed (see above); check that the Python package index is reachable"
  touch "$WHEELS/.complete-$key"
}

# context DIR PATH...: the build context, from the files git knows (tracked,
# or new and not ignored), so caches and build outputs never leak in.
context() {
  local dir=$1; shift
  (cd "$REPO" && git ls-files -z -co --exclude-standard -- "$@") \
    | (cd "$REPO" && while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done) \
    | (cd "$REPO" && tar --null -T - -cf -) | tar -xf - -C "$dir"
}

hash_dir() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha; }

# build NAME DOCKERFILE "BUILD-ARGS" PATH...
build() {
  local name=$1 dockerfile=$2 args=$3; shift 3
  local ctx; ctx=$(mktemp -d)
  context "$ctx" "$dockerfile" "$@"
  # pyproject.toml names README.md as the package's long description; the image
  # does not need its text, and an edit of the README must not rebuild an image.
  [ -f "$ctx/README.md" ] && echo "sdcguard: see the project's README." >"$ctx/README.md"
  local tag; tag=$(printf '%s %s %s' "$BASE_ID" "$args" "$(hash_dir "$ctx")" | sha)
  local ref="localhost/sdcguard-$name:$tag" archive="$OUT/$name-$tag.oci.tar"
  if [ -s "$archive" ]; then
    rm -rf "$ctx"
    sbom "$name" "$ref" "$archive"
    echo "$name $ref $archive"
    return 0
  fi
  local t0=$SECONDS
  say "$name: building $ref from $dockerfile"
  local bargs=(--build-arg "BASE_IMAGE=$BASE_REF" --build-arg PIP_NO_INDEX=1
    --build-arg PIP_FIND_LINKS=/wheels)
  local a
  for a in $args; do bargs+=(--build-arg "$a"); done
  "${BUILDAH[@]}" bud --quiet --pull-never --isolation chroot --layers \
    -v "$WHEELS:/wheels:ro" -f "$ctx/$dockerfile" "${bargs[@]}" -t "$ref" "$ctx" >&2 \
    || { rm -rf "$ctx"; die "buildah bud of $name failed (see above)"; }
  rm -rf "$ctx"
  say "$name: built in $((SECONDS - t0))s; saving the OCI archive"
  # Uncompressed layers: gzip of a torch layer is slow, and
  # the archive is imported on this machine only (push to a registry compresses).
  "${BUILDAH[@]}" push --quiet --disable-compression "$ref" "oci-archive:$archive.tmp:$ref" >&2
  mv "$archive.tmp" "$archive"
  say "$name: $ref ($(du -h "$archive" | cut -f1)) in $((SECONDS - t0))s"
  # Keep the two newest archives per image (two checkouts at different
  # contents do not rebuild each other's); the local node drops the images
  # whose archives are gone.
  ls -t "$OUT/$name"-*.oci.tar 2>/dev/null | tail -n +3 | xargs -r rm -f
  # An SBOM goes with its archive (a glob that matches nothing stays as it is).
  local sbom_file
  for sbom_file in "$OUT/$name"-*.cdx.json; do
    [ -e "${sbom_file%.cdx.json}.oci.tar" ] || rm -f "$sbom_file"
  done
  sbom "$name" "$ref" "$archive"
  echo "$name $ref $archive"
}

# sbom NAME REF ARCHIVE: the image's CycloneDX SBOM (its Python distributions and
# Debian packages) beside its archive, as NAME-TAG.cdx.json. images/sbom.py reads the
# mounted file tree with this machine's Python; nothing runs inside the image.
sbom() {
  local name=$1 ref=$2 archive=$3 out="${3%.oci.tar}.cdx.json" ctr mnt
  [ -s "$out" ] && return 0
  ctr=$("${BUILDAH[@]}" from --pull-never "$ref" 2>/dev/null) \
    || ctr=$("${BUILDAH[@]}" from --pull-never "oci-archive:$archive") \
    || die "$name: cannot open $ref to write its SBOM"
  mnt=$("${BUILDAH[@]}" mount "$ctr") \
    || { "${BUILDAH[@]}" rm "$ctr" >/dev/null; die "$name: cannot mount $ref for its SBOM"; }
  if ! "$PY" "$REPO/images/sbom.py" "$mnt" "sdcguard-$name" "${ref##*:}" >"$out.tmp"; then
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
    rm -f "$out.tmp"
    die "$name: the SBOM of $ref failed (see above)"
  fi
  "${BUILDAH[@]}" rm "$ctr" >/dev/null
  mv "$out.tmp" "$out"
  say "$name: SBOM $out"
}

pause_image() {
  local bin; bin=$(bash "$REPO/tests/cluster/build-binaries.sh" | tr ':' '\n' | tail -1)/pause
  [ -x "$bin" ] || die "the pause binary was not built ($bin)"
  local tag; tag=$(sha <"$bin")
  local ref="localhost/sdcguard-pause:$tag" archive="$OUT/pause-$tag.oci.tar"
  if [ ! -s "$archive" ]; then
    local ctr; ctr=$("${BUILDAH[@]}" from --pull-never scratch)
    "${BUILDAH[@]}" copy "$ctr" "$bin" /pause >/dev/null
    "${BUILDAH[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$ref" >/dev/null
    "${BUILDAH[@]}" push --quiet "$ref" "oci-archive:$archive.tmp:$ref" >&2
    mv "$archive.tmp" "$archive"
    "${BUILDAH[@]}" rmi "$ref" >/dev/null
    say "pause: $ref"
  fi
  echo "pause $ref $archive"
}

# The closure of the third-party requirements of the two distributions the image
# installs (sdcguard and sdcprobe without extras), at this venv's versions.
pin_operator() {
  "$PY" - "$REPO/pyproject.toml" "$REPO/jobs/sdcprobe/pyproject.toml" <<'PY'
import importlib.metadata as md, re, sys, tomllib
from packaging.requirements import Requirement
own = {"sdcguard", "sdcprobe", "sdctrain"}
deps = [d for f in sys.argv[1:] for d in tomllib.load(open(f, "rb"))["project"]["dependencies"]]
seen, stack = {}, [Requirement(d).name for d in deps if Requirement(d).name not in own]
while stack:
    n = stack.pop()
    key = re.sub(r"[-_.]+", "-", n).lower()
    if key in seen:
        continue
    dist = md.distribution(n)
    seen[key] = f"{dist.metadata['Name']}=={dist.version}"
    for r in dist.requires or []:
        req = Requirement(r)
        if not req.marker or req.marker.evaluate({"extra": ""}):
            stack.append(req.name)
print("\n".join(seen[k] for k in sorted(seen)))
PY
}

# --lock: write each image's hash-locked requirements (images/lock.py): the operator's
# closure at the versions the test venv runs, the probe's and the TPU image's from
# their .in files.
if [ "${1:-}" = --lock ]; then
  constraints=$(mktemp)
  pin_operator >"$constraints"
  "$PY" "$REPO/images/lock.py" write operator --wheels "$WHEELS" --constraints "$constraints" \
    || { rm -f "$constraints"; die "locking the operator image's requirements failed"; }
  rm -f "$constraints"
  "$PY" "$REPO/images/lock.py" write probe --wheels "$WHEELS" \
    || die "locking the probe image's requirements failed"
  "$PY" "$REPO/images/lock.py" write xla --wheels "$WHEELS" \
    || die "locking the TPU image's requirements failed"
  # The Neuron lock needs AWS's Neuron repository: jobs/images/neuron-requirements.in.
  exit 0
fi

# locked_wheels IMAGE: refuse a stale lock, then download its wheels, every hash checked.
locked_wheels() {
  local lock=$1
  "$PY" "$REPO/images/lock.py" check "$2" \
    || die "the $2 image's lock is stale (see above): run bash images/build.sh --lock"
  local key; key=$(sha <"$REPO/$lock")
  [ -e "$WHEELS/.complete-lock-$key" ] && return 0
  say "wheelhouse: pip download -r $lock --require-hashes (once per lock; torch is about 4 GB)"
  "$PY" -m pip download --quiet --progress-bar off --only-binary=:all: --require-hashes \
    --no-deps -d "$WHEELS" -r "$REPO/$lock" \
    || die "pip download of $lock failed (see above): a hash mismatch, or the index is unreachable"
  touch "$WHEELS/.complete-lock-$key"
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(pause operator probe)
for name in "${want[@]}"; do
  case "$name" in
    pause) pause_image ;;
    operator)
      base_image
      locked_wheels images/operator/requirements.txt operator
      wheelhouse
      build operator images/operator/Dockerfile "" images/operator pyproject.toml README.md \
        operator/sdcguard jobs/sdcprobe ;;
    probe)
      base_image
      locked_wheels jobs/images/probe-requirements.txt probe
      build probe jobs/images/Dockerfile.probe "" jobs/sdcprobe jobs/images/probe-requirements.txt ;;
    xla)
      base_image
      locked_wheels jobs/images/xla-requirements.txt xla
      build xla jobs/images/Dockerfile.xla "" jobs/sdcprobe jobs/images/xla-requirements.txt ;;
    *) die "unknown image $name (operator, probe, xla, pause)" ;;
  esac
done
