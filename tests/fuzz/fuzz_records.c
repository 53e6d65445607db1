/* (f) Our TLS 1.3 record reader (net/tls_rec.c, tls_rec_read) on bytes off
 * a socket. Byte 0: bits 0-1 pick the suite, bit 7 the mode; byte 1 seeds
 * the lengths the reader asks for (1 .. 20000). Raw mode: the rest goes to
 * the reader as it is. Built mode: the rest is a list of operations for
 * our writer with the peer's keys (the reader's receiving keys):
 *   0 hi lo   application data, (hi << 8 | lo) % 40000 bytes of a pattern
 *   1 r       a KeyUpdate (r & 1: asking for ours)
 *   2         close_notify (the list ends)
 *   3 n ...   n % 32 bytes as they are, between records
 *   4         the next record gets a ciphertext byte flipped
 * Properties: the reader returns at most what it was asked for, only
 * bytes of the application data written, in order (a prefix of it); an
 * error is a negative errno with one line; with no bytes inserted or
 * flipped, it returns all of it and then 0. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/tls_rec.h"
#include "tests/fuzz/fuzz.h"

#define MAX_WIRE (96 * 1024)    /* within a socketpair's buffer */

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + (i >> 8) * 3 + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	enum tls_rec_suite suite = (enum tls_rec_suite)((data[0] & 3) % 3);
	bool built = data[0] & 0x80;
	uint32_t rng = data[1] * 2654435761u + 1;
	uint8_t a[TLS_REC_SECRET_MAX], b[TLS_REC_SECRET_MAX];
	char err[256];
	memset(a, 0x11, sizeof(a));
	memset(b, 0x22, sizeof(b));
	/* the reader's peer sends under b and receives under a */
	struct tls_rec *rd = tls_rec_new(suite, AEAD_IMPL_AUTO, a, b, 0, err, sizeof(err));
	struct tls_rec *wr = tls_rec_new(suite, AEAD_IMPL_AUTO, b, a, 64 * 1024, err, sizeof(err));
	FUZZ_CHECK(rd && wr);
	int sv[2];
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	struct conn rc = { .fd = sv[0] }, wc = { .fd = sv[1] };

	uint8_t *expect = malloc(MAX_WIRE + 40000), *got = malloc(MAX_WIRE + 40000 + 20000);
	uint8_t *plain = malloc(40000);
	FUZZ_CHECK(expect && got && plain);
	size_t nexp = 0, wire = 0;
	bool tainted = false;
	if (!built) {
		size_t n = size - 2 < MAX_WIRE ? size - 2 : MAX_WIRE;
		FUZZ_CHECK(send(sv[1], data + 2, n, 0) == (ssize_t)n);
		tainted = true;
	} else {
		size_t i = 2;
		bool closed = false;
		while (i < size && !closed && wire < MAX_WIRE - 40000) {
			uint8_t op = data[i++] % 5;
			if (op == 0) {
				size_t n = 0;
				if (i + 1 < size)
					n = (((size_t)data[i] << 8) | data[i + 1]) % 40000;
				i += 2;
				for (size_t k = 0; k < n; k++)
					plain[k] = pattern(nexp + k);
				wc.more = false;
				for (size_t off = 0; off < n;) {
					ssize_t w = tls_rec_write(wr, &wc, plain + off, n - off);
					FUZZ_CHECK(w > 0);
					off += (size_t)w;
				}
				memcpy(expect + nexp, plain, n);
				nexp += n;
				wire += n + n / 16384 * TLS_REC_OVERHEAD + TLS_REC_OVERHEAD;
			} else if (op == 1) {
				bool req = i < size && (data[i] & 1);
				i++;
				FUZZ_CHECK(tls_rec_key_update(wr, &wc, req) == 0);
				wire += 32;
			} else if (op == 2) {
				FUZZ_CHECK(tls_rec_close(wr, &wc) == 0);
				closed = true;
			} else if (op == 3) {
				size_t n = i < size ? data[i] % 32 : 0;
				i++;
				if (n > size - i)
					n = size - i;
				FUZZ_CHECK(tls_rec_flush(wr, &wc) == 0);
				if (n) {
					FUZZ_CHECK(send(sv[1], data + i, n, 0) == (ssize_t)n);
					tainted = true;
				}
				i += n;
				wire += n;
			} else {
				tls_rec_corrupt_next(wr);
				tainted = true;
			}
		}
		FUZZ_CHECK(tls_rec_flush(wr, &wc) == 0);
	}
	shutdown(sv[1], SHUT_WR);

	size_t ngot = 0;
	ssize_t r;
	for (;;) {
		rng ^= rng << 13;
		rng ^= rng >> 17;
		rng ^= rng << 5;
		size_t want = 1 + rng % 20000;
		rc.err[0] = 0;
		r = tls_rec_read(rd, &rc, got + ngot, want);
		FUZZ_CHECK(r != -EAGAIN);
		if (r <= 0)
			break;
		FUZZ_CHECK((size_t)r <= want);
		ngot += (size_t)r;
		FUZZ_CHECK(ngot <= nexp);
	}
	FUZZ_CHECK(!memcmp(got, expect, ngot));
	if (r < 0) {
		FUZZ_CHECK(rc.err[0] && !strchr(rc.err, '\n'));
		FUZZ_CHECK(r == -EPROTO || r == -EKEYREJECTED);
	}
	if (!tainted)
		FUZZ_CHECK(r == 0 && ngot == nexp);
	close(sv[0]);
	close(sv[1]);
	tls_rec_free(rd);
	tls_rec_free(wr);
	free(expect);
	free(got);
	free(plain);
	return 0;
}
