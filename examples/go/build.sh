#!/usr/bin/env bash
# Builds the Go example offline from Debian's packages: go (golang-go),
# grpc-go (golang-google-grpc-dev), the protobuf runtime
# (golang-google-protobuf-dev), protoc-gen-go and protoc-gen-go-grpc (which
# brings protobuf-compiler). The stubs are generated into a scratch GOPATH
# from crates/quotad-proto/proto; nothing generated is checked in.
#   examples/go/build.sh [OUT]   # the binary, default target/go-check
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/go-check}"

packages="golang-go golang-google-grpc-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc"
missing_tools() {
  missing=""
  for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
  done
  [ -d /usr/share/gocode/src/google.golang.org/grpc ] || missing="$missing grpc-go(/usr/share/gocode)"
  [ -d /usr/share/gocode/src/google.golang.org/protobuf ] || missing="$missing protobuf-go(/usr/share/gocode)"
  echo "$missing"
}
missing="$(missing_tools)"
# scripts/test.sh (QUOTAD_TEST_INSTALL=1) installs what is missing, as it
# does redis-server; run alone, this says what to install.
if [ -n "$missing" ] && [ "${QUOTAD_TEST_INSTALL:-}" = 1 ]; then
  echo "the Go example needs:$missing; installing Debian's packages with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
  missing="$(missing_tools)"
fi
if [ -n "$missing" ]; then
  echo "the Go example needs:$missing; install Debian's packages (no network beyond the Debian mirror):" >&2
  echo "  sudo apt-get install --no-install-recommends $packages" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
module=quotad.example/check
src="$work/gopath/src/$module"
mkdir -p "$src/internal"
cp "$here/main.go" "$src/"
map="Mquotad/v1/quota.proto=$module/internal/quotad/v1;quotadv1"
protoc -I "$repo/crates/quotad-proto/proto" \
  --go_out="$src/internal" --go_opt="paths=source_relative,$map" \
  --go-grpc_out="$src/internal" --go-grpc_opt="paths=source_relative,$map" \
  quotad/v1/quota.proto
# GOPATH mode over Debian's Go sources: no module proxy, no network.
export GO111MODULE=off GOPATH="$work/gopath:/usr/share/gocode" GOFLAGS=
export GOCACHE="${GOCACHE:-$repo/target/go-cache}"
(cd "$src" && go vet . && go build -o "$out" .)
echo "built $out"
