#!/usr/bin/env bash
# Instructions per TLS record of the record layer alone (net/tls_rec.c,
# built here with bench/rec_cost.c against this tree's build/): one
# 16 KiB AES-128-GCM record sealed and opened over a socketpair, counted
# by valgrind's callgrind (user-space instructions; the kernel's socket
# work is not counted) as the run of 2*MIB MiB minus the run of MIB,
# over the records between. Sorted into: the AES-GCM kernel (libcrypto's
# functions of more than 10,000 instructions a record), OpenSSL's
# parameter lookups (OSSL_PARAM_locate and libc's strcmp), the rest of
# libcrypto (the EVP and provider calls around each record), libc's
# copies, the record layer's own code and the harness (memcmp, main).
# Clock-free and independent of the load. Under valgrind OpenSSL takes
# its AVX2 code, not AVX-512: the kernel's count is not the machine's,
# the calls around it are. BIN=PATH counts another rec_cost binary
# (e.g. one built from another tree) instead of building one.
# usage: [BIN=path] bench/rec_cost.sh [MIB]
set -eu
cd "$(dirname "$0")/.."
mib=${1:-8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${BIN:-}
if [ -z "$bin" ]; then
  make -s build/net/tls_rec.o build/net/aead.o build/net/rec_log.o build/net/conn.o
  # ipsec-mb where the build has it (the Makefile's test)
  imb=; [ -e /usr/include/intel-ipsec-mb.h ] && imb=-lIPSec_MB
  cc -std=c11 -D_GNU_SOURCE -O2 -g -I. -o "$tmp/rec_cost" bench/rec_cost.c build/net/tls_rec.o \
    build/net/aead.o build/net/rec_log.o build/net/conn.o -lssl -lcrypto $imb -pthread
  bin=$tmp/rec_cost
fi
for k in 1 2; do
  valgrind -q --tool=callgrind --callgrind-out-file="$tmp/cg.$k" "$bin" $((mib * k)) >/dev/null
  callgrind_annotate --threshold=100 --auto=no "$tmp/cg.$k" >"$tmp/an.$k"
done
/usr/bin/python3 - "$tmp/an.1" "$tmp/an.2" "$mib" <<'PY'
import re, sys
def load(f):
    d = {}
    for line in open(f):
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if m and "PROGRAM TOTALS" not in line:
            d[m.group(2).strip()] = int(m.group(1).replace(",", ""))
    return d
a, b, mib = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
recs = mib * 64
cats = {}
for k in set(a) | set(b):
    v = (b.get(k, 0) - a.get(k, 0)) / recs
    if "libcrypto" in k:
        c = ("OSSL_PARAM lookups (OSSL_PARAM_locate, strcmp)" if "OSSL_PARAM_locate" in k
             else "AES-GCM kernel" if v > 10000 else "libcrypto: EVP and provider calls")
    elif "strcmp" in k:
        c = "OSSL_PARAM lookups (OSSL_PARAM_locate, strcmp)"
    elif re.search(r"mem(cpy|move)", k):
        c = "libc copies (the record layer's)"
    elif "tls_rec.c" in k:
        c = "record layer (net/tls_rec.c)"
    elif re.search(r"memcmp|rec_cost\.c", k):
        c = "harness (memcmp, main)"
    else:
        c = "other"
    cats[c] = cats.get(c, 0) + v
tot = sum(cats.values())
print(f"# instructions per 16 KiB record sealed and opened ({recs} records: {2 * mib} MiB run minus {mib} MiB)")
print("| part | instructions | share |")
print("|---|---|---|")
for c, v in sorted(cats.items(), key=lambda x: -x[1]):
    print(f"| {c} | {v:,.0f} | {100 * v / tot:.1f}% |")
print(f"| total | {tot:,.0f} | |")
PY
