#!/usr/bin/env bash
# Builds the Java example offline from Debian's packages: a JDK
# (default-jdk-headless), grpc-java (libgrpc-java, with its Netty
# transport), protobuf-java (libprotobuf-java) and grpc-java's protoc plugin
# (protobuf-compiler-grpc-java-plugin, which brings protobuf-compiler), with
# the jars grpc-java needs at run time that its package does not depend on
# (libnetty-java, libperfmark-java, libguava-java). No
# Maven or Gradle: javac against /usr/share/java. The stubs are generated
# into a scratch folder from crates/quotad-proto/proto; none are checked in.
#   examples/java/build.sh [OUT_DIR]   # classes, default target/java-check,
#   and OUT_DIR.classpath: the jars to run them with
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/java-check}"
jars=/usr/share/java

packages="default-jdk-headless libgrpc-java libprotobuf-java protobuf-compiler-grpc-java-plugin libguava-java libnetty-java libperfmark-java"
missing_tools() {
  missing=""
  for tool in javac protoc grpc_java_plugin; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
  done
  for jar in grpc-api grpc-stub grpc-protobuf grpc-core grpc-netty protobuf guava netty-codec-http2 perfmark-api; do
    [ -f "$jars/$jar.jar" ] || missing="$missing $jar.jar"
  done
  echo "$missing"
}
missing="$(missing_tools)"
# scripts/test.sh (QUOTAD_TEST_INSTALL=1) installs what is missing, as it
# does redis-server; run alone, this says what to install.
if [ -n "$missing" ] && [ "${QUOTAD_TEST_INSTALL:-}" = 1 ]; then
  echo "the Java example needs:$missing; installing Debian's packages with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
  missing="$(missing_tools)"
fi
if [ -n "$missing" ]; then
  echo "the Java example needs:$missing; install Debian's packages (no network beyond the Debian mirror):" >&2
  echo "  sudo apt-get install --no-install-recommends $packages" >&2
  exit 1
fi

# What compiling and running the example needs, from Debian's jars.
classpath=""
for jar in grpc-api grpc-stub grpc-protobuf grpc-protobuf-lite grpc-core grpc-context grpc-netty \
  protobuf guava failureaccess geronimo-annotation-1.3-spec perfmark-api \
  netty-common netty-buffer netty-transport netty-resolver netty-codec netty-codec-http netty-codec-http2 netty-handler \
  opencensus-api error_prone_annotations; do
  [ -f "$jars/$jar.jar" ] && classpath="$classpath:$jars/$jar.jar"
done
classpath="${classpath#:}"
mkdir -p "$(dirname "$out")"
echo "$classpath" >"$out.classpath"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/gen" "$out"
protoc -I "$repo/crates/quotad-proto/proto" \
  --plugin=protoc-gen-grpc-java="$(command -v grpc_java_plugin)" \
  --java_out="$work/gen" --grpc-java_out="$work/gen" quotad/v1/quota.proto
javac -nowarn -d "$out" -cp "$classpath" "$here/QuotadCheck.java" $(find "$work/gen" -name '*.java')
echo "built $out"
