/* The record layer alone (net/tls_rec.c), for counting what it costs per
 * byte outside the kernel: one process, two record layers with fixed
 * AES-128-GCM secrets over a socketpair, MiB mebibytes written in
 * CHUNK-byte writes (each pushed, as a message's last write is) and read
 * back in the same pieces into one posted buffer. Run it under
 * `valgrind --tool=callgrind` (instructions by function: the AES-GCM
 * kernels against the EVP calls around each record and the rest) or
 * `perf record`; bench/rec_cost.sh does both. Not a timed test.
 * SPAN > CHUNK walks the writes and reads through buffers of SPAN bytes
 * (a 16 MiB op's cold source and destination) instead of one hot chunk.
 * IMPL picks who seals and opens (net/aead.h: auto, ipsec-mb, openssl).
 * usage: rec_cost MIB [CHUNK] [SEND_BYTES] [SPAN] [IMPL]
 *        (defaults 64, 262144, 1 MiB, CHUNK, auto) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net/tls_rec.h"

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 64;
	size_t chunk = argc > 2 ? strtoull(argv[2], NULL, 0) : 262144;
	size_t sb = argc > 3 ? strtoull(argv[3], NULL, 0) : 0;
	size_t span = argc > 4 ? strtoull(argv[4], NULL, 0) : 0;
	enum aead_impl impl = AEAD_IMPL_AUTO;
	if (argc > 5 && aead_impl_parse(argv[5], &impl)) {
		fprintf(stderr, "rec_cost: IMPL is auto, ipsec-mb or openssl, not '%s'\n", argv[5]);
		return 2;
	}
	uint8_t a[32], b[32];
	char err[256];
	int sv[2];
	memset(a, 0x11, sizeof(a));
	memset(b, 0x22, sizeof(b));
	if (span < chunk)
		span = chunk;
	span -= span % chunk;
	if (!chunk || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		perror("rec_cost");
		return 2;
	}
	int big = 4 << 20;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	struct tls_rec *w = tls_rec_new(TLS_REC_AES_128_GCM_SHA256, impl, a, b, sb, err, sizeof(err));
	struct tls_rec *r = tls_rec_new(TLS_REC_AES_128_GCM_SHA256, impl, b, a, sb, err, sizeof(err));
	uint8_t *src0 = malloc(span), *dst0 = malloc(span);
	if (!w || !r || !src0 || !dst0) {
		fprintf(stderr, "rec_cost: %s\n", err);
		return 2;
	}
	for (size_t i = 0; i < span; i++)
		src0[i] = (uint8_t)(i * 131 + 7);
	memset(dst0, 0, span);
	struct conn cw = { .fd = sv[0] }, cr = { .fd = sv[1] };
	size_t total = mib << 20, done = 0;
	while (done < total) {
		uint8_t *src = src0 + done % span, *dst = dst0 + done % span;
		size_t off = 0;
		while (off < chunk) {
			cw.more = false;
			ssize_t k = tls_rec_write(w, &cw, src + off, chunk - off);
			if (k < 0) {
				fprintf(stderr, "rec_cost: write %zd %s\n", k, cw.err);
				return 1;
			}
			off += (size_t)k;
		}
		if (tls_rec_flush(w, &cw)) {
			fprintf(stderr, "rec_cost: flush %s\n", cw.err);
			return 1;
		}
		off = 0;
		while (off < chunk) {
			ssize_t k = tls_rec_read(r, &cr, dst + off, chunk - off);
			if (k <= 0) {
				fprintf(stderr, "rec_cost: read %zd %s\n", k, cr.err);
				return 1;
			}
			off += (size_t)k;
		}
		if (span == chunk && memcmp(src, dst, chunk)) {
			fprintf(stderr, "rec_cost: bytes differ\n");
			return 1;
		}
		done += chunk;
	}
	uint64_t tx, rx, tu, ru;
	tls_rec_counts(w, &tx, &rx, &tu, &ru);
	printf("rec_cost %zu MiB, %zu-byte writes: %llu records, sealed by %s\n", mib, chunk,
	       (unsigned long long)tx, tls_rec_cipher_impl(w));
	if (memcmp(src0, dst0, span < total ? span : total)) {
		fprintf(stderr, "rec_cost: bytes differ\n");
		return 1;
	}
	tls_rec_free(w);
	tls_rec_free(r);
	return 0;
}
