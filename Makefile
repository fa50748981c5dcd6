# mayura: build the C core (build/lib/mayura/core.so), the host program
# (build/mayura) and the in-sandbox agent; run the demo, the specs, the
# sanitizer and valgrind runs, the linters and the benchmarks.
#
#   make             build everything for Lua 5.4 (build/)
#   make LUA=luajit  the same for LuaJIT 2.1 (build/luajit/; the agent is shared)
#   make demo        run the main example (installs what is missing first)
#   make test        run every spec under Lua 5.4, then under LuaJIT (installs what is missing first)
#   make specs       run every spec under $(LUA) only
#   make embed       the C embedding library (include/mayura.h: $(BUILD)/lib/libmayura.a) and its example game host

LUA        ?= lua5.4
CC         ?= gcc
PKG_CONFIG ?= pkg-config
PREFIX     ?= /usr/local
ifneq ($(findstring 5.2,$(notdir $(LUA)))$(findstring 5.3,$(notdir $(LUA))),)
$(error mayura builds for Lua 5.4 or LuaJIT 2.1, not $(LUA))
endif
# LUA may be a name or a path (luarocks passes the interpreter's path): a LuaJIT or a 5.1 one
# builds for LuaJIT, the one 5.1-ABI interpreter mayura supports.
ifneq ($(findstring jit,$(notdir $(LUA)))$(findstring 5.1,$(notdir $(LUA))),)
# LuaJIT 2.1 has the Lua 5.1 ABI: Debian's luv for 5.1 serves it.
LUA_PC     ?= luajit
LUA_ABI    ?= 5.1
LUV_CFLAGS ?= -I$(shell $(PKG_CONFIG) --variable=prefix $(LUA_PC) 2>/dev/null)/include/lua5.1
BUILD      ?= build/luajit
else
LUA_PC     ?= lua5.4
LUA_ABI    ?= 5.4
LUV_CFLAGS ?=
BUILD      ?= build
endif
LUV_LIB    ?= lua$(LUA_ABI)-luv
LUADIR     ?= $(PREFIX)/share/lua/$(LUA_ABI)
LIBDIR     ?= $(PREFIX)/lib/lua/$(LUA_ABI)
BUSTED     ?= $(LUA) spec/runner.lua
# The interpreters `make test` runs the whole suite under, one pass each.
TEST_LUAS  ?= lua5.4 luajit

# Where protoc-c puts the gRPC messages' C (see PROTO_SRC below).
PROTO_GEN = build/gen/proto
WARN     = -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith
CFLAGS  ?= -O2 -g
DEPS_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(LUA_PC) libuv libcurl libcjson libwebsockets msgpack libprotobuf-c 2>/dev/null) \
               $(LUV_CFLAGS) -I$(PROTO_GEN)
DEPS_LIBS   := $(shell $(PKG_CONFIG) --libs libuv libcurl libcjson libwebsockets msgpack libprotobuf-c 2>/dev/null) \
               -l$(LUV_LIB)
ALL_CFLAGS = -std=gnu11 $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden $(DEPS_CFLAGS) \
             -DMAYURA_LUADIR='"$(LUADIR)"' -DMAYURA_LIBDIR='"$(LIBDIR)"'

CORE_SRC = core/mayura_core.c
# The gRPC messages (proto/, the project's own .proto files): protoc-c makes their descriptors,
# which core/proto.c includes.
PROTO_SRC = $(wildcard proto/*/*.proto)
PROTO_STAMP = $(PROTO_GEN)/.made
CORE_DEP = $(wildcard core/*.c core/*.h) $(PROTO_STAMP)

SO      = $(BUILD)/lib/mayura/core.so
AGENT   = build/mayura-agent
AGENT_HOST = build/mayura-agent-host
LAUNCH  = build/mayura-launch
HOST    = $(BUILD)/mayura
ASAN_SO = $(BUILD)/asan/lib/mayura/core.so
EMBED_LIB = $(BUILD)/lib/libmayura.a
GAME    = $(BUILD)/embed/game
SAN     = -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=undefined,float-cast-overflow

.PHONY: all setup test specs demo asan asan-pass valgrind lint bench fuzz clean install check-deps embed rocks

all: $(SO) $(HOST) $(AGENT) $(AGENT_HOST) $(LAUNCH) embed

embed: $(EMBED_LIB) $(GAME)

# The in-sandbox agent: static, so it runs in any image (BusyBox included). Its pieces (agent/*.c,
# agent/agent.h) are compiled and linked in one command. Each sandbox holds a copy of it, so it is
# built for size: -Os, unused sections dropped, no symbols.
AGENT_SRC = $(wildcard agent/*.c)
AGENT_DEP = $(AGENT_SRC) agent/agent.h core/wire.h core/tree.h core/files.h
AGENT_CFLAGS ?= -Os -ffunction-sections -fdata-sections -Wl,--gc-sections -s
# Its syscall filter is made here, once, by libseccomp (agent/gen/filter_gen.c), as a C table the
# agent includes: it starts without building it, and without libseccomp.
FILTER_GEN = build/gen/filter_gen
FILTER_H   = build/gen/filter_program.h
FILTER_DEF = -I$(dir $(FILTER_H)) -DMAYURA_FILTER_PROGRAM='"filter_program.h"'
$(FILTER_GEN): agent/gen/filter_gen.c agent/filter.c agent/agent.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) -O2 -Iagent -o $@ agent/gen/filter_gen.c agent/filter.c -lseccomp
$(FILTER_H): $(FILTER_GEN)
	$(FILTER_GEN) > $@.tmp && mv $@.tmp $@
$(AGENT): $(AGENT_DEP) $(FILTER_H)
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(AGENT_CFLAGS) $(FILTER_DEF) -static -o $@ $(AGENT_SRC)

# The same agent linked against the host's own libraries, for local sandboxes without an image
# (their /usr is the host's, read-only): a few dozen KiB to copy per sandbox, and the library
# pages are shared by every sandbox instead of a private copy in each one's memory.
$(AGENT_HOST): $(AGENT_DEP) $(FILTER_H)
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(AGENT_CFLAGS) $(FILTER_DEF) -o $@ $(AGENT_SRC)

# The keeper of a local sandbox (launcher/: launch.c's flow, its pieces over launcher/launch.h):
# cgroups, mounts, uid, bubblewrap, the lifetime and the clean-up, in one static program instead
# of a shell and a dozen commands.
LAUNCH_SRC = $(wildcard launcher/*.c)
$(LAUNCH): $(LAUNCH_SRC) launcher/launch.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(AGENT_CFLAGS) -static -o $@ $(LAUNCH_SRC)

# For bench/sandbox.lua only: the agent without its syscall filter, to measure what the filter costs.
AGENT_NOFILTER = build/bench/mayura-agent-nofilter
$(AGENT_NOFILTER): $(AGENT_DEP)
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(CFLAGS) -DMAYURA_AGENT_NO_FILTER -static -o $@ $(AGENT_SRC)

# For bench/sandbox.lua and bench/stream.lua only: the baseline, a C fork+exec of /bin/true, and a
# clock stamp to run in a sandbox (static, so it runs in any image).
FORKEXEC = build/bench/forkexec
$(FORKEXEC): bench/forkexec.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(CFLAGS) -static -o $@ bench/forkexec.c

$(PROTO_STAMP): $(PROTO_SRC)
	@mkdir -p $(PROTO_GEN)
	protoc-c --c_out=$(PROTO_GEN) -Iproto $(PROTO_SRC)
	@touch $@

$(SO): $(CORE_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -o $@ $(CORE_SRC) $(DEPS_LIBS)

$(HOST): core/host.c $(CORE_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DMAYURA_HOST -o $@ core/host.c \
	    $(shell $(PKG_CONFIG) --libs $(LUA_PC)) $(DEPS_LIBS) -Wl,-E

# The embedding API (include/mayura.h) from the core's one source, for a C host with its own loop.
$(EMBED_LIB): core/embed.c include/mayura.h $(CORE_DEP)
	@mkdir -p $(BUILD)/embed $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $(BUILD)/embed/embed.o core/embed.c
	rm -f $@ && ar rcs $@ $(BUILD)/embed/embed.o

$(GAME): examples/embed/game.c include/mayura.h $(EMBED_LIB)
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(CFLAGS) $(DEPS_CFLAGS) -Iinclude -o $@ examples/embed/game.c $(EMBED_LIB) \
	    $(shell $(PKG_CONFIG) --libs $(LUA_PC)) $(DEPS_LIBS) -lm

$(ASAN_SO): $(CORE_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SAN) -DMAYURA_SANITIZED -O1 -shared -o $@ $(CORE_SRC) $(DEPS_LIBS)

# Installs the Debian packages the project needs when any is missing; does nothing otherwise.
setup:
	@sh scripts/setup.sh
	@sh scripts/docker-setup.sh

# Both passes run even when the first fails; each ends with its busted summary line.
test: setup
	@for l in $(TEST_LUAS); do $(MAKE) --no-print-directory all LUA=$$l || exit 1; done
	@rc=0; for l in $(TEST_LUAS); do \
	    echo "== the specs under $$l"; \
	    $(MAKE) --no-print-directory specs LUA=$$l || rc=1; \
	done; exit $$rc

# One pass of the suite under $(LUA) against its build; prints the pass's wall time.
specs: all
	@t0=$$(date +%s.%N); rc=0; MAYURA_BUILD=$(BUILD) $(BUSTED) || rc=$$?; \
	awk -v a=$$t0 -v b=$$(date +%s.%N) 'BEGIN { printf "specs under $(LUA): %.1f s wall\n", b - a }'; exit $$rc

demo: setup
	@$(MAKE) --no-print-directory all
	$(HOST) examples/coding_agent.lua

# The specs against an AddressSanitizer+UBSan build of the core: under Lua 5.4 the specs that
# drive the core hardest (ASAN_SPECS: every piece of the core on its own, the Lua layer, the abuse
# suite's floods of output, names, files, snapshots and proxied connections through the core and its
# HTTP server (its other specs try the kernel's, the launcher's and the agent's defences, none
# of which runs in the core), the MCP server's JSON, a host's loop, the local provider,
# WebSocket, SigV4, event-stream and gRPC through three hosted providers, the agent's and HTTP's faults),
# then the specs of the core and the Lua layer (ASAN_LUAJIT_SPECS) under LuaJIT, where the
# compat.h shims are what differs. `make asan-pass ASAN_SPECS=spec ASAN_PROVIDERS=` for the whole suite.
# The cross-provider specs run there on the local provider and Docker's Engine API
# (ASAN_PROVIDERS; empty for every one): Docker through its CLI runs the same C as the local
# provider (processes and pipes, the agent's socket), gVisor the same as the Engine API (only the
# create's runtime differs); `make test` runs them on every provider.
ASAN_SPECS ?= spec/core spec/lua $(addprefix spec/security/,$(addsuffix _spec.lua,allowlist files listing output policy serve snapshot)) \
    spec/mcp spec/embed/step_spec.lua spec/embed/frame_budget_spec.lua \
    spec/providers/local_spec.lua spec/providers/railway_spec.lua spec/providers/agentcore_spec.lua \
    spec/providers/modal_spec.lua spec/faults/agent_spec.lua spec/faults/http_spec.lua
ASAN_LUAJIT_SPECS ?= spec/core spec/lua
ASAN_PROVIDERS ?= local,docker-api
asan: setup
	@rc=0; $(MAKE) --no-print-directory asan-pass LUA=lua5.4 ASAN_SPECS="$(ASAN_SPECS)" || rc=1; \
	$(MAKE) --no-print-directory asan-pass LUA=luajit ASAN_SPECS="$(ASAN_LUAJIT_SPECS)" || rc=1; exit $$rc

asan-pass: all $(ASAN_SO)
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	MAYURA_SPEC_PROVIDERS="$(ASAN_PROVIDERS)" MAYURA_BUILD=$(BUILD) MAYURA_CPATH="$(BUILD)/asan/lib/?.so" $(BUSTED) $(ASAN_SPECS)

# The core specs under valgrind: no errors, no definite leaks (Lua 5.4: LuaJIT's own allocator
# needs a build of LuaJIT made for valgrind).
valgrind: setup $(SO)
	MAYURA_BUILD=$(BUILD) valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
	    --show-leak-kinds=definite --trace-children=no \
	    $(BUSTED) spec/core

# libFuzzer targets for every parser of the core, each for a bounded time (FUZZ_SECONDS).
fuzz: setup
	sh fuzz/run.sh

# luacheck over the Lua, and each piece of the core compiled on its own (each includes mc.h, so an
# editor's language server reads any of them alone).
lint: $(PROTO_STAMP)
	luacheck lua providers tools spec examples bench fuzz plugin
	@for f in $(filter-out core/mayura_core.c core/host.c core/embed.c,$(wildcard core/*.c)); do \
	    $(CC) -std=gnu11 $(WARN) $(DEPS_CFLAGS) -fsyntax-only $$f || exit 1; done

bench: all $(AGENT_NOFILTER) $(FORKEXEC)
	@$(MAKE) --no-print-directory all LUA=luajit
	$(HOST) bench/core.lua
	$(HOST) bench/sandbox.lua
	$(HOST) bench/stream.lua
	$(HOST) bench/runtime.lua
	$(HOST) bench/docker.lua
	$(HOST) bench/warm.lua
	$(HOST) bench/table.lua
	$(HOST) bench/command_backend.lua
	$(HOST) bench/suite.lua
	$(HOST) bench/desktop.lua
	$(HOST) bench/proxy.lua
	$(HOST) bench/e2b.lua
	$(HOST) bench/warm_hosted.lua
	$(HOST) bench/vercel.lua
	$(HOST) bench/daytona.lua
	$(HOST) bench/embed.lua
	$(HOST) bench/mcp.lua
	$(HOST) bench/railway.lua
	$(HOST) bench/northflank.lua
	$(HOST) bench/fly.lua
	$(HOST) bench/cloudflare.lua
	$(HOST) bench/agentcore.lua
	$(HOST) bench/apple_container.lua
	$(HOST) bench/codesandbox.lua
	$(HOST) bench/modal.lua

install: all
	install -d $(DESTDIR)$(LUADIR)/mayura $(DESTDIR)$(LIBDIR)/mayura $(DESTDIR)$(PREFIX)/bin
	cp -R lua/mayura/. $(DESTDIR)$(LUADIR)/mayura/
	cp -R providers/mayura/. $(DESTDIR)$(LUADIR)/mayura/
	cp -R tools/mayura/. $(DESTDIR)$(LUADIR)/mayura/
	install -m 755 $(SO) $(DESTDIR)$(LIBDIR)/mayura/core.so
	install -m 755 $(HOST) $(DESTDIR)$(PREFIX)/bin/mayura
	install -d $(DESTDIR)$(PREFIX)/lib/mayura
	install -m 755 $(AGENT) $(DESTDIR)$(PREFIX)/lib/mayura/mayura-agent
	install -m 755 $(AGENT_HOST) $(DESTDIR)$(PREFIX)/lib/mayura/mayura-agent-host
	install -m 755 $(LAUNCH) $(DESTDIR)$(PREFIX)/lib/mayura/mayura-launch

# `luarocks make` from a clean clone for Lua 5.4 and for LuaJIT, then a sandbox command in each.
rocks: setup
	@sh scripts/rocks-check.sh

clean:
	rm -rf build
