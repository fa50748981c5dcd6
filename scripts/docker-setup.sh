#!/bin/sh
# docker-setup.sh: a Docker engine and the test images for the Docker provider's specs, offline.
#
#   scripts/docker-setup.sh          install what is missing, start dockerd if none answers, build the images
#   scripts/docker-setup.sh stop     stop the dockerd this script started (and only that one)
#   scripts/docker-setup.sh status   say what is there
#
# Idempotent and quick when everything is there (two `docker info` and three `docker image inspect`).
# Needs root to install packages and to start the daemon.
#
# What it does, in order:
#  1. installs Debian's docker.io (dockerd, containerd, runc and a docker CLI) and busybox-static with apt-get
#     when dockerd or a static busybox is missing;
#  2. starts dockerd in the background when `docker info` does not answer (and no dockerd is already starting),
#     logging to /var/log/mayura-dockerd.log, waits until `docker info` answers (60 s at most), and records its
#     pid in /run/mayura/dockerd.pid so that `stop` stops only a daemon it started;
#  3. installs Debian's runsc (gVisor) when the archive has it and it is missing, and registers it with the daemon as
#     the runtime `runsc` when the daemon does not list one (the Docker provider's `runtime = 'runsc'`): the entry
#     is added to /etc/docker/daemon.json (merged with jq into what is there) and a running dockerd is told with
#     SIGHUP, which reloads its runtimes without touching running containers; a daemon started by this script
#     reads it at start. Its arguments: --network=none (gVisor's own network stack with a loopback alone: this
#     runsc refuses a container's network namespace on kernels that show net.core.rmem_default in every one,
#     "cannot run with network enabled in root network namespace", and the provider offers network 'none'
#     alone under gVisor anyway) and --host-uds=create (the agent's socket, made in its bind-mounted
#     directory, is a socket of the host's that the provider connects to);
#  4. builds the test images when they are missing, never pulling anything:
#     - mayura-test/busybox:1: a root with the static /bin/busybox and a link for each of its applets
#       (sh, sleep, cat, ls, wc, head, tr, ln, kill, grep, ...), /etc/passwd and /etc/group with the sandbox
#       user 1000, /tmp (1777) and /workspace (owned by 1000), made with `docker import` of a tar stream;
#     - mayura-test/node:1: the same root plus Node.js taken from the host's installed nodejs package (Debian's
#       nodejs is installed with apt-get first when the host has no node): the node binary, every shared
#       library `ldd` lists for it, npm when it is installed as one self-contained directory
#       (/usr/lib/node_modules/npm), and the CA bundle. No debootstrap: copying one program and its libraries
#       needs nothing from the network and takes seconds;
#     - mayura-test/desktop:1: the same root plus a desktop's programs from the host (Debian's xvfb, xdotool,
#       x11-apps and netpbm, installed with apt-get first when missing): Xvfb, xkbcomp, xdotool, xwd, xwdtopnm
#       and pnmtopng with every library `ldd` lists for them, the keyboard data (/usr/share/X11/xkb) and the
#       server's protocol.txt, and desktop_app, the small X program of spec/support/desktop_app.c (built with
#       the host's cc and libX11 headers, libx11-dev) at /usr/local/bin, to click on and type into.
set -eu

BUSYBOX_IMAGE=mayura-test/busybox:1
NODE_IMAGE=mayura-test/node:1
DESKTOP_IMAGE=mayura-test/desktop:1
DESKTOP_PACKAGES="xvfb xdotool x11-apps netpbm libx11-dev"
DESKTOP_PROGRAMS="Xvfb xkbcomp xdotool xwd xwdtopnm pnmtopng"
STATE_DIR=/run/mayura
DAEMON_JSON=/etc/docker/daemon.json
RUNSC_ENTRY='{"path":"/usr/bin/runsc","runtimeArgs":["--network=none","--host-uds=create"]}'
PIDFILE=$STATE_DIR/dockerd.pid
LOG=/var/log/mayura-dockerd.log
WAIT_S=60
PATH=$PATH:/usr/sbin:/sbin
export PATH

say() { echo "docker-setup: $*"; }
die() { echo "docker-setup: $*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

answers() { docker info >/dev/null 2>&1; }

has_image() { docker image inspect "$1" >/dev/null 2>&1; }

# A busybox that needs no shared library (a dynamic one would not run in the image).
static_busybox() {
    for b in /bin/busybox /usr/bin/busybox; do
        if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then echo "$b"; return 0; fi
    done
    return 1
}

# The pid in our pid file when that process is a live dockerd.
our_dockerd() {
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    case "$pid" in ''|*[!0-9]*) return 1 ;; esac
    [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = dockerd ] || return 1
    echo "$pid"
}

# Installs docker.io when $1 is "engine" and dockerd or the CLI is missing, and busybox-static when missing.
install_packages() {
    missing=""
    if [ "$1" = engine ] && { ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; }; then
        missing="docker.io"
    fi
    if ! static_busybox >/dev/null; then missing="$missing busybox-static"; fi
    [ -n "$missing" ] || return 0
    is_root || die "missing:$missing (run as root to install them)"
    say "installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    if ! apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1; then
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
}

# Installs runsc when it is missing and the package archive has it; never fails the setup.
install_runsc() {
    command -v runsc >/dev/null 2>&1 && return 0
    is_root || return 0
    apt-cache show runsc >/dev/null 2>&1 || { say "no runsc in the package archive; no gVisor runtime"; return 0; }
    say "installing runsc (gVisor)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null 2>&1 \
        || say "runsc did not install; no gVisor runtime"
}

has_runsc_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

# Adds the runtime runsc to daemon.json (a new file, or merged with jq into the one there). Returns 1 when it
# could not (no jq to merge with, say).
write_runsc_entry() {
    mkdir -p "$(dirname "$DAEMON_JSON")"
    if [ ! -s "$DAEMON_JSON" ]; then
        printf '{\n  "runtimes": { "runsc": %s }\n}\n' "$RUNSC_ENTRY" >"$DAEMON_JSON.mayura"
    elif command -v jq >/dev/null 2>&1; then
        jq --argjson e "$RUNSC_ENTRY" '.runtimes = ((.runtimes // {}) + { runsc: (.runtimes.runsc // $e) })' \
            "$DAEMON_JSON" >"$DAEMON_JSON.mayura" || { rm -f "$DAEMON_JSON.mayura"; return 1; }
    else
        say "$DAEMON_JSON exists and there is no jq to add runsc to it"
        return 1
    fi
    chmod 644 "$DAEMON_JSON.mayura"
    mv "$DAEMON_JSON.mayura" "$DAEMON_JSON"
}

# Registers runsc with the daemon when runsc is installed and the daemon does not list it: written before a
# start (no argument), or written and told to the running daemon with SIGHUP ("running").
register_runsc() {
    command -v runsc >/dev/null 2>&1 || return 0
    is_root || return 0
    if [ "${1:-}" = running ]; then
        has_runsc_runtime && return 0
        grep -q '"runsc"' "$DAEMON_JSON" 2>/dev/null || write_runsc_entry || return 0
        pids=$(pidof dockerd 2>/dev/null || true)
        case "$pids" in
        ''|*' '*) say "runsc is in $DAEMON_JSON; restart the daemon to use it (not exactly one dockerd here)"; return 0 ;;
        esac
        say "registering the runtime runsc with dockerd $pids (SIGHUP: it reloads its runtimes)"
        kill -HUP "$pids"
        i=0
        while ! has_runsc_runtime; do
            i=$((i + 1))
            if [ "$i" -gt 40 ]; then say "dockerd did not take runsc; see $LOG"; return 0; fi
            sleep 0.25
        done
        say "dockerd lists the runtime runsc"
    elif ! grep -q '"runsc"' "$DAEMON_JSON" 2>/dev/null; then
        write_runsc_entry || true
    fi
}

start_daemon() {
    answers && return 0
    is_root || die "no Docker daemon answers, and starting one needs root"
    register_runsc
    if pidof dockerd >/dev/null 2>&1; then
        say "a dockerd is running but not answering yet; waiting for it"
    else
        mkdir -p "$STATE_DIR"
        chmod 700 "$STATE_DIR"
        say "starting dockerd (log: $LOG)"
        # setsid: the daemon outlives this script and its terminal
        setsid dockerd >>"$LOG" 2>&1 </dev/null &
        echo $! >"$PIDFILE"
    fi
    i=0
    while ! answers; do
        i=$((i + 1))
        if [ "$i" -gt $((WAIT_S * 4)) ]; then
            die "dockerd did not answer within ${WAIT_S} s; see $LOG"
        fi
        if pid=$(cat "$PIDFILE" 2>/dev/null) && [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null \
            && ! pidof dockerd >/dev/null 2>&1; then
            rm -f "$PIDFILE"
            tail -n 20 "$LOG" >&2 || true
            die "dockerd exited; see $LOG"
        fi
        sleep 0.25
    done
    say "dockerd answers"
}

stop_daemon() {
    if ! pid=$(our_dockerd); then
        rm -f "$PIDFILE"
        say "no dockerd started by this script is running; nothing stopped"
        return 0
    fi
    say "stopping dockerd ($pid)"
    kill -TERM "$pid"
    i=0
    while kill -0 "$pid" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 120 ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
        sleep 0.25
    done
    rm -f "$PIDFILE"
}

# Fills directory $1 with the busybox root.
make_busybox_root() {
    root=$1
    bb=$(static_busybox) || die "no static busybox (install busybox-static)"
    mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/usr/local/bin" "$root/etc" \
        "$root/proc" "$root/sys" "$root/dev" "$root/root" "$root/home" "$root/var/tmp" "$root/tmp" \
        "$root/workspace"
    cp "$bb" "$root/bin/busybox"
    chmod 755 "$root/bin/busybox"
    for applet in $("$bb" --list); do
        [ "$applet" = busybox ] && continue
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    # scripts that start with #!/usr/bin/env
    ln -s ../../bin/busybox "$root/usr/bin/env"
    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
sandbox:x:1000:1000:sandbox:/workspace:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
sandbox:x:1000:
nogroup:x:65534:
EOF
    chmod 1777 "$root/tmp" "$root/var/tmp"
    chmod 700 "$root/root"
    chown 1000:1000 "$root/workspace"
}

import_root() {
    root=$1
    image=$2
    tar -C "$root" --numeric-owner -cf - . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'WORKDIR /workspace' -c 'CMD ["/bin/sh"]' -c 'LABEL mayura.test=1' \
        -m "mayura test image, built offline by scripts/docker-setup.sh" - "$image" >/dev/null
}

build_busybox() {
    stage=$(mktemp -d /tmp/mayura-image-XXXXXX)
    make_busybox_root "$stage"
    import_root "$stage" "$BUSYBOX_IMAGE"
    rm -rf "$stage"
    say "built $BUSYBOX_IMAGE"
}

# Copies $1 (following links) into root $2 at the same path.
copy_in() {
    mkdir -p "$2$(dirname "$1")"
    cp -L "$1" "$2$1"
}

build_node() {
    if ! command -v node >/dev/null 2>&1; then
        is_root || die "no node on this host to build $NODE_IMAGE from (run as root to install nodejs)"
        say "installing nodejs"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs >/dev/null
    fi
    node_bin=$(readlink -f "$(command -v node)")
    stage=$(mktemp -d /tmp/mayura-image-XXXXXX)
    make_busybox_root "$stage"
    mkdir -p "$stage/usr/bin"
    cp "$node_bin" "$stage/usr/bin/node"
    # the program's shared libraries and its loader, at the paths the loader looks for them
    for lib in $(ldd "$node_bin" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p'); do
        copy_in "$lib" "$stage"
    done
    if [ -f /usr/lib/node_modules/npm/bin/npm-cli.js ]; then
        mkdir -p "$stage/usr/lib/node_modules"
        cp -a /usr/lib/node_modules/npm "$stage/usr/lib/node_modules/"
        ln -s ../lib/node_modules/npm/bin/npm-cli.js "$stage/usr/bin/npm"
        ln -s ../lib/node_modules/npm/bin/npx-cli.js "$stage/usr/bin/npx"
    fi
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then copy_in /etc/ssl/certs/ca-certificates.crt "$stage"; fi
    if is_root && ! chroot "$stage" /usr/bin/node -e 'process.exit(6 * 7 === 42 ? 0 : 1)'; then
        rm -rf "$stage"
        die "node does not run in the image's root"
    fi
    import_root "$stage" "$NODE_IMAGE"
    rm -rf "$stage"
    say "built $NODE_IMAGE"
}

# Copies every shared library ldd lists for program $1 (and its loader) into root $2.
copy_libs() {
    for lib in $(ldd "$1" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p'); do
        [ -e "$2$lib" ] || copy_in "$lib" "$2"
    done
}

# Copies program $1 (a path) and its libraries into root $2.
copy_program() {
    copy_in "$1" "$2"
    copy_libs "$1" "$2"
}

build_desktop() {
    missing=""
    for p in $DESKTOP_PACKAGES; do installed "$p" || missing="$missing $p"; done
    if [ -n "$missing" ]; then
        is_root || die "no$missing on this host to build $DESKTOP_IMAGE from (run as root to install them)"
        say "installing$missing"
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
    stage=$(mktemp -d /tmp/mayura-image-XXXXXX)
    make_busybox_root "$stage"
    for prog in $DESKTOP_PROGRAMS; do
        path=$(command -v "$prog") || { rm -rf "$stage"; die "$prog is not on this host"; }
        copy_program "$path" "$stage"
    done
    mkdir -p "$stage/usr/share/X11" "$stage/usr/lib/xorg" "$stage/var/lib/xkb"
    cp -a /usr/share/X11/xkb "$stage/usr/share/X11/"
    if [ -f /usr/lib/xorg/protocol.txt ]; then cp /usr/lib/xorg/protocol.txt "$stage/usr/lib/xorg/"; fi
    here=$(dirname "$0")
    if ! cc -O2 -o "$stage/usr/local/bin/desktop_app" "$here/../spec/support/desktop_app.c" -lX11; then
        rm -rf "$stage"
        die "cannot build spec/support/desktop_app.c (needs cc and libx11-dev)"
    fi
    copy_libs "$stage/usr/local/bin/desktop_app" "$stage"
    if is_root && ! chroot "$stage" /bin/sh -c 'Xvfb -help >/dev/null 2>&1 && xdotool --version >/dev/null'; then
        rm -rf "$stage"
        die "the desktop's programs do not run in the image's root"
    fi
    import_root "$stage" "$DESKTOP_IMAGE"
    rm -rf "$stage"
    say "built $DESKTOP_IMAGE"
}

status() {
    if answers; then say "dockerd answers"; else say "no dockerd answers"; fi
    if pid=$(our_dockerd); then say "started by this script: pid $pid"; fi
    for image in "$BUSYBOX_IMAGE" "$NODE_IMAGE" "$DESKTOP_IMAGE"; do
        if has_image "$image"; then say "$image is there"; else say "$image is missing"; fi
    done
    if has_runsc_runtime; then say "the runtime runsc (gVisor) is registered"; else say "no runtime runsc"; fi
}

case "${1:-start}" in
start)
    install_runsc
    if ! answers; then
        install_packages engine
        start_daemon
    fi
    register_runsc running
    if ! has_image "$BUSYBOX_IMAGE" || ! has_image "$NODE_IMAGE" || ! has_image "$DESKTOP_IMAGE"; then
        install_packages images
        has_image "$BUSYBOX_IMAGE" || build_busybox
        has_image "$NODE_IMAGE" || build_node
        has_image "$DESKTOP_IMAGE" || build_desktop
    fi
    ;;
stop) stop_daemon ;;
status) status ;;
*) die "usage: $0 [start|stop|status]" ;;
esac
