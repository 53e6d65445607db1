/* The TLS connection type (Valkey's tls_connection): a struct conn with
 * the SSL object and the key-renewal state behind it, over a socket BIO
 * that batches ciphertext. Nothing outside this file and net/tls.c touches
 * an SSL; callers ask through the conn_type table. */
#include "net/tls_conn.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "net/tls.h"

struct tls_conn {
	struct conn c;            /* first: a struct conn * is a struct tls_conn * */
	SSL *ssl;
	/* the sending key is renewed every key_update_every bytes */
	uint64_t tx_bytes, key_update_at, key_update_every;
	_Atomic uint64_t *key_updates; /* counts renewals (may be NULL) */
};

static inline struct tls_conn *tc(struct conn *c)
{
	return (struct tls_conn *)c;
}

/* ---- the socket BIO under TLS ----
 * OpenSSL writes one record (at most 16 KiB plus 22 bytes) per BIO_write
 * and, with its own read-ahead, moves buffered bytes around on every
 * record. This BIO instead gathers written records and hands them to the
 * kernel in sends of at most SEND_MAX bytes, and reads the socket IBUF_CAP
 * bytes at a time.
 * SEND_MAX is measured, on loopback (bench link, interleaved): three
 * records per send beat one send() per record by ~10% both ways at once
 * (fewer syscalls and TCP pushes for a copy that stays in cache), while
 * four records (a send just over 64 KiB, the loopback MTU, so most likely
 * a full segment and a tiny one) cost 25-35%: which is why gathering 256
 * KiB was slower than sending each record straight from OpenSSL's
 * buffer, as this BIO did before. */

#define OBUF_CAP (512 * 1024)
#define SEND_MAX (64 * 1024)
#define IBUF_CAP (256 * 1024)

struct sbio {
	int fd;
	int err;                  /* errno of a failed background send */
	bool corrupt_next;        /* fault injection: flip a byte of the next record */
	uint8_t *obuf, *ibuf;
	size_t olen, ooff, ilen, ioff;
};

/* 1: all sent; 0: the socket is full; -1: error (errno). */
static int sbio_send(struct sbio *s)
{
	if (s->err) {
		errno = s->err;
		return -1;
	}
	while (s->ooff < s->olen) {
		/* what piled up while the socket was full goes SEND_MAX at a time */
		size_t k = s->olen - s->ooff < SEND_MAX ? s->olen - s->ooff : SEND_MAX;
		ssize_t n = send(s->fd, s->obuf + s->ooff, k, MSG_NOSIGNAL);
		if (n > 0) {
			s->ooff += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		s->err = n < 0 ? errno : EPIPE;
		errno = s->err;
		return -1;
	}
	s->olen = s->ooff = 0;
	return 1;
}

static int sbio_write(BIO *b, const char *data, int len)
{
	struct sbio *s = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	/* what is gathered goes first if this record would take the send
	 * past SEND_MAX; a failure here surfaces on the next write or flush */
	if (s->olen > s->ooff && s->olen - s->ooff + (size_t)len > SEND_MAX)
		sbio_send(s);
	if (s->olen + (size_t)len > OBUF_CAP) {
		int r = sbio_send(s);
		if (r < 0)
			return -1;
		if (r == 0 && s->ooff) {
			memmove(s->obuf, s->obuf + s->ooff, s->olen - s->ooff);
			s->olen -= s->ooff;
			s->ooff = 0;
		}
		if (s->olen + (size_t)len > OBUF_CAP) {
			BIO_set_retry_write(b);
			return -1;
		}
	}
	memcpy(s->obuf + s->olen, data, (size_t)len);
	if (s->corrupt_next && len > 5) {
		/* past the 5-byte record header: ciphertext or tag, which the
		 * peer's TLS must reject (bad record mac) */
		s->obuf[s->olen + 5 + (size_t)(len - 5) / 2] ^= 0x5a;
		s->corrupt_next = false;
	}
	s->olen += (size_t)len;
	return len;
}

static int sbio_read(BIO *b, char *out, int len)
{
	struct sbio *s = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	if (s->ioff == s->ilen) {
		ssize_t n;
		s->ioff = s->ilen = 0;
		do
			n = recv(s->fd, s->ibuf, IBUF_CAP, 0);
		while (n < 0 && errno == EINTR);
		if (n == 0)
			return 0;
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				BIO_set_retry_read(b);
			return -1;
		}
		s->ilen = (size_t)n;
	}
	size_t k = s->ilen - s->ioff;
	if (k > (size_t)len)
		k = (size_t)len;
	memcpy(out, s->ibuf + s->ioff, k);
	s->ioff += k;
	return (int)k;
}

static long sbio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	struct sbio *s = BIO_get_data(b);
	(void)num;
	(void)ptr;
	switch (cmd) {
	case BIO_CTRL_FLUSH: {
		BIO_clear_retry_flags(b);
		int r = sbio_send(s);
		if (r == 0)
			BIO_set_retry_write(b);
		return r > 0 ? 1 : r == 0 ? 0 : -1;
	}
	case BIO_CTRL_WPENDING:
		return (long)(s->olen - s->ooff);
	case BIO_CTRL_PENDING:
		return (long)(s->ilen - s->ioff);
	case BIO_CTRL_DUP:
		return 1;
	default:
		return 0;
	}
}

static int sbio_destroy(BIO *b)
{
	struct sbio *s = BIO_get_data(b);
	if (s) {
		free(s->obuf);
		free(s->ibuf);
		free(s);
		BIO_set_data(b, NULL);
	}
	return 1;
}

static BIO_METHOD *sbio_method;
static pthread_once_t sbio_once = PTHREAD_ONCE_INIT;

static void sbio_init(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
				     "meshrun socket");
	if (m && BIO_meth_set_write(m, sbio_write) && BIO_meth_set_read(m, sbio_read) &&
	    BIO_meth_set_ctrl(m, sbio_ctrl) && BIO_meth_set_destroy(m, sbio_destroy))
		sbio_method = m;
}

static BIO *sbio_new(int fd)
{
	pthread_once(&sbio_once, sbio_init);
	if (!sbio_method)
		return NULL;
	struct sbio *s = calloc(1, sizeof(*s));
	BIO *b = s ? BIO_new(sbio_method) : NULL;
	if (s) {
		s->fd = fd;
		s->obuf = malloc(OBUF_CAP);
		s->ibuf = malloc(IBUF_CAP);
	}
	if (!b || !s->obuf || !s->ibuf) {
		if (s) {
			free(s->obuf);
			free(s->ibuf);
			free(s);
		}
		BIO_free(b);
		return NULL;
	}
	BIO_set_data(b, s);
	BIO_set_init(b, 1);
	return b;
}

/* ---- TLS ---- */

/* A TLS failure about certificates: ours refused by the peer (its
 * alert), or the peer's failing our verification (ssl's result). */
static bool cert_failure(SSL *ssl, unsigned long e)
{
	if (SSL_get_verify_result(ssl) != X509_V_OK)
		return true;
	if (ERR_GET_LIB(e) != ERR_LIB_SSL)
		return false;
	switch (ERR_GET_REASON(e)) {
	case SSL_R_CERTIFICATE_VERIFY_FAILED:
	case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
	case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
	case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
	case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
	case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
		return true;
	default:
		return false;
	}
}

/* Maps an SSL_* return to the conn contract. */
static int tls_result(struct conn *c, int ret, const char *what)
{
	int e = SSL_get_error(tc(c)->ssl, ret);
	switch (e) {
	case SSL_ERROR_WANT_READ:
		c->want = CONN_WANT_READ;
		ERR_clear_error();
		return -EAGAIN;
	case SSL_ERROR_WANT_WRITE:
		c->want = CONN_WANT_WRITE;
		ERR_clear_error();
		return -EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		ERR_clear_error();
		return 0;
	case SSL_ERROR_SYSCALL:
		if (errno == EAGAIN || errno == EINTR) {
			c->want = CONN_WANT_READ;
			ERR_clear_error();
			return -EAGAIN;
		}
		if (errno) {
			int rc = -errno;
			snprintf(c->err, sizeof(c->err), "%s: %s", what, conn_strerror(errno));
			ERR_clear_error();
			return rc;
		}
		ERR_clear_error();
		return 0;
	default: {
		char why[200];
		/* about certificates: a class of its own (net/net.h NET_ERR_TLS) */
		bool cert = cert_failure(tc(c)->ssl, ERR_peek_error());
		tls_error_string(tc(c)->ssl, why, sizeof(why));
		ERR_clear_error();
		snprintf(c->err, sizeof(c->err), "%s: %s", what, why);
		return cert ? -EKEYREJECTED : -EPROTO;
	}
	}
}

static int tls_handshake(struct conn *c)
{
	ERR_clear_error();
	errno = 0;
	int ret = SSL_do_handshake(tc(c)->ssl);
	if (ret == 1) {
		c->want = CONN_WANT_NONE;
		return 0;
	}
	int rc = tls_result(c, ret, "tls handshake failed");
	if (rc == 0) {
		snprintf(c->err, sizeof(c->err), "tls handshake failed: connection closed by peer");
		return -ECONNRESET;
	}
	return rc;
}

/* The error queue is emptied after every failure (tls_result), so the hot
 * read and write paths need not clear it first. */
static ssize_t tls_read(struct conn *c, void *buf, size_t len)
{
	size_t n = 0;
	errno = 0;
	int ret = SSL_read_ex(tc(c)->ssl, buf, len, &n);
	if (ret == 1)
		return (ssize_t)n;
	return tls_result(c, ret, "tls read");
}

static ssize_t tls_write(struct conn *c, const void *buf, size_t len)
{
	size_t n = 0;
	errno = 0;
	int ret = SSL_write_ex(tc(c)->ssl, buf, len, &n);
	if (ret == 1) {
		struct tls_conn *t = tc(c);
		t->tx_bytes += n;
		/* the write is complete, as SSL_key_update wants; the
		 * KeyUpdate message goes out ahead of the next record */
		if (t->key_update_every && t->tx_bytes >= t->key_update_at) {
			if (SSL_key_update(t->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1) {
				snprintf(c->err, sizeof(c->err), "tls key update failed after %llu bytes",
					 (unsigned long long)t->tx_bytes);
				tls_error_string(t->ssl, c->err, sizeof(c->err));
				return -EPROTO;
			}
			t->key_update_at = t->tx_bytes + t->key_update_every;
			if (t->key_updates)
				atomic_fetch_add_explicit(t->key_updates, 1, memory_order_relaxed);
		}
		return (ssize_t)n;
	}
	int rc = tls_result(c, ret, "tls write");
	if (rc == 0) {
		snprintf(c->err, sizeof(c->err), "tls write: connection closed by peer");
		return -EPIPE;
	}
	return rc;
}

static int tls_flush(struct conn *c)
{
	BIO *b = SSL_get_wbio(tc(c)->ssl);
	errno = 0;
	long r = BIO_flush(b);
	if (r > 0)
		return 0;
	if (r == 0) {
		c->want = CONN_WANT_WRITE;
		return -EAGAIN;
	}
	int rc = errno ? -errno : -EIO;
	snprintf(c->err, sizeof(c->err), "tls write: %s", conn_strerror(-rc));
	return rc;
}

static bool tls_pending(struct conn *c)
{
	return SSL_has_pending(tc(c)->ssl) || BIO_ctrl_pending(SSL_get_rbio(tc(c)->ssl)) > 0;
}

static int tls_shutdown(struct conn *c)
{
	ERR_clear_error();
	errno = 0;
	int ret = SSL_shutdown(tc(c)->ssl);
	if (ret < 0) {
		int rc = tls_result(c, ret, "tls shutdown");
		if (rc == -EAGAIN)
			return rc;
		/* the peer is gone already: nothing left to say */
	}
	if (tls_flush(c) == -EAGAIN)
		return -EAGAIN;
	shutdown(c->fd, SHUT_WR);
	return 0;
}

static void tls_free(struct conn *c)
{
	SSL_free(tc(c)->ssl);
	if (c->fd >= 0)
		close(c->fd);
	free(tc(c));
}

static int tls_conn_peer_host(struct conn *c, char *err, size_t errlen)
{
	int id = tls_peer_host(tc(c)->ssl, err, errlen);
	return id < 0 ? -EACCES : id;
}

static void tls_set_key_update(struct conn *c, uint64_t bytes, _Atomic uint64_t *count)
{
	struct tls_conn *t = tc(c);
	t->key_update_every = bytes;
	t->key_update_at = t->tx_bytes + bytes;
	t->key_updates = count;
}

static const struct conn_type conn_type_tls = {
	.name = "tls",
	.handshake = tls_handshake,
	.read = tls_read,
	.write = tls_write,
	.flush = tls_flush,
	.pending = tls_pending,
	.shutdown = tls_shutdown,
	.peer_host = tls_conn_peer_host,
	.set_key_update = tls_set_key_update,
	.free = tls_free,
};

struct conn *tls_conn_new(SSL_CTX *ctx, int fd, bool server)
{
	struct tls_conn *t = calloc(1, sizeof(*t));
	if (!t) {
		close(fd);
		return NULL;
	}
	conn_init(&t->c, &conn_type_tls, fd);
	t->ssl = SSL_new(ctx);
	BIO *b = t->ssl ? sbio_new(fd) : NULL;
	if (!b) {
		conn_free(&t->c);
		return NULL;
	}
	SSL_set_bio(t->ssl, b, b);
	if (server)
		SSL_set_accept_state(t->ssl);
	else
		SSL_set_connect_state(t->ssl);
	return &t->c;
}

bool tls_conn_corrupt_next(struct conn *c)
{
	if (c->type != &conn_type_tls)
		return false;
	struct sbio *s = BIO_get_data(SSL_get_wbio(tc(c)->ssl));
	if (!s)
		return false;
	s->corrupt_next = true;
	return true;
}

SSL *tls_conn_ssl(struct conn *c)
{
	return c->type == &conn_type_tls ? tc(c)->ssl : NULL;
}
