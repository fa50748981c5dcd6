#!/bin/sh
# Installs the Debian packages mayura needs when any is missing; does nothing
# when all are there. Idempotent; needs root (or sudo) only when installing.
set -eu

PACKAGES="build-essential pkg-config lua5.4 liblua5.4-dev luajit libluajit-5.1-dev lua-luv lua-luv-dev libuv1-dev \
libcjson-dev libcurl4-openssl-dev libwebsockets-dev libmsgpack-dev libseccomp-dev libprotobuf-c-dev protobuf-c-compiler lua-busted lua-check bubblewrap util-linux valgrind curl nodejs \
slirp4netns nftables iproute2 busybox-static xvfb xdotool x11-apps netpbm libx11-dev zsh neovim love openssl luarocks"

# kubectl (Debian's kubernetes-client) for the Kubernetes stand-in's specs, unless one is there
command -v kubectl >/dev/null 2>&1 || PACKAGES="$PACKAGES kubernetes-client"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
            echo "setup: missing packages:$missing (run as root to install them)" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# The official npm clients the specs run against the stand-ins (spec/npm/package.json, pinned),
# installed when any is missing.
need_npm=""
for dep in $(sed -n 's/^ *"\([^"]*\)": *"[0-9][^"]*",\{0,1\}$/\1/p' spec/npm/package.json); do
    [ -f "spec/npm/node_modules/$dep/package.json" ] || need_npm=1
done
if [ -n "$need_npm" ]; then
    echo "setup: installing the npm clients of spec/npm"
    (cd spec/npm && npm install --no-save --silent >/dev/null)
fi
