# mayura: build the C core (build/lib/mayura/core.so), the host program
# (build/mayura) and the in-sandbox agent; run the demo, the specs, the
# sanitizer and valgrind runs, the linters and the benchmarks.
#
#   make          build everything
#   make demo     run the main example (installs what is missing first)
#   make test     run every spec (installs what is missing first)

LUA        ?= lua5.4
LUA_PC     ?= lua5.4
CC         ?= gcc
PKG_CONFIG ?= pkg-config
PREFIX     ?= /usr/local
LUADIR     ?= $(PREFIX)/share/lua/5.4
LIBDIR     ?= $(PREFIX)/lib/lua/5.4
BUSTED     ?= $(LUA) spec/runner.lua

WARN     = -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith
CFLAGS  ?= -O2 -g
DEPS_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(LUA_PC) libuv libcurl libcjson 2>/dev/null)
DEPS_LIBS   := $(shell $(PKG_CONFIG) --libs libuv libcurl libcjson 2>/dev/null) -l$(LUA_PC)-luv
ALL_CFLAGS = -std=gnu11 $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden $(DEPS_CFLAGS) \
             -DMAYURA_LUADIR='"$(LUADIR)"' -DMAYURA_LIBDIR='"$(LIBDIR)"'

CORE_SRC = core/mayura_core.c
CORE_DEP = $(wildcard core/*.c core/*.h)

SO      = build/lib/mayura/core.so
AGENT   = build/mayura-agent
HOST    = build/mayura
ASAN_SO = build/asan/lib/mayura/core.so
SAN     = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all setup test demo asan valgrind lint bench fuzz clean install check-deps

all: $(SO) $(HOST) $(AGENT)

# The in-sandbox agent: static, so it runs in any image (BusyBox included).
$(AGENT): agent/agent.c core/wire.h core/tree.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(CFLAGS) -static -o $@ agent/agent.c

$(SO): $(CORE_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -o $@ $(CORE_SRC) $(DEPS_LIBS)

$(HOST): core/host.c $(CORE_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DMAYURA_HOST -o $@ core/host.c \
	    $(shell $(PKG_CONFIG) --libs $(LUA_PC)) $(DEPS_LIBS) -Wl,-E

$(ASAN_SO): $(CORE_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SAN) -O1 -shared -o $@ $(CORE_SRC) $(DEPS_LIBS)

# Installs the Debian packages the project needs when any is missing; does nothing otherwise.
setup:
	@sh scripts/setup.sh
	@sh scripts/docker-setup.sh

test: setup
	@$(MAKE) --no-print-directory all
	$(BUSTED)

demo: setup
	@$(MAKE) --no-print-directory all
	$(HOST) examples/coding_agent.lua

# The specs against an AddressSanitizer+UBSan build of the core.
asan: setup $(ASAN_SO)
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	MAYURA_CPATH="build/asan/lib/?.so" $(BUSTED)

# The core specs under valgrind: no errors, no definite leaks.
valgrind: setup $(SO)
	valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
	    --show-leak-kinds=definite --trace-children=no \
	    $(BUSTED) spec/core

# libFuzzer targets for every parser of the core, each for a bounded time (FUZZ_SECONDS).
fuzz: setup
	sh fuzz/run.sh

lint:
	luacheck lua providers tools spec examples bench fuzz

bench: all
	$(HOST) bench/core.lua
	$(HOST) bench/sandbox.lua
	$(HOST) bench/runtime.lua
	$(HOST) bench/docker.lua
	$(HOST) bench/table.lua
	$(HOST) bench/command_backend.lua
	$(HOST) bench/daytona.lua

install: all
	install -d $(DESTDIR)$(LUADIR)/mayura $(DESTDIR)$(LIBDIR)/mayura $(DESTDIR)$(PREFIX)/bin
	cp -R lua/mayura/. $(DESTDIR)$(LUADIR)/mayura/
	cp -R providers/mayura/. $(DESTDIR)$(LUADIR)/mayura/
	cp -R tools/mayura/. $(DESTDIR)$(LUADIR)/mayura/
	install -m 755 $(SO) $(DESTDIR)$(LIBDIR)/mayura/core.so
	install -m 755 $(HOST) $(DESTDIR)$(PREFIX)/bin/mayura
	install -d $(DESTDIR)$(PREFIX)/lib/mayura
	install -m 755 $(AGENT) $(DESTDIR)$(PREFIX)/lib/mayura/mayura-agent

clean:
	rm -rf build
