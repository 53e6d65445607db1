# meshrun — one Makefile. `make` builds build/meshrun; `make test` installs
# what it needs, builds and runs every check suite; `make deps` installs the
# Debian packages. Generated protobuf-c code lives in build/, never in git.

DEB_PKGS := build-essential pkg-config libevent-dev libssl-dev libprotobuf-c-dev \
            protobuf-c-compiler libopenblas-dev check libyaml-dev libcjson-dev \
            openssl iproute2 procps iputils-ping python3 python3-numpy universal-ctags
PKGS     := openblas libcjson yaml-0.1 libprotobuf-c libevent_core \
            libevent_pthreads libssl libcrypto

# Intel's ipsec-mb (Debian's libipsec-mb-dev, amd64 only) seals and opens
# our TLS records' AES-GCM at about 3x the speed of Debian 12's OpenSSL 3.0,
# which has no VAES/AVX-512 code for it (net/aead.c). A build without it
# uses OpenSSL's cipher (tls_cipher_impl: auto).
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null)
DEB_PKGS += $(if $(filter amd64,$(DEB_ARCH)),libipsec-mb-dev)
IPSEC_MB  = $(if $(wildcard /usr/include/intel-ipsec-mb.h),1)

CC       ?= cc
B        := build
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -MMD -MP \
              -I. -I$(B) -pthread
PKG_CFLAGS  = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS    = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_LIBS  = $(shell pkg-config --libs check 2>/dev/null)
CFLAGS     ?=
SAN        ?=
ALL_CFLAGS  = $(CFLAGS_BASE) $(PKG_CFLAGS) $(if $(IPSEC_MB),-DMESHRUN_IPSEC_MB) $(SAN) $(CFLAGS)
# a sanitizer finding ends the process, so the suite fails on it
ASAN_FLAGS  = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDLIBS      = $(PKG_LIBS) $(if $(IPSEC_MB),-lIPSec_MB) -lm -pthread

PROTO_C  := $(B)/proto/meshrun.pb-c.c
PROTO_H  := $(B)/proto/meshrun.pb-c.h
LIB_SRC  := $(wildcard kernels/*.c net/*.c) $(filter-out host/cli/main.c,$(wildcard host/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/%.o) $(B)/proto/meshrun.pb-c.o
TEST_SRC := $(wildcard tests/check_*.c)
TESTS    := $(TEST_SRC:tests/%.c=$(B)/tests/%)
# suites that also run under ASan/UBSan in `make test`: every parser of
# untrusted input (frames, control messages, safetensors, config, data files)
ASAN_TESTS := check_frame check_tlsrec check_wire check_safetensors check_config check_data check_hostfile
# tests/check-layout (file and function sizes, objects that use each other,
# includes across host/ net/ kernels/, ../shared in the docs) joins `make
# test` with LAYOUT_CHECK=1; its self-test always runs. `make layout` runs it.
LAYOUT_CHECK ?= 1
LAYOUT_SUITES := tests/check-layout-selftest $(if $(filter 1,$(LAYOUT_CHECK)),tests/check-layout)
# tests/check-docs (every name README.md and docs/ use exists in the tree,
# configs/base.yml lists every key; reads files only, about a second)
# joins `make test`; `make docs-check` runs it alone.
DOCS_SUITES := tests/check-docs

.PHONY: all deps test layout docs-check asan clean demo fuzz fuzz-deps fuzz-seeds soak FORCE
all: $(B)/meshrun

# deps includes the cluster packages (cluster-deps, installed without
# starting their services): tests/check-launch needs sshd and Slurm
deps: cluster-deps
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

# kernels/: sqrtf and the like without errno, so their loops vectorise; a
# correctly rounded sqrt gives the same bits either way (kernels/isa.h)
$(B)/kernels/%.o: ALL_CFLAGS += -fno-math-errno

$(B)/proto/meshrun.pb-c.o: $(PROTO_C)
	$(CC) $(filter-out -Werror,$(ALL_CFLAGS)) -c $< -o $@

$(B)/libmeshrun.a: $(LIB_OBJ)
	@rm -f $@   # members of deleted sources must not linger
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
	@$(MAKE) --no-print-directory all $(TESTS) $(ASAN_TESTS:%=$(B)/asan/tests/%) $(FUZZ_REPLAY)
	@netns="tests/check_netns.sh tests/check_fault_netns.sh tests/check_halfopen_netns.sh"; tests/check_netns.sh --probe || netns=; \
	MESHRUN=$(abspath $(B)/meshrun) MESHRUN_BUILD=$(abspath $(B)) tests/run-all \
	  $(TESTS) $(ASAN_TESTS:%=$(B)/asan/tests/%) $(FUZZ_REPLAY) $$netns tests/check-launch \
	  tests/check_soak.sh $(LAYOUT_SUITES) $(DOCS_SUITES)

# The chaos run (tests/soak.sh): 2,000 steps on 3 hosts under a seeded
# random mix of resets, drops, corruptions, delays, half-open links and
# SIGKILLed agents with --max-restarts, losses bit-identical to a clean
# run. SOAK_SEED picks the mix, SOAK_STEPS the length.
SOAK_SEED ?= 1
SOAK_STEPS ?= 2000
soak: all
	MESHRUN=$(abspath $(B)/meshrun) tests/soak.sh --steps $(SOAK_STEPS) --seed $(SOAK_SEED)

layout: all
	@MESHRUN_BUILD=$(abspath $(B)) tests/check-layout

docs-check:
	@tests/check-docs

# The main job: a real multi-host training run on loopback (2 agents x 2
# device threads, mutually authenticated TLS 1.3 between them).
demo: deps
	@$(MAKE) --no-print-directory all
	$(B)/meshrun local --hosts 2 --devices-per-host 2 --config configs/llama-tiny.yml

asan:
	$(MAKE) B=$(B)/asan SAN="$(ASAN_FLAGS)" $(B)/asan/meshrun

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

# ---- fuzzing (tests/fuzz/) ----
# `make fuzz [FUZZ_S=60]` builds every target with clang, libFuzzer, ASan
# and UBSan and runs each FUZZ_S seconds on a scratch corpus (new inputs go
# to $(B)/fuzz/corpus/, never into the seeds in git); a finding is saved in
# $(B)/fuzz/findings/ and fails the run. `make test` replays the seeds of
# every target with gcc's ASan/UBSan (no clang needed).
FUZZ_PKGS    := clang libclang-rt-14-dev
FUZZ_TARGETS := frame control stream records config safetensors
FUZZ_S       ?= 60
FUZZ_CC      ?= clang
FUZZ_SAN     := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
                -fno-omit-frame-pointer
FUZZ_REPLAY  := $(FUZZ_TARGETS:%=$(B)/asan/tests/fuzz_%)
FUZZ_COMMON  := tests/fuzz/fuzz_util.c tests/fuzz/link_model.c
# fuzz_config opens nothing outside its scratch directory
FUZZ_LDFLAGS_config := -Wl,--wrap=fopen

fuzz-deps:
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(FUZZ_PKGS)"

fuzz: deps fuzz-deps
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=$(B)/fuzz/fuzz_%)
	@tests/fuzz/run-fuzz $(FUZZ_S) $(B)/fuzz $(FUZZ_TARGETS)

# the library trees, each built by one recursive make (not once per target)
$(B)/fuzz/libmeshrun.a: FORCE
	@$(MAKE) --no-print-directory B=$(B)/fuzz CC=$(FUZZ_CC) SAN="$(FUZZ_SAN)" $@

FORCE:

$(B)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_COMMON) tests/fuzz/*.h $(B)/fuzz/libmeshrun.a
	$(FUZZ_CC) $(CFLAGS_BASE) -I$(B)/fuzz $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined -fno-omit-frame-pointer -o $@ $< $(FUZZ_COMMON) \
	  $(B)/fuzz/libmeshrun.a $(LDLIBS) $(FUZZ_LDFLAGS_$*)

# the same targets driven by tests/fuzz/replay.c over their seeds, for make test
$(B)/asan/tests/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_COMMON) tests/fuzz/*.h \
                        $(B)/asan/libmeshrun.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -I$(B)/asan $(PKG_CFLAGS) $(ASAN_FLAGS) \
	  -DFUZZ_CORPUS='"$(abspath tests/fuzz/$*)"' -o $@ $< tests/fuzz/replay.c $(FUZZ_COMMON) \
	  $(B)/asan/libmeshrun.a $(LDLIBS) $(FUZZ_LDFLAGS_$*)

# Regenerates the seeds in git: frames encoded with protobuf-c, configs,
# safetensors files, and a real tiny checkpoint's model and config.
$(B)/tests/gen_seeds: tests/fuzz/gen_seeds.c tests/fuzz/link_model.h $(B)/libmeshrun.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(B)/libmeshrun.a $(LDLIBS)

fuzz-seeds: deps
	@$(MAKE) --no-print-directory all $(B)/tests/gen_seeds
	$(B)/tests/gen_seeds tests/fuzz configs/llama-tiny.yml configs/deepseek-tiny.yml
	@tmp=$$(mktemp -d) && \
	$(B)/meshrun train --config configs/llama-tiny.yml steps=1 base_emb_dim=8 base_mlp_dim=16 \
	  base_num_query_heads=2 base_num_kv_heads=1 base_num_decoder_layers=1 max_target_length=8 \
	  per_device_batch_size=1 logits_via_embedding=true --checkpoint-dir $$tmp/ck >/dev/null && \
	cp $$tmp/ck/step-000001/model.safetensors tests/fuzz/safetensors/checkpoint-model && \
	cp $$tmp/ck/step-000001/meshrun.yml tests/fuzz/config/checkpoint-meshrun.yml; rc=$$?; rm -rf $$tmp; exit $$rc

-include $(shell find $(B) -name '*.d' 2>/dev/null)
