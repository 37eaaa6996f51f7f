#!/usr/bin/env bash
# Local Apache Kafka, PostgreSQL and Redis servers for Onward's tests.
#
#   scripts/services.sh up   [kafka|postgres|redis ...]   start what is not running, wait, print env
#   scripts/services.sh env                               print `export NAME=value` lines
#   scripts/services.sh down [kafka|postgres|redis ...]   stop what this script started
#   scripts/services.sh status                            say what answers and what we started
#   scripts/services.sh jars                              fetch the Kafka jars if needed, print their folder
#
#   eval "$(scripts/services.sh up)"    # progress goes to stderr, exports to stdout
#
# Everything lives under <repo>/.cache (git-ignored):
#   .cache/kafka/<version>/libs          Kafka jars fetched from Maven Central by mvn
#   .cache/services/kafka-<version>/     server.properties, log config, data/, logs/, kafka.pid
#   .cache/services/postgres/            private PostgreSQL cluster (data/, run/ socket dir, log)
#   .cache/services/redis/               redis.pid, redis.log
#   .cache/services/tls/                 test CA (ca.pem) and the servers' certificate and key
#
# KAFKA_VERSION selects the broker: unset, "3" or "3.9" -> the pinned 3.9.x;
# "4" -> the pinned 4.x; an explicit "X.Y.Z" (3.x or 4.x) is used as given.
# Each major has its own ports and data dir, so a 3.x and a 4.x broker can run
# side by side: 3.x on 127.0.0.1:9092 (controller 19093), 4.x on 127.0.0.1:9192
# (controller 19193).
#
# Beside the plain listeners every server also has a secured one, for the
# tests of Onward against secured clusters (test-only secrets, fixed here):
#   Kafka      SASL_SSL on 127.0.0.1:9094 (3.x) / 127.0.0.1:9194 (4.x); PLAIN,
#              SCRAM-SHA-256 and SCRAM-SHA-512 for user onward
#   PostgreSQL ssl=on; role onward_tls may reach database onward over TLS only
#   Redis      tls-port 6380 (no client certificates)
# All server certificates are signed by one test CA made with openssl at first
# start; `env` prints it as ONWARD_TEST_TLS_CA with the secured URLs.
#
# Anything missing (kcat, redis-server, PostgreSQL, Java, Maven) is installed
# with apt-get, so this works on a fresh Debian/Ubuntu machine when run as root.
set -euo pipefail

# Newest releases on Maven Central when this was written; pinned so that runs
# are reproducible. Bump deliberately.
KAFKA3_PINNED=3.9.2
KAFKA4_PINNED=4.4.0
SLF4J_RELOAD4J_VERSION=1.7.36   # matches the slf4j-api 1.7.36 that Kafka 3.9 uses
RELOAD4J_VERSION=1.2.25
LOG4J2_VERSION=2.25.5           # the log4j2 version kafka-server 4.4.0 depends on
DEPENDENCY_PLUGIN_VERSION=3.8.1

PG_PORT=5432
REDIS_PORT=6379
DATABASE_URL="postgresql://onward:onward@127.0.0.1:${PG_PORT}/onward"
REDIS_URL="redis://127.0.0.1:${REDIS_PORT}/0"
REDIS_TLS_PORT=6380
# Test-only credentials of the secured listeners.
KAFKA_SASL_USERNAME=onward
KAFKA_SASL_PASSWORD=onward-sasl-test
PG_TLS_ROLE=onward_tls
PG_TLS_PASSWORD=onward-tls-test
TLS_KEYSTORE_PASSWORD=onward-test-keystore

KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-180}
PG_START_TIMEOUT=${PG_START_TIMEOUT:-90}
REDIS_START_TIMEOUT=${REDIS_START_TIMEOUT:-30}
STOP_TIMEOUT=60

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd -P)
CACHE_DIR="$REPO_ROOT/.cache"
STATE_DIR="$CACHE_DIR/services"

TLS_DIR="$STATE_DIR/tls"
TLS_CA="$TLS_DIR/ca.pem"
TLS_CERT="$TLS_DIR/server.pem"
TLS_KEY="$TLS_DIR/server.key"
TLS_P12="$TLS_DIR/server.p12"
# verify-full: the client checks the certificate's chain and its name (localhost).
DATABASE_TLS_URL="postgresql://$PG_TLS_ROLE:$PG_TLS_PASSWORD@localhost:$PG_PORT/onward?sslmode=verify-full&sslrootcert=$TLS_CA"
REDIS_TLS_URL="rediss://localhost:$REDIS_TLS_PORT/0"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

# Print the last lines of each given log file that exists (to stderr).
show_logs() {
    local f
    for f in "$@"; do
        [[ -f "$f" ]] || continue
        printf -- '----- last lines of %s -----\n' "$f" >&2
        tail -n 40 "$f" >&2 || true
    done
}

port_open() {  # port_open PORT: something accepts TCP connections on 127.0.0.1:PORT
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

pid_alive() {  # pid_alive PIDFILE [PATTERN]: the process exists and its command line matches
    local pidfile=$1 pattern=${2:-} pid
    [[ -s "$pidfile" ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    if [[ -n "$pattern" && -r "/proc/$pid/cmdline" ]]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$pattern" || return 1
    fi
    return 0
}

# stop_pid PIDFILE PATTERN NAME: TERM the process, wait for it, KILL if it hangs.
stop_pid() {
    local pidfile=$1 pattern=$2 name=$3 pid i
    if ! pid_alive "$pidfile" "$pattern"; then
        log "$name: not running (nothing started by this script)"
        rm -f "$pidfile"
        return 0
    fi
    pid=$(tr -dc '0-9' <"$pidfile")
    log "$name: stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name: still running after ${STOP_TIMEOUT}s, sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$pidfile"
    log "$name: stopped"
}

# ---------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------
APT_UPDATED=0
as_root() {
    if [[ $EUID -eq 0 ]]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else die "need root (or sudo) to run: $*"
    fi
}

apt_install() {
    (($# > 0)) || return 0
    command -v apt-get >/dev/null 2>&1 || die "missing packages ($*) and no apt-get to install them"
    local aptlog="$STATE_DIR/apt.log"
    mkdir -p "$STATE_DIR"
    if ((APT_UPDATED == 0)); then
        log "apt-get update"
        if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update >"$aptlog" 2>&1; then
            show_logs "$aptlog"
            die "apt-get update failed"
        fi
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >>"$aptlog" 2>&1; then
        show_logs "$aptlog"
        die "apt-get install $* failed"
    fi
}

pg_bindir() {  # directory holding initdb/pg_ctl/postgres, newest major first
    local d
    for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
        [[ -x "$d/initdb" && -x "$d/pg_ctl" ]] && { echo "$d"; return 0; }
    done
    if command -v pg_config >/dev/null 2>&1; then
        d=$(pg_config --bindir 2>/dev/null || true)
        [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]] && { echo "$d"; return 0; }
    fi
    return 1
}

# Install whatever the requested services need, with a single apt-get run.
ensure_packages() {
    local want_kafka=$1 want_pg=$2 want_redis=$3 missing=() had_pg=1
    if ((want_kafka)); then
        command -v kcat >/dev/null 2>&1 || missing+=(kcat)
        command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
        command -v mvn >/dev/null 2>&1 || missing+=(maven)
    fi
    if ((want_pg)); then
        pg_bindir >/dev/null || { missing+=(postgresql); had_pg=0; }
        command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
    fi
    if ((want_redis)); then
        command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
        command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
    fi
    ((${#missing[@]} == 0)) && return 0
    apt_install "${missing[@]}"
    if ((want_pg && !had_pg)); then
        # The postgresql package creates a default cluster ("main", port 5432)
        # and may start it if the machine lets package scripts start services.
        # We run our own private cluster on 5432 instead, so stop any default
        # cluster the install just started; its files are left alone.
        if command -v pg_lsclusters >/dev/null 2>&1; then
            local ver name port status
            while read -r ver name port status _; do
                [[ "$port" == "$PG_PORT" && "$status" == online* ]] || continue
                log "stopping the packaged PostgreSQL cluster $ver/$name that the install started on port $port"
                as_root pg_ctlcluster "$ver" "$name" stop || true
            done < <(pg_lsclusters --no-header 2>/dev/null || true)
        fi
    fi
    # Debian's redis-server install may likewise start the packaged service.
    if ((want_redis)) && [[ " ${missing[*]} " == *" redis-server "* ]] && [[ -x /etc/init.d/redis-server ]]; then
        if redis_ready && ! pid_alive "$STATE_DIR/redis/redis.pid" redis-server; then
            log "stopping the packaged redis-server the install started"
            as_root /etc/init.d/redis-server stop >&2 || true
        fi
    fi
}


# ---------------------------------------------------------------------------
# Test CA and server certificate (one for every server: they all run on this host)
# ---------------------------------------------------------------------------
tls_valid() {  # the CA and server certificate exist, are valid for another day, and match
    [[ -s "$TLS_CA" && -s "$TLS_CERT" && -s "$TLS_KEY" && -s "$TLS_P12" ]] || return 1
    openssl x509 -checkend 86400 -noout -in "$TLS_CA" >/dev/null 2>&1 || return 1
    openssl x509 -checkend 86400 -noout -in "$TLS_CERT" >/dev/null 2>&1 || return 1
    openssl verify -CAfile "$TLS_CA" "$TLS_CERT" >/dev/null 2>&1
}

tls_ensure() {
    tls_valid && return 0
    log "TLS: making a test CA and server certificate in ${TLS_DIR#"$REPO_ROOT"/}"
    mkdir -p "$TLS_DIR"
    chmod 755 "$TLS_DIR"
    local tmp="$TLS_DIR/new" tlslog="$TLS_DIR/openssl.log"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    cat >"$tmp/server.ext" <<'EOF'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
EOF
    if ! {
        openssl req -x509 -new -newkey rsa:2048 -nodes -sha256 -days 3650 \
            -subj "/CN=Onward test CA" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" &&
            openssl req -new -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" \
                -keyout "$tmp/server.key" -out "$tmp/server.csr" &&
            openssl x509 -req -sha256 -days 825 -in "$tmp/server.csr" -CA "$tmp/ca.pem" \
                -CAkey "$tmp/ca.key" -CAcreateserial -extfile "$tmp/server.ext" -out "$tmp/server.pem" &&
            openssl pkcs12 -export -in "$tmp/server.pem" -inkey "$tmp/server.key" -name server \
                -passout "pass:$TLS_KEYSTORE_PASSWORD" -out "$tmp/server.p12"
    } >"$tlslog" 2>&1; then
        show_logs "$tlslog"
        die "TLS: openssl could not make the test certificates"
    fi
    # PostgreSQL (run as the postgres user) gets its own copy of the key; see pg_tls.
    chmod 644 "$tmp"/*
    chmod 600 "$tmp/ca.key" "$tmp/server.key" "$tmp/server.p12"
    mv -f "$tmp/ca.key" "$tmp/ca.pem" "$tmp/server.key" "$tmp/server.pem" "$tmp/server.p12" "$TLS_DIR/"
    rm -rf "$tmp"
}

tls_fingerprint() {  # identifies the server certificate in the servers' configs
    openssl x509 -noout -fingerprint -sha256 -in "$TLS_CERT" | cut -d= -f2 | tr -d ':'
}

# tls_answers PORT: a TLS server on 127.0.0.1:PORT presents a certificate the test CA verifies
tls_answers() {
    port_open "$1" || return 1
    timeout 10 openssl s_client -connect "127.0.0.1:$1" -servername localhost -verify_return_error \
        -CAfile "$TLS_CA" -verify_ip 127.0.0.1 </dev/null >/dev/null 2>&1
}

# foreign_tls_check NAME WHERE CHECK...: a server this script did not start answers; say
# plainly when its secured listener does not verify with this checkout's test CA (servers
# started from another checkout made their own CA), since every secured test would then
# fail on certificate verification.
foreign_tls_check() {
    local name=$1 where=$2
    shift 2
    tls_ensure
    "$@" && return 0
    log "WARNING: $name: the secured listener on $where does not verify with this checkout's test CA ($TLS_CA); the secured tests will fail. If another checkout started these servers, stop them there ($0 down) and run up here, or export ONWARD_TEST_TLS_CA with that checkout's ca.pem"
}

# ---------------------------------------------------------------------------
# Kafka
# ---------------------------------------------------------------------------
kafka_select() {  # sets KV (version), KMAJOR, KPORT, KSASL_PORT, KCTRL_PORT, KDIR, KLIBS
    local req=${KAFKA_VERSION:-}
    case "$req" in
        "" | 3 | 3.9) KV=$KAFKA3_PINNED ;;
        4) KV=$KAFKA4_PINNED ;;
        3.[0-9]*.[0-9]* | 4.[0-9]*.[0-9]*) KV=$req ;;
        *) die "KAFKA_VERSION='$req' not understood: use 3, 4 or an explicit 3.x.y / 4.x.y" ;;
    esac
    [[ "$KV" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "KAFKA_VERSION='$req' not understood"
    KMAJOR=${KV%%.*}
    case "$KMAJOR" in
        3) KPORT=9092 KSASL_PORT=9094 KCTRL_PORT=19093 ;;
        4) KPORT=9192 KSASL_PORT=9194 KCTRL_PORT=19193 ;;
    esac
    KDIR="$STATE_DIR/kafka-$KV"
    KLIBS="$CACHE_DIR/kafka/$KV/libs"
}

kafka_bootstrap() { echo "127.0.0.1:$KPORT"; }
kafka_sasl_bootstrap() { echo "127.0.0.1:$KSASL_PORT"; }

kafka_ready() {  # the broker answers a metadata request
    port_open "$KPORT" || return 1
    timeout 15 kcat -b "$(kafka_bootstrap)" -L -m 5 >/dev/null 2>&1
}

# Fetch the broker's jars (plus a logging backend and kafka-tools) with Maven.
kafka_fetch() {
    local home="$CACHE_DIR/kafka/$KV" logging
    [[ -f "$home/.complete" && -d "$KLIBS" ]] && return 0
    mkdir -p "$home"
    if ((KMAJOR == 3)); then
        logging="
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>$SLF4J_RELOAD4J_VERSION</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId><version>$RELOAD4J_VERSION</version></dependency>"
    else
        # Kafka 4.x logs through slf4j-api 1.7.x, so the slf4j 1.x binding of log4j2.
        logging="
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J2_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J2_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J2_VERSION</version></dependency>"
    fi
    cat >"$home/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by scripts/services.sh: only used to fetch the Kafka $KV broker jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.onward</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>$KV</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KV</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KV</version></dependency>$logging
  </dependencies>
  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-dependency-plugin</artifactId>
          <version>$DEPENDENCY_PLUGIN_VERSION</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
</project>
EOF
    log "Kafka $KV: fetching jars with Maven into ${KLIBS#"$REPO_ROOT"/}"
    rm -rf "$KLIBS"
    if ! (cd "$home" && mvn -B -q -f pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$KLIBS") >"$home/mvn.log" 2>&1; then
        show_logs "$home/mvn.log"
        die "Kafka $KV: Maven could not fetch the jars (is $KV published on Maven Central?)"
    fi
    ls "$KLIBS"/kafka_2.13-"$KV".jar >/dev/null 2>&1 || die "Kafka $KV: kafka_2.13-$KV.jar missing after the fetch"
    touch "$home/.complete"
}

# The broker's server.properties, as this script wants it now. A running broker
# whose file differs (an older script, a new certificate) is restarted with it.
kafka_config() {
    cat <<EOF
# Written by scripts/services.sh on every start; edit the script, not this file.
# Server certificate (SHA-256): $(tls_fingerprint)
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KCTRL_PORT
listeners=PLAINTEXT://127.0.0.1:$KPORT,CONTROLLER://127.0.0.1:$KCTRL_PORT,SASL_SSL://127.0.0.1:$KSASL_PORT
# Each client listener advertises itself: a client that bootstraps on the
# SASL_SSL listener only ever sees SASL_SSL.
advertised.listeners=PLAINTEXT://127.0.0.1:$KPORT,SASL_SSL://127.0.0.1:$KSASL_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USERNAME="$KAFKA_SASL_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$TLS_P12
listener.name.sasl_ssl.ssl.keystore.password=$TLS_KEYSTORE_PASSWORD
listener.name.sasl_ssl.ssl.key.password=$TLS_KEYSTORE_PASSWORD
controller.listener.names=CONTROLLER
log.dirs=$KDIR/data
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
min.insync.replicas=1
delete.topic.enable=true
log.retention.hours=24
log.segment.bytes=16777216
# Segments a compaction cut lies wholly below are deleted within a minute, not five.
log.retention.check.interval.ms=30000
# Idle connections are kept an hour, not ten minutes: a Kafka client some test leaves open in
# the test process (not yet found) reconnects once the broker drops its idle connection, after
# its loop has closed, and the suite, now past ten minutes, failed at its end on that warning.
connections.max.idle.ms=3600000
EOF
}

kafka_config_current() {  # the broker's config file says what kafka_config says
    [[ -f "$KDIR/server.properties" ]] && [[ "$(cat "$KDIR/server.properties")" == "$(kafka_config)" ]]
}

kafka_write_config() {
    mkdir -p "$KDIR/data" "$KDIR/logs"
    kafka_config >"$KDIR/server.properties"
    if ((KMAJOR == 3)); then
        cat >"$KDIR/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=${kafka.logs.dir}/server.log
log4j.appender.file.MaxFileSize=10MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.apache.kafka.storage.internals.log=WARN
log4j.logger.kafka.log.UnifiedLog=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOF
    else
        cat >"$KDIR/log4j2.properties" <<'EOF'
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
logger.storage.name = org.apache.kafka.storage.internals.log
logger.storage.level = WARN
logger.unifiedlog.name = kafka.log.UnifiedLog
logger.unifiedlog.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
EOF
    fi
}

kafka_log_opt() {  # the JVM option that points the logging backend at our config
    if ((KMAJOR == 3)); then echo "-Dlog4j.configuration=file:$KDIR/log4j.properties"
    else echo "-Dlog4j2.configurationFile=$KDIR/log4j2.properties"; fi
}

kafka_java() {  # run a class from the broker's classpath with its log config
    java -Djava.awt.headless=true -Dkafka.logs.dir="$KDIR/logs" "$(kafka_log_opt)" -cp "$KLIBS/*" "$@"
}

kafka_format() {
    [[ -f "$KDIR/data/meta.properties" ]] && return 0
    local uuid
    # A cluster id is 16 random bytes in URL-safe base64 without padding. One that
    # starts with '-' would be read by StorageTool as an option: draw again.
    uuid=-
    while [[ "$uuid" == -* ]]; do
        uuid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    done
    log "Kafka $KV: formatting storage (cluster id $uuid)"
    rm -f "$KDIR/scram.done"
    # Static quorum (controller.quorum.voters): plain `format` works for 3.9
    # and 4.x alike; 4.x would want --standalone only for a dynamic quorum.
    # The SASL user's SCRAM credentials go into the new metadata log right away
    # (a data dir formatted before they existed gets them from kafka_scram_ensure).
    if ! kafka_java kafka.tools.StorageTool format -t "$uuid" -c "$KDIR/server.properties" \
        --add-scram "SCRAM-SHA-256=[name=$KAFKA_SASL_USERNAME,password=$KAFKA_SASL_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=$KAFKA_SASL_USERNAME,password=$KAFKA_SASL_PASSWORD]" \
        >"$KDIR/logs/format.log" 2>&1; then
        show_logs "$KDIR/logs/format.log"
        rm -f "$KDIR/data/meta.properties"
        die "Kafka $KV: formatting the storage failed"
    fi
}

# kafka_sasl_ok MECHANISM: the SASL_SSL listener verifies with the test CA and
# lets the test user in with MECHANISM.
kafka_sasl_ok() {
    port_open "$KSASL_PORT" || return 1
    timeout 15 kcat -b "$(kafka_sasl_bootstrap)" -L -m 5 -X security.protocol=SASL_SSL \
        -X "sasl.mechanisms=$1" -X "sasl.username=$KAFKA_SASL_USERNAME" \
        -X "sasl.password=$KAFKA_SASL_PASSWORD" -X "ssl.ca.location=$TLS_CA" >/dev/null 2>&1
}

# The SCRAM credentials of the test user. A data dir formatted with --add-scram
# has them; one formatted before this script added them (the same data kept
# across script versions) gets them here through Kafka's ConfigCommand over the
# plain listener: it describes the user and sets (again, idempotently) what is
# missing, one mechanism per request as the broker requires. The check is not a
# SCRAM login with kcat because librdkafka before 2.6.1 fails SCRAM against
# Kafka 4.x brokers. scram.done (removed by a new format) skips the JVM runs.
kafka_scram_ensure() {
    local done_file="$KDIR/scram.done" cls=kafka.admin.ConfigCommand described mech
    [[ -f "$done_file" && "$done_file" -nt "$KDIR/data/meta.properties" ]] && return 0
    unzip -l "$KLIBS/kafka_2.13-$KV.jar" kafka/admin/ConfigCommand.class >/dev/null 2>&1 \
        || cls=org.apache.kafka.tools.ConfigCommand
    described=$(kafka_java "$cls" --bootstrap-server "$(kafka_bootstrap)" --describe \
        --entity-type users --entity-name "$KAFKA_SASL_USERNAME" 2>&1) || {
        printf '%s\n' "$described" | tail -n 20 >&2
        die "Kafka $KV: describing user $KAFKA_SASL_USERNAME failed"
    }
    for mech in SCRAM-SHA-256 SCRAM-SHA-512; do
        [[ "$described" == *"$mech="* ]] && continue
        log "Kafka $KV: creating the $mech credentials of user $KAFKA_SASL_USERNAME"
        if ! kafka_java "$cls" --bootstrap-server "$(kafka_bootstrap)" --alter \
            --entity-type users --entity-name "$KAFKA_SASL_USERNAME" \
            --add-config "$mech=[password=$KAFKA_SASL_PASSWORD]" >"$KDIR/logs/scram.log" 2>&1; then
            show_logs "$KDIR/logs/scram.log"
            die "Kafka $KV: creating the $mech credentials failed"
        fi
    done
    touch "$done_file"
}

# The SASL_SSL listener answers for every mechanism (waits out a fresh start).
kafka_secure_up() {
    kafka_scram_ensure
    local mech deadline=$((SECONDS + 60))
    local mechs=(PLAIN SCRAM-SHA-256 SCRAM-SHA-512)
    # kcat's librdkafka (before 2.6.1) cannot log in with SCRAM to a 4.x broker.
    ((KMAJOR >= 4)) && mechs=(PLAIN)
    for mech in "${mechs[@]}"; do
        until kafka_sasl_ok "$mech"; do
            ((SECONDS < deadline)) || die "Kafka $KV: SASL_SSL listener $(kafka_sasl_bootstrap) refuses $mech for user $KAFKA_SASL_USERNAME"
            sleep 1
        done
    done
    log "Kafka $KV: SASL_SSL listener answering on $(kafka_sasl_bootstrap)"
}

kafka_up() {
    kafka_select
    tls_ensure
    local pidfile="$KDIR/kafka.pid" other
    # Another version of the same major, started here, holds these ports.
    for other in "$STATE_DIR"/kafka-"$KMAJOR".*/kafka.pid; do
        if [[ "$other" == "$pidfile" ]] || ! pid_alive "$other" kafka.Kafka; then
            continue
        fi
        other=${other%/kafka.pid}
        other=${other##*/kafka-}
        die "Kafka $other is running on port $KPORT; stop it first: KAFKA_VERSION=$other $0 down kafka"
    done
    if kafka_ready; then
        if ! pid_alive "$pidfile" kafka.Kafka; then
            log "Kafka $KV: answering on $(kafka_bootstrap), but not started by this script: its secured listener is not managed here"
            foreign_tls_check "Kafka $KV" "127.0.0.1:$KSASL_PORT" tls_answers "$KSASL_PORT"
            return 0
        fi
        if kafka_config_current; then
            log "Kafka $KV: answering on $(kafka_bootstrap)"
            kafka_secure_up
            return 0
        fi
        log "Kafka $KV: the running broker's config is not the current one (e.g. no SASL_SSL listener): restarting it"
        stop_pid "$pidfile" kafka.Kafka "Kafka $KV"
    fi
    if ! pid_alive "$pidfile" kafka.Kafka; then
        rm -f "$pidfile"
        if port_open "$KPORT" || port_open "$KCTRL_PORT"; then
            die "Kafka $KV: port $KPORT or $KCTRL_PORT is taken by a process this script did not start"
        fi
        command -v java >/dev/null 2>&1 || die "java not found"
        kafka_fetch
        kafka_write_config
        kafka_format
        log "Kafka $KV: starting broker on $(kafka_bootstrap) (controller 127.0.0.1:$KCTRL_PORT)"
        : >"$KDIR/logs/stdout.log"
        # setsid: own session, so the broker outlives this script and its terminal.
        # The inner shell records its pid and then becomes the JVM (exec).
        # shellcheck disable=SC2016  # $$ and $1 are the inner shell's, not expanded here
        setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$pidfile" \
            java -Xms256m -Xmx512m -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
            -Dkafka.logs.dir="$KDIR/logs" "$(kafka_log_opt)" \
            -cp "$KLIBS/*" kafka.Kafka "$KDIR/server.properties" \
            </dev/null >>"$KDIR/logs/stdout.log" 2>&1 &
        local i
        for ((i = 0; i < 50; i++)); do
            [[ -s "$pidfile" ]] && break
            sleep 0.1
        done
    else
        log "Kafka $KV: started earlier (pid $(cat "$pidfile")), waiting for it to answer"
    fi
    local deadline=$((SECONDS + KAFKA_START_TIMEOUT))
    until kafka_ready; do
        if ! pid_alive "$pidfile" kafka.Kafka; then
            show_logs "$KDIR/logs/stdout.log" "$KDIR/logs/server.log"
            die "Kafka $KV: the broker exited during startup"
        fi
        if ((SECONDS >= deadline)); then
            show_logs "$KDIR/logs/stdout.log" "$KDIR/logs/server.log"
            die "Kafka $KV: no answer on $(kafka_bootstrap) after ${KAFKA_START_TIMEOUT}s (broker left running, pid $(cat "$pidfile"))"
        fi
        sleep 0.5
    done
    log "Kafka $KV: answering on $(kafka_bootstrap)"
    kafka_secure_up
}

kafka_down() {
    kafka_select
    stop_pid "$KDIR/kafka.pid" kafka.Kafka "Kafka $KV"
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------
# PG_OS_USER: the server refuses to run as root, so as root we run it as the
# `postgres` OS user (created by the postgresql package).
pg_select() {  # sets PG_ROOT, PG_DATA, PG_SOCK, PG_LOG, PG_OS_USER
    if [[ $EUID -eq 0 ]]; then PG_OS_USER=postgres; else PG_OS_USER=$(id -un); fi
    local home="$STATE_DIR/postgres" alt
    alt="/tmp/onward-pg-$(printf '%s' "$REPO_ROOT" | cksum | cut -d' ' -f1)"
    if [[ -d "$home/data" ]]; then
        PG_ROOT=$home
    elif [[ -s "$STATE_DIR/postgres.location" ]]; then
        PG_ROOT=$(cat "$STATE_DIR/postgres.location")
    else
        # Keep the cluster inside .cache unless the postgres user cannot reach
        # it (e.g. the repo is under a private home directory) or the socket
        # path would be longer than the ~107 bytes a unix socket path allows;
        # then fall back to a per-repo folder under /tmp.
        PG_ROOT=$home
        mkdir -p "$STATE_DIR"
        chmod a+x "$CACHE_DIR" "$STATE_DIR" 2>/dev/null || true
        if ((${#home} + 30 > 100)) || ! pg_as_user test -x "$STATE_DIR" 2>/dev/null; then
            PG_ROOT=$alt
        fi
        if [[ "$PG_ROOT" != "$home" ]]; then
            log "PostgreSQL: using $PG_ROOT (the repo path is not usable by the $PG_OS_USER user)"
            printf '%s\n' "$PG_ROOT" >"$STATE_DIR/postgres.location"
        fi
    fi
    PG_DATA="$PG_ROOT/data"
    PG_SOCK="$PG_ROOT/run"
    PG_LOG="$PG_ROOT/postgres.log"
}

pg_as_user() {
    # cd /: the postgres user may not be allowed into the caller's directory.
    if [[ $EUID -eq 0 && "$PG_OS_USER" != root ]]; then (cd / && runuser -u "$PG_OS_USER" -- "$@")
    else "$@"; fi
}

pg_url_ok() {  # the onward role can log in to the onward database over TCP
    PGCONNECT_TIMEOUT=3 psql "$DATABASE_URL" -X -A -t -q -c 'select 1' >/dev/null 2>&1
}

pg_ours_running() {
    [[ -f "$PG_DATA/postmaster.pid" ]] || return 1
    local bin
    bin=$(pg_bindir) || return 1
    pg_as_user "$bin/pg_ctl" status -D "$PG_DATA" >/dev/null 2>&1
}

pg_bootstrap_roles() {  # create role and database onward (idempotent), via the private socket
    psql -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres >/dev/null <<'EOF'
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'onward') THEN
    CREATE ROLE onward LOGIN CREATEDB PASSWORD 'onward';
  ELSE
    ALTER ROLE onward LOGIN CREATEDB PASSWORD 'onward';
  END IF;
END
$$;
SELECT 'CREATE DATABASE onward OWNER onward'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'onward')
\gexec
EOF
}

pg_tls_url_ok() {  # the TLS-only role logs in over TLS, verifying the server with the test CA
    PGCONNECT_TIMEOUT=3 psql "$DATABASE_TLS_URL" -X -A -t -q -c 'select 1' >/dev/null 2>&1
}

pg_sql() {  # run SQL from stdin as the superuser over the private socket; print the rows
    psql -X -q -A -t -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres "$@"
}

# ssl=on with the test certificate, and role onward_tls that may reach database
# onward over TLS only. A running server is reloaded, not restarted (ssl and
# pg_hba.conf are both reloadable), and only when something changed.
PG_HBA_MARK="# onward_tls: TLS only (scripts/services.sh)"
pg_tls() {
    tls_ensure
    local changed=0 f
    for f in crt key; do
        local src=$TLS_CERT
        [[ $f == key ]] && src=$TLS_KEY
        cmp -s "$src" "$PG_DATA/server.$f" && continue
        # The server wants its key private and its own (it runs as $PG_OS_USER).
        install -m 600 "$src" "$PG_DATA/server.$f"
        [[ $EUID -eq 0 ]] && chown "$PG_OS_USER": "$PG_DATA/server.$f"
        changed=1
    done
    if ! grep -qxF "$PG_HBA_MARK" "$PG_DATA/pg_hba.conf"; then
        # First match wins, so these go before initdb's "host all all" lines. Written in place
        # (not replaced) so the file keeps its owner.
        local hba
        hba=$(cat "$PG_DATA/pg_hba.conf")
        cat >"$PG_DATA/pg_hba.conf" <<EOF
$PG_HBA_MARK
hostssl   onward  $PG_TLS_ROLE  127.0.0.1/32  scram-sha-256
hostssl   onward  $PG_TLS_ROLE  ::1/128       scram-sha-256
hostnossl all     $PG_TLS_ROLE  all           reject
host      all     $PG_TLS_ROLE  all           reject

$hba
EOF
        changed=1
    fi
    [[ "$(pg_sql -c 'SHOW ssl')" == on ]] || { pg_sql -c 'ALTER SYSTEM SET ssl = on' >/dev/null; changed=1; }
    pg_sql >/dev/null <<EOF
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_TLS_ROLE') THEN
    CREATE ROLE $PG_TLS_ROLE LOGIN PASSWORD '$PG_TLS_PASSWORD';
  END IF;
END
\$\$;
GRANT CREATE ON DATABASE onward TO $PG_TLS_ROLE;
EOF
    if ((changed)); then
        log "PostgreSQL: reloading with ssl=on and the TLS-only role $PG_TLS_ROLE"
        pg_sql -c 'SELECT pg_reload_conf()' >/dev/null
        local deadline=$((SECONDS + 15))
        until pg_tls_url_ok; do
            ((SECONDS < deadline)) || { show_logs "$PG_LOG"; die "PostgreSQL: $DATABASE_TLS_URL does not answer after the reload"; }
            sleep 0.3
        done
    fi
    pg_tls_url_ok || { show_logs "$PG_LOG"; die "PostgreSQL: $DATABASE_TLS_URL does not answer"; }
    log "PostgreSQL: TLS answering on 127.0.0.1:$PG_PORT for role $PG_TLS_ROLE"
}

pg_up() {
    if pg_url_ok; then
        log "PostgreSQL: answering on 127.0.0.1:$PG_PORT"
        pg_select
        if pg_ours_running; then
            pg_tls
        else
            log "PostgreSQL: not started by this script: its TLS setup is not managed here"
            foreign_tls_check PostgreSQL "localhost:$PG_PORT" pg_tls_url_ok
        fi
        return 0
    fi
    pg_select
    local bin
    bin=$(pg_bindir) || die "PostgreSQL server binaries not found"
    if ! pg_ours_running; then
        port_open "$PG_PORT" && die "PostgreSQL: port $PG_PORT is taken by a server this script did not start and that does not accept $DATABASE_URL"
        mkdir -p "$PG_ROOT"
        if [[ $EUID -eq 0 ]]; then
            id -u "$PG_OS_USER" >/dev/null 2>&1 || die "PostgreSQL: OS user $PG_OS_USER missing (it comes with the postgresql package)"
            chown "$PG_OS_USER": "$PG_ROOT"
        fi
        chmod 700 "$PG_ROOT"
        if [[ ! -s "$PG_DATA/PG_VERSION" ]]; then
            log "PostgreSQL: initdb in $PG_DATA"
            rm -rf "$PG_DATA"
            # trust over the private unix socket (admin only); the TCP listener
            # on 127.0.0.1 checks passwords (onward/onward).
            if ! pg_as_user "$bin/initdb" -D "$PG_DATA" -U postgres -E UTF8 --no-locale \
                --auth-local=trust --auth-host=scram-sha-256 >"$PG_ROOT/initdb.log" 2>&1; then
                show_logs "$PG_ROOT/initdb.log"
                die "PostgreSQL: initdb failed"
            fi
            cat >>"$PG_DATA/postgresql.conf" <<'EOF'

# --- settings for Onward's tests (scripts/services.sh) ---
# fsync stays on: the tests check durability.
fsync = on
synchronous_commit = on
max_connections = 200
shared_buffers = 256MB
logging_collector = off
log_min_messages = warning
log_min_error_statement = error
EOF
        fi
        pg_as_user mkdir -p "$PG_SOCK"
        log "PostgreSQL: starting on 127.0.0.1:$PG_PORT"
        # Address, port and socket dir are passed at start so the cluster does
        # not depend on where the repo was when it was created.
        # pg_ctl -w polls until the server accepts connections (or exits, or
        # the timeout passes).
        if ! pg_as_user "$bin/pg_ctl" start -w -t "$PG_START_TIMEOUT" -D "$PG_DATA" -l "$PG_LOG" \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories='$PG_SOCK'" \
            >"$PG_ROOT/pg_ctl.log" 2>&1; then
            show_logs "$PG_ROOT/pg_ctl.log" "$PG_LOG"
            die "PostgreSQL: did not start within ${PG_START_TIMEOUT}s"
        fi
    else
        log "PostgreSQL: started earlier, waiting for it to answer"
    fi
    local deadline=$((SECONDS + PG_START_TIMEOUT))
    until "$bin/pg_isready" -q -h "$PG_SOCK" -p "$PG_PORT" 2>/dev/null; do
        if ((SECONDS >= deadline)) || ! pg_ours_running; then
            show_logs "$PG_LOG"
            die "PostgreSQL: did not become ready within ${PG_START_TIMEOUT}s"
        fi
        sleep 0.3
    done
    pg_bootstrap_roles || { show_logs "$PG_LOG"; die "PostgreSQL: creating role/database onward failed"; }
    pg_url_ok || { show_logs "$PG_LOG"; die "PostgreSQL: $DATABASE_URL does not answer"; }
    log "PostgreSQL: answering on 127.0.0.1:$PG_PORT"
    pg_tls
}

pg_down() {
    pg_select
    local bin
    if ! bin=$(pg_bindir) || ! pg_ours_running; then
        log "PostgreSQL: not running (nothing started by this script)"
        return 0
    fi
    log "PostgreSQL: stopping"
    pg_as_user "$bin/pg_ctl" stop -D "$PG_DATA" -m fast -w -t "$STOP_TIMEOUT" >&2 \
        || die "PostgreSQL: pg_ctl stop failed"
    log "PostgreSQL: stopped"
}

# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------
REDIS_DIR="$STATE_DIR/redis"

redis_ready() {
    command -v redis-cli >/dev/null 2>&1 || return 1
    [[ "$(timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]
}

# tls-port 6380 beside the plain port, set on the running server (Redis 7 takes
# tls-port and the certificate files at run time, so no restart and no data lost).
redis_tls() {
    tls_ensure
    tls_answers "$REDIS_TLS_PORT" && return 0
    log "Redis: adding tls-port $REDIS_TLS_PORT"
    local reply
    reply=$(timeout 10 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" CONFIG SET \
        tls-cert-file "$TLS_CERT" tls-key-file "$TLS_KEY" tls-ca-cert-file "$TLS_CA" \
        tls-auth-clients no tls-port "$REDIS_TLS_PORT" 2>&1) || true
    [[ "$reply" == OK ]] || die "Redis: could not enable TLS (is redis-server built with TLS?): $reply"
    local deadline=$((SECONDS + REDIS_START_TIMEOUT))
    until tls_answers "$REDIS_TLS_PORT"; do
        ((SECONDS < deadline)) || die "Redis: no TLS answer on 127.0.0.1:$REDIS_TLS_PORT"
        sleep 0.2
    done
    log "Redis: TLS answering on 127.0.0.1:$REDIS_TLS_PORT"
}

redis_up() {
    if redis_ready; then
        log "Redis: answering on 127.0.0.1:$REDIS_PORT"
        if pid_alive "$REDIS_DIR/redis.pid" redis-server; then
            redis_tls
        else
            log "Redis: not started by this script: its TLS port is not managed here"
            foreign_tls_check Redis "127.0.0.1:$REDIS_TLS_PORT" tls_answers "$REDIS_TLS_PORT"
        fi
        return 0
    fi
    local pidfile="$REDIS_DIR/redis.pid"
    if ! pid_alive "$pidfile" redis-server; then
        rm -f "$pidfile"
        port_open "$REDIS_PORT" && die "Redis: port $REDIS_PORT is taken by a process this script did not start"
        mkdir -p "$REDIS_DIR"
        log "Redis: starting on 127.0.0.1:$REDIS_PORT"
        : >"$REDIS_DIR/redis.log"
        # No persistence: the tests treat Redis as a cache. Errors before it daemonizes go to
        # stdout, appended to the log it then writes itself, so show_logs shows both.
        # shellcheck disable=SC2094  # nothing reads the log while the server starts
        if ! redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
            --pidfile "$pidfile" --logfile "$REDIS_DIR/redis.log" --dir "$REDIS_DIR" \
            --save '' --appendonly no --loglevel notice >>"$REDIS_DIR/redis.log" 2>&1; then
            show_logs "$REDIS_DIR/redis.log"
            die "Redis: redis-server failed to start"
        fi
    fi
    local deadline=$((SECONDS + REDIS_START_TIMEOUT))
    until redis_ready; do
        if ((SECONDS >= deadline)); then
            show_logs "$REDIS_DIR/redis.log"
            die "Redis: no PONG on 127.0.0.1:$REDIS_PORT after ${REDIS_START_TIMEOUT}s"
        fi
        sleep 0.2
    done
    log "Redis: answering on 127.0.0.1:$REDIS_PORT"
    redis_tls
}

redis_down() {
    stop_pid "$REDIS_DIR/redis.pid" redis-server "Redis"
}

# ---------------------------------------------------------------------------
cmd_env() {
    kafka_select
    printf 'export KAFKA_BOOTSTRAP_SERVERS=%s\n' "$(kafka_bootstrap)"
    printf 'export KAFKA_VERSION=%s\n' "$KV"
    printf 'export DATABASE_URL=%s\n' "$DATABASE_URL"
    printf 'export REDIS_URL=%s\n' "$REDIS_URL"
    printf 'export ONWARD_TEST_TLS_CA=%s\n' "$TLS_CA"
    printf 'export KAFKA_SASL_SSL_BOOTSTRAP_SERVERS=%s\n' "$(kafka_sasl_bootstrap)"
    printf 'export ONWARD_TEST_KAFKA_SASL_USERNAME=%s\n' "$KAFKA_SASL_USERNAME"
    printf 'export ONWARD_TEST_KAFKA_SASL_PASSWORD=%s\n' "$KAFKA_SASL_PASSWORD"
    # Quoted: the URL's '&' would end the command in a shell.
    printf "export DATABASE_TLS_URL='%s'\n" "$DATABASE_TLS_URL"
    printf 'export REDIS_TLS_URL=%s\n' "$REDIS_TLS_URL"
}

# parse_services ARGS...: sets DO_KAFKA, DO_PG, DO_REDIS (default: all three)
parse_services() {
    DO_KAFKA=0 DO_PG=0 DO_REDIS=0
    (($# == 0)) && { DO_KAFKA=1 DO_PG=1 DO_REDIS=1; return 0; }
    local s
    for s in "$@"; do
        case "$s" in
            kafka) DO_KAFKA=1 ;;
            postgres | postgresql | pg) DO_PG=1 ;;
            redis) DO_REDIS=1 ;;
            *) die "unknown service '$s' (use kafka, postgres, redis)" ;;
        esac
    done
}

cmd_up() {
    parse_services "$@"
    kafka_select  # validate KAFKA_VERSION before doing any work
    mkdir -p "$STATE_DIR"
    ensure_packages "$DO_KAFKA" "$DO_PG" "$DO_REDIS"
    ((DO_REDIS)) && redis_up
    ((DO_PG)) && pg_up
    ((DO_KAFKA)) && kafka_up
    cmd_env
}

cmd_jars() {  # fetch the selected Kafka's jars (if not cached) and print their folder
    kafka_select
    ensure_packages 1 0 0
    command -v java >/dev/null 2>&1 || die "java not found"
    kafka_fetch
    printf '%s\n' "$KLIBS"
}

cmd_down() {  # the secured listeners belong to the same servers and stop with them
    parse_services "$@"
    ((DO_KAFKA)) && kafka_down
    ((DO_PG)) && pg_down
    ((DO_REDIS)) && redis_down
    return 0
}

cmd_status() {
    kafka_select
    local s
    if command -v kcat >/dev/null 2>&1 && kafka_ready; then s=up; else s=down; fi
    pid_alive "$KDIR/kafka.pid" kafka.Kafka && s="$s (started here, pid $(cat "$KDIR/kafka.pid"))"
    echo "kafka $KV $(kafka_bootstrap): $s"
    if [[ -s "$TLS_CA" ]] && command -v kcat >/dev/null 2>&1 && kafka_sasl_ok PLAIN; then s=up; else s=down; fi
    echo "kafka $KV SASL_SSL $(kafka_sasl_bootstrap): $s"
    if command -v psql >/dev/null 2>&1 && pg_url_ok; then s=up; else s=down; fi
    pg_select
    pg_ours_running && s="$s (started here, data in $PG_DATA)"
    echo "postgres 127.0.0.1:$PG_PORT: $s"
    if [[ -s "$TLS_CA" ]] && command -v psql >/dev/null 2>&1 && pg_tls_url_ok; then s=up; else s=down; fi
    echo "postgres TLS (role $PG_TLS_ROLE) localhost:$PG_PORT: $s"
    if redis_ready; then s=up; else s=down; fi
    pid_alive "$REDIS_DIR/redis.pid" redis-server && s="$s (started here, pid $(cat "$REDIS_DIR/redis.pid"))"
    echo "redis 127.0.0.1:$REDIS_PORT: $s"
    if [[ -s "$TLS_CA" ]] && tls_answers "$REDIS_TLS_PORT"; then s=up; else s=down; fi
    echo "redis TLS 127.0.0.1:$REDIS_TLS_PORT: $s"
    if tls_valid; then s="valid until $(openssl x509 -noout -enddate -in "$TLS_CERT" | cut -d= -f2)"; else s="missing or expiring (made again at the next up)"; fi
    echo "test CA $TLS_CA: $s"
}

main() {
    local cmd=${1:-}
    (($# > 0)) && shift
    case "$cmd" in
        up) cmd_up "$@" ;;
        env) cmd_env ;;
        jars) cmd_jars ;;
        down) cmd_down "$@" ;;
        status) cmd_status ;;
        *)
            echo "usage: $0 up|env|down [kafka|postgres|redis ...] | jars | status" >&2
            exit 2
            ;;
    esac
}

main "$@"
