/* Our TLS 1.3 record layer (net/tls_rec.h) stays TLS 1.3, in process over
 * a socketpair with the cluster's test certificates: OpenSSL does the
 * handshake on both ends, then one end's records are ours and the other's
 * OpenSSL's. Our writer -> OpenSSL's SSL_read gets the same bytes, and
 * OpenSSL's SSL_write -> our reader, for each of the three suites and
 * both our ciphers' implementations (net/aead.h: ipsec-mb's AES-GCM where
 * built, OpenSSL's), at record sizes 1, 16383, 16384, 16385 and ~1 MiB,
 * read in odd lengths; ours sealed by ipsec-mb to ours opened by OpenSSL
 * and back;
 * KeyUpdate both ways (OpenSSL's SSL_key_update asking for ours; ours
 * every few KiB, and ours asking for OpenSSL's; ours at the cap of
 * records per key; requests that arrive while our output buffer is full,
 * answered by the writer); close_notify both ways;
 * a flipped ciphertext byte, a replayed record and a record cut short at
 * EOF are errors that hand out no byte of the record; a client whose
 * certificate the server refuses after the client's handshake is done
 * hears the alert as a certificate failure; OpenSSL holding bytes past
 * its handshake is refused at the switch; with conn.push our writer's
 * first send() of a burst goes after push bytes, without it after its
 * send() size (an order of events, no clock). */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "net/conn.h"
#include "net/tls.h"
#include "net/tls_conn.h"
#include "net/tls_rec.h"

#include "tests/proc.h"

static const char *const suites[] = {
	"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
};
/* Who seals our records (net/aead.h) on the server's and the client's
 * side: tests that loop over suites x implementations set them. */
static enum aead_impl impl_s, impl_c;

/* Loop index i of a suites x implementations test: the suite, and auto
 * (ipsec-mb for AES-GCM where built) or OpenSSL on both ends. */
static const char *suite_impl(int i)
{
	impl_s = impl_c = i < 3 ? AEAD_IMPL_AUTO : AEAD_IMPL_OPENSSL;
	return suites[i % 3];
}

/* The implementation rec uses is the one asked for. */
static void check_impl(struct tls_rec *rec, enum aead_impl impl, const char *suite)
{
	const char *name = tls_rec_cipher_impl(rec);
	bool fast = impl != AEAD_IMPL_OPENSSL && aead_have_ipsec_mb() && !strstr(suite, "CHACHA");
	ck_assert_msg(!strncmp(name, fast ? "ipsec-mb" : "openssl", fast ? 8 : 7),
		      "%s: sealed by %s", suite, name);
}

static void setup(void)
{
	proc_setup("check_tlsrec", 2);
	impl_s = impl_c = AEAD_IMPL_AUTO;
	char dir[300], err[256];
	snprintf(dir, sizeof(dir), "%s/other", tmpdir);
	mkdir(dir, 0700);
	ck_assert_msg(tls_gen_certs(dir, 2, err, sizeof(err)) == 0, "%s", err);
}

struct pair {
	SSL_CTX *sctx, *cctx;
	struct conn *s, *c;       /* server (host 0), client (host 1) */
	int srs, crs;             /* handshake results */
};

static SSL_CTX *ctx_for(const char *dir, int host, const char *suite)
{
	char d[300], err[256];
	snprintf(d, sizeof(d), "%s/%s", tmpdir, dir);
	SSL_CTX *x = tls_ctx_new(d, host, err, sizeof(err));
	ck_assert_msg(x, "%s", err);
	if (suite)
		ck_assert_int_eq(SSL_CTX_set_ciphersuites(x, suite), 1);
	return x;
}

/* Both handshakes over a socketpair; own_s / own_c: whose records are
 * ours; our writers send() every send_bytes. */
static void pair_open_sb(struct pair *p, const char *suite, bool own_s, bool own_c,
			 size_t send_bytes)
{
	int sv[2];
	memset(p, 0, sizeof(*p));
	p->sctx = ctx_for("certs", 0, suite);
	p->cctx = ctx_for("certs", 1, suite);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	conn_set_nonblock(sv[0]);
	conn_set_nonblock(sv[1]);
	p->s = tls_conn_new(p->sctx, sv[0], true);
	p->c = tls_conn_new(p->cctx, sv[1], false);
	ck_assert(p->s && p->c);
	tls_conn_set_records(p->s, own_s, send_bytes, impl_s);
	tls_conn_set_records(p->c, own_c, send_bytes, impl_c);
	p->srs = p->crs = -EAGAIN;
	for (int i = 0; i < 1000 && (p->srs == -EAGAIN || p->crs == -EAGAIN); i++) {
		if (p->crs == -EAGAIN)
			p->crs = conn_handshake(p->c);
		if (p->srs == -EAGAIN)
			p->srs = conn_handshake(p->s);
	}
}

static void pair_open(struct pair *p, const char *suite, bool own_s, bool own_c)
{
	pair_open_sb(p, suite, own_s, own_c, 64 * 1024);
}

static void pair_close(struct pair *p)
{
	conn_free(p->s);
	conn_free(p->c);
	tls_ctx_free(p->sctx);
	tls_ctx_free(p->cctx);
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(i * 131 + seed + (i >> 9));
}

/* n bytes from w to r: w writes in pieces of at most wmax (more set
 * while more follows), r reads pieces of the lengths in rlens (cycled).
 * Returns the bytes r got (into got). */
static size_t pump(struct conn *w, struct conn *r, const uint8_t *msg, size_t n, size_t wmax,
		   const size_t *rlens, size_t nrl, uint8_t *got)
{
	size_t wo = 0, ro = 0, k = 0;
	for (int i = 0; i < 200000 && ro < n; i++) {
		if (wo < n) {
			size_t len = n - wo < wmax ? n - wo : wmax;
			w->more = wo + len < n;
			ssize_t m = conn_write(w, msg + wo, len);
			ck_assert_msg(m > 0 || m == -EAGAIN, "write: %zd %s", m, w->err);
			if (m > 0)
				wo += (size_t)m;
		}
		int f = conn_flush(w);
		ck_assert_msg(f == 0 || f == -EAGAIN, "flush: %d %s", f, w->err);
		size_t want = rlens[k % nrl];
		if (want > n - ro)
			want = n - ro;
		ssize_t m = conn_read(r, got + ro, want);
		ck_assert_msg(m > 0 || m == -EAGAIN, "read: %zd %s", m, r->err);
		if (m > 0) {
			ck_assert_uint_le((size_t)m, want);
			ro += (size_t)m;
			k++;
		}
	}
	return ro;
}

static const size_t sizes[] = { 1, 16383, 16384, 16385, (1u << 20) + 7 };
static const size_t odd_reads[] = { 1, 7, 16383, 5, 16385, 100003, 3 };
static const size_t whole_reads[] = { 1u << 21 };

/* Both directions between our records and OpenSSL's, for one suite and
 * one of our ciphers' implementations (the loop index), writes whole and
 * in odd pieces, reads whole and odd. */
START_TEST(test_same_bytes)
{
	const char *suite = suite_impl(_i);
	size_t maxn = sizes[sizeof(sizes) / sizeof(sizes[0]) - 1];
	uint8_t *msg = malloc(maxn), *got = malloc(maxn);
	ck_assert(msg && got);
	for (int dir = 0; dir < 2; dir++) {
		struct pair p;
		/* dir 0: ours writes (client), OpenSSL reads; dir 1: the reverse */
		pair_open(&p, suite, dir == 1, dir == 0);
		ck_assert_int_eq(p.crs, 0);
		ck_assert_int_eq(p.srs, 0);
		ck_assert_str_eq(SSL_CIPHER_get_name(SSL_get_current_cipher(tls_conn_ssl(p.c))), suite);
		struct conn *ours = dir == 0 ? p.c : p.s;
		struct conn *w = p.c, *r = p.s;
		ck_assert(tls_conn_own_records(ours));
		ck_assert(!tls_conn_own_records(dir == 0 ? p.s : p.c));
		check_impl(tls_conn_rec(ours), impl_s, suite);
		uint64_t tx0, rx0, u0, v0;
		tls_rec_counts(tls_conn_rec(ours), &tx0, &rx0, &u0, &v0);
		size_t records = 0;
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			size_t n = sizes[s];
			fill(msg, n, (unsigned)(s + 17 * dir + 5 * _i));
			memset(got, 0, n);
			bool odd = s % 2;
			size_t g = pump(w, r, msg, n, odd ? 9999 : n, odd ? odd_reads : whole_reads,
					odd ? sizeof(odd_reads) / sizeof(odd_reads[0]) : 1, got);
			ck_assert_uint_eq(g, n);
			ck_assert_msg(!memcmp(got, msg, n), "%s, %zu bytes, dir %d: bytes differ", suite, n,
				      dir);
			records += odd ? (n + 9998) / 9999 : (n + 16383) / 16384;
		}
		uint64_t tx, rx, u, v;
		tls_rec_counts(tls_conn_rec(ours), &tx, &rx, &u, &v);
		/* one record per 2^14 bytes of a write, no more */
		if (dir == 0)
			ck_assert_uint_eq(tx - tx0, records);
		else
			ck_assert_uint_eq(rx - rx0, records);
		ck_assert(!conn_pending(ours));
		pair_close(&p);
	}
	free(msg);
	free(got);
}
END_TEST

/* OpenSSL's KeyUpdate asking for ours, and ours every 20000 bytes and
 * ours asking for OpenSSL's: the data goes on arriving intact. */
START_TEST(test_key_update)
{
	struct pair p;
	uint8_t msg[300000], got[300000];
	const char *suite = suite_impl(_i);
	pair_open(&p, suite, true, false);           /* ours: the server */
	ck_assert_int_eq(p.crs, 0);
	ck_assert_int_eq(p.srs, 0);
	struct tls_rec *rec = tls_conn_rec(p.s);
	ck_assert_ptr_nonnull(rec);
	check_impl(rec, impl_s, suite);
	uint64_t tx, rx, u, v;

	/* OpenSSL -> ours, after SSL_key_update(requested) */
	ck_assert_int_eq(SSL_key_update(tls_conn_ssl(p.c), SSL_KEY_UPDATE_REQUESTED), 1);
	fill(msg, sizeof(msg), 1);
	ck_assert_uint_eq(pump(p.c, p.s, msg, sizeof(msg), 50000, odd_reads, 7, got), sizeof(msg));
	ck_assert(!memcmp(got, msg, sizeof(msg)));
	tls_rec_counts(rec, &tx, &rx, &u, &v);
	ck_assert_uint_eq(v, 1);       /* we took the peer's new key */
	ck_assert_uint_eq(u, 1);       /* and answered with ours */
	/* ours -> OpenSSL under our renewed key, renewed every 20000 bytes */
	_Atomic uint64_t count = 0;
	conn_set_key_update(p.s, 20000, &count);
	fill(msg, sizeof(msg), 2);
	ck_assert_uint_eq(pump(p.s, p.c, msg, sizeof(msg), 16384, odd_reads, 7, got), sizeof(msg));
	ck_assert(!memcmp(got, msg, sizeof(msg)));
	/* a renewal once a write takes the total past the next 20000 */
	ck_assert_uint_ge(atomic_load(&count), sizeof(msg) / (20000 + 16384));
	ck_assert_uint_le(atomic_load(&count), sizeof(msg) / 20000);
	tls_rec_counts(rec, &tx, &rx, &u, &v);
	ck_assert_uint_eq(u, 1 + atomic_load(&count));
	/* ours asking for OpenSSL's: its next records come under its new key */
	conn_set_key_update(p.s, 0, NULL);
	ck_assert_int_eq(tls_rec_key_update(rec, p.s, true), 0);
	ck_assert_int_eq(conn_flush(p.s), 0);
	ck_assert_uint_eq(pump(p.s, p.c, msg, 10, 10, odd_reads, 1, got), 10);
	fill(msg, sizeof(msg), 3);
	ck_assert_uint_eq(pump(p.c, p.s, msg, sizeof(msg), 70000, whole_reads, 1, got), sizeof(msg));
	ck_assert(!memcmp(got, msg, sizeof(msg)));
	tls_rec_counts(rec, &tx, &rx, &u, &v);
	ck_assert_uint_eq(v, 2);
	pair_close(&p);
}
END_TEST

static ssize_t read_until(struct conn *c, uint8_t *buf, size_t len)
{
	ssize_t n = -EAGAIN;
	for (int i = 0; i < 100 && n == -EAGAIN; i++)
		n = conn_read(c, buf, len);
	return n;
}

/* KeyUpdate requests that arrive while our output buffer is full: the
 * reader answers the first in the room kept for control records and
 * leaves the next owed; the writer sends it before its next record. The
 * peer reads everything under the right keys. */
START_TEST(test_key_update_owed)
{
	struct pair p;
	static uint8_t msg[4 << 20], got[4 << 20];
	pair_open(&p, NULL, false, true);     /* ours: the client */
	struct tls_rec *rec = tls_conn_rec(p.c);
	ck_assert_ptr_nonnull(rec);
	fill(msg, sizeof(msg), 7);
	/* fill the socket and our output buffer: nobody reads */
	size_t w = 0;
	ssize_t n;
	p.c->more = true;
	while (w < sizeof(msg) && (n = conn_write(p.c, msg + w, sizeof(msg) - w)) > 0)
		w += (size_t)n;
	ck_assert_int_eq(n, -EAGAIN);
	/* and to the last bytes: byte-sized records until no room is left
	 * but what is kept for control records */
	while (w < sizeof(msg) && (n = conn_write(p.c, msg + w, 1)) > 0)
		w += (size_t)n;
	ck_assert_int_eq(n, -EAGAIN);
	ck_assert_uint_lt(w, sizeof(msg));
	/* three requests from OpenSSL, each with a record behind it */
	SSL *ssl = tls_conn_ssl(p.s);
	uint8_t small[30];
	for (int i = 0; i < 3; i++) {
		size_t k = 0;
		ck_assert_int_eq(SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED), 1);
		ck_assert_int_eq(SSL_write_ex(ssl, "abcdefghij", 10, &k), 1);
	}
	size_t r = 0;
	while (r < 30 && (n = read_until(p.c, small + r, sizeof(small) - r)) > 0)
		r += (size_t)n;
	ck_assert_uint_eq(r, 30);
	ck_assert(!memcmp(small + 20, "abcdefghij", 10));
	uint64_t tx, rx, u, v;
	tls_rec_counts(rec, &tx, &rx, &u, &v);
	ck_assert_uint_eq(v, 3);          /* three new read keys */
	ck_assert_uint_eq(u, 1);          /* one answer now, one owed */
	/* the peer reads; we write the rest (the owed answer goes first) */
	size_t g = 0;
	for (int i = 0; i < 100000 && g < sizeof(msg); i++) {
		if (w < sizeof(msg)) {
			p.c->more = false;
			n = conn_write(p.c, msg + w, sizeof(msg) - w);
			ck_assert_msg(n > 0 || n == -EAGAIN, "%s", p.c->err);
			if (n > 0)
				w += (size_t)n;
		}
		ck_assert_int_ne(conn_flush(p.c), -EPROTO);
		n = conn_read(p.s, got + g, sizeof(got) - g);
		ck_assert_msg(n > 0 || n == -EAGAIN, "%s", p.s->err);
		if (n > 0)
			g += (size_t)n;
	}
	ck_assert_uint_eq(g, sizeof(msg));
	ck_assert(!memcmp(got, msg, sizeof(msg)));
	tls_rec_counts(rec, &tx, &rx, &u, &v);
	ck_assert_uint_eq(u, 2);
	pair_close(&p);
}
END_TEST

/* 1 MiB written in 16 KiB pieces, more following each, by our writer
 * whose send() size is 1 MiB, with conn.push = push (0: none): returns
 * the bytes sealed when the first byte reached the peer's socket (an
 * order of events: the peer could have opened a record before the last
 * was sealed), after the peer read them all intact. */
static size_t sealed_at_first_byte(size_t push)
{
	enum { TOTAL = 1 << 20, PIECE = 16384 };
	static uint8_t msg[TOTAL], got[TOTAL];
	struct pair p;
	pair_open_sb(&p, NULL, false, true, TOTAL);      /* ours: the client */
	ck_assert_int_eq(p.crs, 0);
	ck_assert_int_eq(p.srs, 0);
	fill(msg, TOTAL, (unsigned)push);
	size_t w = 0, g = 0, first = 0;
	for (int i = 0; i < 200000 && g < TOTAL; i++) {
		if (w < TOTAL) {
			p.c->more = w + PIECE < TOTAL;
			p.c->push = push;
			ssize_t n = conn_write(p.c, msg + w, PIECE);
			ck_assert_msg(n > 0 || n == -EAGAIN, "write: %zd %s", n, p.c->err);
			if (n > 0)
				w += (size_t)n;
		} else {
			ck_assert_int_ne(conn_flush(p.c), -EPROTO);
		}
		int queued = 0;
		ck_assert_int_eq(ioctl(p.s->fd, FIONREAD, &queued), 0);
		if (queued > 0 && !first)
			first = w;
		if (!first)
			continue;
		ssize_t n = conn_read(p.s, got + g, TOTAL - g);
		ck_assert_msg(n > 0 || n == -EAGAIN, "read: %zd %s", n, p.s->err);
		if (n > 0)
			g += (size_t)n;
	}
	ck_assert_uint_eq(g, TOTAL);
	ck_assert(!memcmp(got, msg, TOTAL));
	pair_close(&p);
	return first;
}

/* conn.push (a point-to-point message's, net/send.c): with it our writer
 * sends once push bytes wait, without it only at its send() size or the
 * end of the burst; the peer reads the same bytes either way. */
START_TEST(test_push)
{
	size_t at = sealed_at_first_byte(256 * 1024);
	ck_assert_uint_ge(at, 256 * 1024);
	ck_assert_uint_le(at, 256 * 1024 + 16384);
	at = sealed_at_first_byte(64 * 1024);
	ck_assert_uint_ge(at, 64 * 1024);
	ck_assert_uint_le(at, 64 * 1024 + 16384);
	ck_assert_uint_eq(sealed_at_first_byte(0), 1 << 20);
}
END_TEST

/* The cap of records per sending key (RFC 8446 5.5; 2^24, here 3): our
 * writer renews its key before the 4th, 7th and 10th record, and OpenSSL
 * reads all ten. */
START_TEST(test_record_cap)
{
	struct pair p;
	uint8_t msg[10 * 100], got[10 * 100];
	pair_open(&p, NULL, false, true);
	struct tls_rec *rec = tls_conn_rec(p.c);
	ck_assert_ptr_nonnull(rec);
	tls_rec_set_record_cap(rec, 3);
	fill(msg, sizeof(msg), 6);
	/* one record a write of 100 bytes */
	ck_assert_uint_eq(pump(p.c, p.s, msg, sizeof(msg), 100, whole_reads, 1, got), sizeof(msg));
	ck_assert(!memcmp(got, msg, sizeof(msg)));
	uint64_t tx, rx, u, v;
	tls_rec_counts(rec, &tx, &rx, &u, &v);
	ck_assert_uint_eq(u, 3);
	ck_assert_uint_eq(tx, 10 + 3);     /* ten records and three KeyUpdates */
	pair_close(&p);
}
END_TEST

/* close_notify both ways: the bytes before it arrive, then read says 0. */
START_TEST(test_close_notify)
{
	uint8_t msg[5000], got[5000];
	fill(msg, sizeof(msg), 4);
	for (int dir = 0; dir < 2; dir++) {
		struct pair p;
		pair_open(&p, NULL, dir == 0, dir == 1);
		ck_assert_int_eq(p.crs, 0);
		ck_assert_int_eq(p.srs, 0);
		/* dir 0: ours (server) closes towards OpenSSL; dir 1: OpenSSL's
		 * server closes towards ours */
		ck_assert_uint_eq(pump(p.s, p.c, msg, sizeof(msg), 3000, whole_reads, 1, got),
				  sizeof(msg));
		ck_assert_int_eq(conn_write(p.s, msg, 100), 100);
		int rc = -EAGAIN;
		for (int i = 0; i < 100 && rc == -EAGAIN; i++)
			rc = conn_shutdown(p.s);
		ck_assert_int_eq(rc, 0);
		ssize_t n = -EAGAIN;
		for (int i = 0; i < 100 && n == -EAGAIN; i++)
			n = conn_read(p.c, got, sizeof(got));
		ck_assert_int_eq(n, 100);
		ck_assert(!memcmp(got, msg, 100));
		n = conn_read(p.c, got, sizeof(got));
		ck_assert_int_eq(n, 0);
		if (dir == 0) {
			/* and ours writes nothing after its close_notify */
			ck_assert_int_lt(conn_write(p.s, msg, 1), 0);
		}
		pair_close(&p);
	}
}
END_TEST

/* OpenSSL's records of msg, n bytes, as they would go on the wire (its
 * write BIO swapped for memory); *len their length. */
static char *openssl_records(SSL *ssl, const uint8_t *msg, size_t n, long *len)
{
	BIO *mem = BIO_new(BIO_s_mem());
	ck_assert_ptr_nonnull(mem);
	BIO *old = SSL_get_wbio(ssl);
	BIO_up_ref(old);
	SSL_set0_wbio(ssl, mem);
	for (size_t off = 0, w = 0; off < n; off += w)
		ck_assert_int_eq(SSL_write_ex(ssl, msg + off, n - off, &w), 1);
	char *data;
	*len = BIO_get_mem_data(mem, &data);
	char *copy = malloc((size_t)*len);
	memcpy(copy, data, (size_t)*len);
	SSL_set0_wbio(ssl, old);
	return copy;
}

/* A flipped ciphertext byte, a replayed record, a record cut short at EOF:
 * our reader fails with one line and hands out no byte of that record;
 * and OpenSSL rejects a record of ours the fault point flipped. */
START_TEST(test_bad_records)
{
	uint8_t msg[40000], got[40000];
	fill(msg, sizeof(msg), 5);
	for (int kind = 0; kind < 3; kind++) {
		struct pair p;
		pair_open(&p, NULL, true, false);      /* ours reads (server) */
		ck_assert_int_eq(p.crs, 0);
		ck_assert_int_eq(p.srs, 0);
		long len;
		/* three records: 16384, 16384, 7232 bytes */
		char *wire = openssl_records(tls_conn_ssl(p.c), msg, sizeof(msg), &len);
		size_t rec1 = 5 + 16384 + 17;
		ck_assert_int_eq(len, 2 * rec1 + 5 + 7232 + 17);
		int fd = p.c->fd;
		memset(got, 0, sizeof(got));
		if (kind == 0) {
			/* the second record's ciphertext flipped */
			wire[rec1 + 5 + 1000] ^= 1;
			ck_assert_int_eq(send(fd, wire, (size_t)len, 0), len);
		} else if (kind == 1) {
			/* the first record, then the first again */
			ck_assert_int_eq(send(fd, wire, rec1, 0), (ssize_t)rec1);
			ck_assert_int_eq(send(fd, wire, rec1, 0), (ssize_t)rec1);
		} else {
			/* the first record and half the second, then EOF */
			ck_assert_int_eq(send(fd, wire, rec1 + rec1 / 2, 0), (ssize_t)(rec1 + rec1 / 2));
			shutdown(fd, SHUT_WR);
		}
		/* the first record arrives whole, the second never */
		size_t g = 0;
		ssize_t n;
		while ((n = read_until(p.s, got + g, sizeof(got) - g)) > 0)
			g += (size_t)n;
		ck_assert_uint_eq(g, 16384);
		ck_assert(!memcmp(got, msg, 16384));
		ck_assert_int_eq(n, -EPROTO);
		ck_assert_msg(strstr(p.s->err, kind == 2 ? "closed in the middle of a record"
					 : "bad record mac (record 1 from "), "%s", p.s->err);
		ck_assert_ptr_null(strchr(p.s->err, '\n'));
		/* and it stays failed */
		ck_assert_int_eq(conn_read(p.s, got, 10), -EPROTO);
		free(wire);
		pair_close(&p);
	}
	/* ours flipped by the fault point: OpenSSL refuses it */
	struct pair p;
	pair_open(&p, NULL, false, true);
	ck_assert(tls_conn_corrupt_next(p.c));
	ck_assert_int_eq(conn_write(p.c, msg, 1000), 1000);
	ck_assert_int_eq(conn_flush(p.c), 0);
	ssize_t n = read_until(p.s, got, sizeof(got));
	ck_assert_int_eq(n, -EPROTO);
	ck_assert_msg(strstr(p.s->err, "bad record mac"), "%s", p.s->err);
	pair_close(&p);
}
END_TEST

/* TLS 1.3 checks the client's certificate after the client's handshake is
 * done: the server's refusal reaches our reader as an alert, a
 * certificate failure (-EKEYREJECTED) naming it. */
START_TEST(test_refused_after_handshake)
{
	int sv[2];
	char ca[300];
	SSL_CTX *sctx = ctx_for("certs", 0, NULL);
	SSL_CTX *cctx = ctx_for("other", 1, NULL);   /* another CA's certificate */
	snprintf(ca, sizeof(ca), "%s/certs/ca.pem", tmpdir);
	ck_assert_int_eq(SSL_CTX_load_verify_locations(cctx, ca, NULL), 1);  /* trusts ours */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	conn_set_nonblock(sv[0]);
	conn_set_nonblock(sv[1]);
	struct conn *s = tls_conn_new(sctx, sv[0], true), *c = tls_conn_new(cctx, sv[1], false);
	tls_conn_set_records(c, true, 0, AEAD_IMPL_AUTO);
	int crs = -EAGAIN, srs = -EAGAIN;
	for (int i = 0; i < 1000 && (srs == -EAGAIN || crs == -EAGAIN); i++) {
		if (crs == -EAGAIN)
			crs = conn_handshake(c);
		if (srs == -EAGAIN)
			srs = conn_handshake(s);
	}
	ck_assert_int_eq(crs, 0);                 /* the client is done */
	ck_assert(tls_conn_own_records(c));
	ck_assert_int_eq(srs, -EKEYREJECTED);     /* the server refused it */
	uint8_t b[100];
	ssize_t n = read_until(c, b, sizeof(b));
	ck_assert_int_eq(n, -EKEYREJECTED);
	ck_assert_msg(strstr(c->err, "peer sent alert unknown ca (48)"), "%s", c->err);
	conn_free(s);
	conn_free(c);
	tls_ctx_free(sctx);
	tls_ctx_free(cctx);
}
END_TEST

/* OpenSSL with read-ahead (as if it had been left on) takes the client's
 * first record with the client's Finished: the switch refuses. */
START_TEST(test_switch_refuses_unread)
{
	int sv[2];
	SSL_CTX *sctx = ctx_for("certs", 0, NULL), *cctx = ctx_for("certs", 1, NULL);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	conn_set_nonblock(sv[0]);
	conn_set_nonblock(sv[1]);
	struct conn *s = tls_conn_new(sctx, sv[0], true), *c = tls_conn_new(cctx, sv[1], false);
	tls_conn_set_records(s, true, 0, AEAD_IMPL_AUTO);
	tls_conn_set_records(c, true, 0, AEAD_IMPL_AUTO);
	SSL_set_read_ahead(tls_conn_ssl(s), 1);
	int crs = -EAGAIN, srs = -EAGAIN;
	for (int i = 0; i < 1000 && crs == -EAGAIN; i++) {
		crs = conn_handshake(c);
		if (crs == -EAGAIN)
			srs = conn_handshake(s);
	}
	ck_assert_int_eq(crs, 0);
	ck_assert_int_eq(conn_write(c, "early", 5), 5);
	ck_assert_int_eq(conn_flush(c), 0);
	for (int i = 0; i < 1000 && srs == -EAGAIN; i++)
		srs = conn_handshake(s);
	ck_assert_int_eq(srs, -EPROTO);
	ck_assert_msg(strstr(s->err, "openssl holds unread bytes"), "%s", s->err);
	conn_free(s);
	conn_free(c);
	tls_ctx_free(sctx);
	tls_ctx_free(cctx);
}
END_TEST

/* Our records on both ends, sealed by ipsec-mb on one and OpenSSL on the
 * other (AES-128-GCM, AES-256-GCM: the loop index), both ways, with
 * KeyUpdates each way: the two implementations are one cipher. */
START_TEST(test_across_impls)
{
	if (!aead_have_ipsec_mb())
		return;        /* one implementation: nothing to cross */
	struct pair p;
	static uint8_t msg[200000], got[200000];
	impl_s = AEAD_IMPL_IPSEC_MB;
	impl_c = AEAD_IMPL_OPENSSL;
	pair_open(&p, suites[_i], true, true);
	ck_assert_int_eq(p.crs, 0);
	ck_assert_int_eq(p.srs, 0);
	check_impl(tls_conn_rec(p.s), impl_s, suites[_i]);
	check_impl(tls_conn_rec(p.c), impl_c, suites[_i]);
	_Atomic uint64_t ns = 0, nc = 0;
	conn_set_key_update(p.s, 30000, &ns);
	conn_set_key_update(p.c, 45000, &nc);
	for (int round = 0; round < 2; round++) {
		fill(msg, sizeof(msg), (unsigned)(round + 3 * _i));
		ck_assert_uint_eq(pump(p.s, p.c, msg, sizeof(msg), 20001, odd_reads, 7, got),
				  sizeof(msg));
		ck_assert(!memcmp(got, msg, sizeof(msg)));
		fill(msg, sizeof(msg), (unsigned)(round + 3 * _i + 100));
		ck_assert_uint_eq(pump(p.c, p.s, msg, sizeof(msg), 16385, odd_reads, 7, got),
				  sizeof(msg));
		ck_assert(!memcmp(got, msg, sizeof(msg)));
	}
	ck_assert_uint_ge(atomic_load(&ns), 2);
	ck_assert_uint_ge(atomic_load(&nc), 2);
	pair_close(&p);
}
END_TEST

static Suite *tlsrec_suite(void)
{
	Suite *s = suite_create("tlsrec");
	TCase *tc = tcase_create("records");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_same_bytes, 0, 6);
	tcase_add_loop_test(tc, test_key_update, 0, 6);
	tcase_add_loop_test(tc, test_across_impls, 0, 2);
	tcase_add_test(tc, test_key_update_owed);
	tcase_add_test(tc, test_record_cap);
	tcase_add_test(tc, test_push);
	tcase_add_test(tc, test_close_notify);
	tcase_add_test(tc, test_bad_records);
	tcase_add_test(tc, test_refused_after_handshake);
	tcase_add_test(tc, test_switch_refuses_unread);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	SRunner *sr = srunner_create(tlsrec_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
