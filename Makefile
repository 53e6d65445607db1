# meshrun — one Makefile. `make` builds build/meshrun; `make test` installs
# what it needs, builds and runs every check suite; `make deps` installs the
# Debian packages. Generated protobuf-c code lives in build/, never in git.

DEB_PKGS := build-essential pkg-config libevent-dev libssl-dev libprotobuf-c-dev \
            protobuf-c-compiler libopenblas-dev check libyaml-dev libcjson-dev \
            openssl iproute2 procps
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
LDLIBS      = $(PKG_LIBS) -lm -pthread

PROTO_C  := $(B)/proto/meshrun.pb-c.c
PROTO_H  := $(B)/proto/meshrun.pb-c.h
LIB_SRC  := $(wildcard kernels/*.c net/*.c) $(filter-out host/cli/main.c,$(wildcard host/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/%.o) $(B)/proto/meshrun.pb-c.o
TEST_SRC := $(wildcard tests/check_*.c)
TESTS    := $(TEST_SRC:tests/%.c=$(B)/tests/%)
# suites that also run under AddressSanitizer in `make test`
ASAN_TESTS := check_frame

.PHONY: all deps test test-long asan clean demo
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

# ASan build of selected suites, from a separate object tree
$(B)/asan/tests/%: tests/%.c
	$(MAKE) --no-print-directory B=$(B)/asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" $(B)/asan/libmeshrun.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -I$(B)/asan $(PKG_CFLAGS) -fsanitize=address,undefined -fno-omit-frame-pointer -o $@ $< $(B)/asan/libmeshrun.a $(CHECK_LIBS) $(LDLIBS)

test: deps
	@$(MAKE) --no-print-directory all $(TESTS) $(ASAN_TESTS:%=$(B)/asan/tests/%)
	@MESHRUN=$(abspath $(B)/meshrun) tests/run-all $(TESTS) $(ASAN_TESTS:%=$(B)/asan/tests/%)

test-long: deps
	@$(MAKE) --no-print-directory all $(TESTS)
	@MESHRUN_LONG=1 MESHRUN=$(abspath $(B)/meshrun) tests/run-all $(TESTS)

# The main job: a real multi-host training run on loopback (2 agents x 2
# device threads, mutually authenticated TLS 1.3 between them).
demo: deps
	@$(MAKE) --no-print-directory all
	$(B)/meshrun local --hosts 2 --devices-per-host 2 --config configs/llama-tiny.yml

asan:
	$(MAKE) B=$(B)/asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" $(B)/asan/meshrun

# What deploy/cluster.sh and tests/check-cluster need: a test cluster of
# network namespaces with a real sshd and a real Slurm. Installing must not
# start the system's own sshd, munged, slurmctld or slurmd: where no
# policy-rc.d forbids it, one is put in place for the install and removed.
CLUSTER_PKGS := openssh-server slurm-wlm munge nftables iproute2

.PHONY: cluster-deps
cluster-deps:
	@missing=""; for p in $(CLUSTER_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  guard=""; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    printf '#!/bin/sh\n# make cluster-deps: start no service while installing\nexit 101\n' >/usr/sbin/policy-rc.d && \
	    chmod 755 /usr/sbin/policy-rc.d && guard=1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  rc=$$?; [ -z "$$guard" ] || rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	fi

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
