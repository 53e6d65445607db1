# meshrun — one Makefile. `make` builds build/meshrun; `make test` installs
# what it needs, builds and runs every check suite; `make deps` installs the
# Debian packages. Generated protobuf-c code lives in build/, never in git.

DEB_PKGS := build-essential pkg-config libevent-dev libssl-dev libprotobuf-c-dev \
            protobuf-c-compiler libopenblas-dev check libyaml-dev libcjson-dev \
            openssl iproute2 procps python3 universal-ctags
PKGS     := openblas libcjson yaml-0.1 libprotobuf-c libevent_core \
            libevent_pthreads libssl libcrypto

CC       ?= cc
B        := build
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -MMD -MP \
              -I. -I$(B) -pthread
PKG_CFLAGS  = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS    = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_LIBS  = $(shell pkg-config --libs check 2>/dev/null)
CFLAGS     ?=
SAN        ?=
ALL_CFLAGS  = $(CFLAGS_BASE) $(PKG_CFLAGS) $(SAN) $(CFLAGS)
# a sanitizer finding ends the process, so the suite fails on it
ASAN_FLAGS  = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDLIBS      = $(PKG_LIBS) -lm -pthread

PROTO_C  := $(B)/proto/meshrun.pb-c.c
PROTO_H  := $(B)/proto/meshrun.pb-c.h
LIB_SRC  := $(wildcard kernels/*.c net/*.c) $(filter-out host/cli/main.c,$(wildcard host/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/%.o) $(B)/proto/meshrun.pb-c.o
TEST_SRC := $(wildcard tests/check_*.c)
TESTS    := $(TEST_SRC:tests/%.c=$(B)/tests/%)
# suites that also run under ASan/UBSan in `make test`: every parser of
# untrusted input (frames, safetensors, config, data files)
ASAN_TESTS := check_frame check_safetensors check_config check_data
# tests/check-layout (file and function sizes, objects that use each other,
# includes across host/ net/ kernels/, ../shared in the docs) joins `make
# test` with LAYOUT_CHECK=1; its self-test always runs. `make layout` runs it.
LAYOUT_CHECK ?= 0
LAYOUT_SUITES := tests/check-layout-selftest $(if $(filter 1,$(LAYOUT_CHECK)),tests/check-layout)

.PHONY: all deps test layout asan clean demo FORCE
all: $(B)/meshrun

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	fi

$(PROTO_C) $(PROTO_H): proto/meshrun.proto
	@mkdir -p $(B)/proto
	protoc-c --c_out=$(B) proto/meshrun.proto

$(B)/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(B)/proto/meshrun.pb-c.o: $(PROTO_C)
	$(CC) $(filter-out -Werror,$(ALL_CFLAGS)) -c $< -o $@

$(B)/libmeshrun.a: $(LIB_OBJ)
	ar rcs $@ $^

$(B)/meshrun: $(B)/host/cli/main.o $(B)/libmeshrun.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/%: tests/%.c $(B)/libmeshrun.a
	@mkdir -p $(B)/tests
	$(CC) $(ALL_CFLAGS) -o $@ $< $(B)/libmeshrun.a $(CHECK_LIBS) $(LDLIBS)

# ASan build of selected suites, from a separate object tree. The library
# is one target (made once per run, however many suites need it); a sub-make
# with B=$(B)/asan keeps its dependencies.
$(B)/asan/libmeshrun.a: FORCE
	@$(MAKE) --no-print-directory B=$(B)/asan SAN="$(ASAN_FLAGS)" $@

$(B)/asan/tests/%: tests/%.c $(B)/asan/libmeshrun.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -I$(B)/asan $(PKG_CFLAGS) $(ASAN_FLAGS) -o $@ $< $(B)/asan/libmeshrun.a $(CHECK_LIBS) $(LDLIBS)

test: deps
	@$(MAKE) --no-print-directory all $(TESTS) $(ASAN_TESTS:%=$(B)/asan/tests/%)
	@MESHRUN=$(abspath $(B)/meshrun) MESHRUN_BUILD=$(abspath $(B)) tests/run-all \
	  $(TESTS) $(ASAN_TESTS:%=$(B)/asan/tests/%) $(LAYOUT_SUITES)

layout: all
	@MESHRUN_BUILD=$(abspath $(B)) tests/check-layout

# The main job: a real multi-host training run on loopback (2 agents x 2
# device threads, mutually authenticated TLS 1.3 between them).
demo: deps
	@$(MAKE) --no-print-directory all
	$(B)/meshrun local --hosts 2 --devices-per-host 2 --config configs/llama-tiny.yml

asan:
	$(MAKE) B=$(B)/asan SAN="$(ASAN_FLAGS)" $(B)/asan/meshrun

clean:
	rm -rf $(B)

FORCE:

-include $(shell find $(B) -name '*.d' 2>/dev/null)
