#!/usr/bin/env bash
# The Java client (java/, Maven): mvn -B -q verify (compiles with -Xlint:all -Werror and the public
# API's Javadoc checked, runs the unit tests on protocol/vectors and the tests against real
# servers) with dependencies from Maven Central only; then again against Valkey 9 unless
# DLOCK_JAVA_VALKEY=0 (all but dlock-spring-integration).
#   bash scripts/java.sh             all of it
#   bash scripts/java.sh download    only fetch the dependencies and plugins
#   bash scripts/java.sh driver      build the conformance driver (java/dlock-conformance) and print
#                                    the command line that runs it (docs/protocol.md, section 14)
# The tests start their own servers with the module: DLOCK_MODULE, else the newest of
# target/release and target/debug (build it first: cargo build -p dlock). redis-server and
# PostgreSQL are installed with apt-get if missing, Valkey into .deps/ (scripts/valkey.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then
  echo "java: Maven and a JDK 17 or later are needed (apt-get install maven openjdk-17-jdk-headless)" >&2
  exit 1
fi

mvn_quiet() {
  (cd java && mvn -B -q "$@")
}

find_module() {
  if [ -n "${DLOCK_MODULE:-}" ]; then
    echo "$DLOCK_MODULE"
    return
  fi
  local candidate newest=""
  for candidate in target/release/libdlock.so target/debug/libdlock.so; do
    if [ -f "$candidate" ] && { [ -z "$newest" ] || [ "$candidate" -nt "$newest" ]; }; then
      newest=$candidate
    fi
  done
  if [ -z "$newest" ]; then
    echo "java: no libdlock.so found; run 'cargo build -p dlock' or set DLOCK_MODULE" >&2
    exit 1
  fi
  echo "$repo/$newest"
}

need_servers() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  if [ -z "${DLOCK_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "java: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

case "${1:-test}" in
  download)
    # dlock-conformance depends on dlock-core, which a fresh machine's local repository does not
    # hold (the reactor builds it): its own dependencies come with the first build.
    mvn_quiet -pl dlock-core dependency:resolve dependency:resolve-plugins
    mvn_quiet -pl dlock-conformance dependency:resolve-plugins
    # dlock-shedlock likewise, but ShedLock (and SLF4J, its one dependency) is fetched by name, at
    # the version java/pom.xml pins.
    mvn_quiet -pl dlock-shedlock dependency:resolve-plugins
    shedlock=$(sed -n 's:.*<shedlock.version>\(.*\)</shedlock.version>.*:\1:p' java/pom.xml)
    mvn_quiet -N dependency:get -Dartifact="net.javacrumbs.shedlock:shedlock-core:$shedlock"
    # shedlock-spring (with Spring's context): the module's Spring example, a test dependency.
    mvn_quiet -N dependency:get -Dartifact="net.javacrumbs.shedlock:shedlock-spring:$shedlock"
    # dlock-spring-integration the same way: spring-integration-core (with Spring Framework and
    # Reactor, its dependencies) at the version java/pom.xml pins.
    mvn_quiet -pl dlock-spring-integration dependency:resolve-plugins
    spring_integration=$(sed -n 's:.*<spring-integration.version>\(.*\)</spring-integration.version>.*:\1:p' java/pom.xml)
    mvn_quiet -N dependency:get -Dartifact="org.springframework.integration:spring-integration-core:$spring_integration"
    ;;
  test)
    DLOCK_MODULE=$(find_module)
    export DLOCK_MODULE DLOCK_REPO="$repo"
    need_servers
    echo "java: module $DLOCK_MODULE; mvn verify against $(redis-server --version | cut -d' ' -f1-3)" >&2
    mvn_quiet verify
    if [ "${DLOCK_JAVA_VALKEY:-1}" != 0 ]; then
      DLOCK_SERVER=$(bash scripts/valkey.sh)
      echo "java: mvn verify against Valkey ($DLOCK_SERVER)" >&2
      # Not dlock-spring-integration: it sends nothing of its own, only the core's requests,
      # which the other modules' tests cover on Valkey.
      DLOCK_SERVER=$DLOCK_SERVER mvn_quiet verify -pl '!dlock-spring-integration'
    fi
    ;;
  driver)
    # The driver's jar (java -jar: its dependencies inside), then a class-data archive of what it
    # loads (a run whose connection is refused), which makes each start ~0.2 s shorter; a JVM that
    # cannot use the archive (another JDK) starts without it. C1 only and the serial collector:
    # a short-lived process. The JVM's own warnings go to stderr, never to the driver's stdout.
    mvn_quiet -pl dlock-conformance -am package -DskipTests >&2
    jar=$repo/java/dlock-conformance/target/dlock-conformance-driver.jar
    archive=$repo/java/dlock-conformance/target/dlock-conformance-driver.jsa
    flags=(-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:disable -Xlog:all=warning:stderr)
    rm -f "$archive"
    DLOCK_URL=redis://127.0.0.1:1 java "${flags[@]}" -XX:ArchiveClassesAtExit="$archive" -jar "$jar" \
      </dev/null >/dev/null 2>&1 || true
    if [ -f "$archive" ]; then
      flags+=(-XX:SharedArchiveFile="$archive")
    fi
    echo "java ${flags[*]} -jar $jar"
    ;;
  *)
    echo "usage: $0 [test|download|driver]" >&2
    exit 2
    ;;
esac
