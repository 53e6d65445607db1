/* The TLS connection type (Valkey's tls_connection): a struct conn with
 * the SSL object and the key-renewal state behind it, over a socket BIO
 * that hands OpenSSL the socket (no buffer of ours in between). OpenSSL
 * does the handshake; after it, with records of our own
 * (tls_conn_set_records), the traffic secrets its key log reported go to
 * net/tls_rec.c, which writes and reads the records from then on, and
 * the SSL only answers questions (the peer's certificate, the suite).
 * Nothing outside this file and net/tls.c touches an SSL; callers ask
 * through the conn_type table. */
#include "net/tls_conn.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "net/tls.h"
#include "net/tls_rec.h"

struct tls_conn {
	struct conn c;            /* first: a struct conn * is a struct tls_conn * */
	SSL *ssl;
	/* records of our own after the handshake (tls_conn_set_records):
	 * rec is set at the switch, and from then on OpenSSL's SSL only
	 * answers questions (the peer's certificate, the suite) */
	bool own;
	size_t send_bytes;
	enum aead_impl cipher;
	struct tls_rec *rec;
	/* the application traffic secrets OpenSSL's key log reported
	 * (net/tls_rec.c's callback, set where the context is made),
	 * until the switch takes them (then wiped) */
	struct tls_rec_secrets sec;
	/* the sending key is renewed every key_update_every bytes */
	uint64_t tx_bytes, key_update_at, key_update_every;
	_Atomic uint64_t *key_updates; /* counts renewals (may be NULL) */
};

static inline struct tls_conn *tc(struct conn *c)
{
	return (struct tls_conn *)c;
}

/* ---- the socket BIO under TLS ----
 * OpenSSL reads and writes the socket itself, through this BIO, with no
 * buffer of ours in between: a written record goes to send() straight from
 * OpenSSL's write buffer, and a read lands in OpenSSL's read buffer: with
 * read-ahead at its default size (one record and a little more), one
 * recv() brings a whole record and its header, and the part of the next
 * record that came with it is moved to the buffer's start. That move is
 * why the buffer is no larger: OpenSSL 3.0 moves everything left in the
 * buffer to its start before each record, so a 256 KiB buffer (16 records
 * a recv) moved about 8 bytes a byte received, more than the cipher cost
 * (bench/README.md, "where the CPU of a 16 MiB all_gather goes").
 * A record goes with MSG_MORE while the writer says more bytes follow at
 * once (struct conn.more), so the kernel builds full-size segments instead
 * of one per 16 KiB record; the last record of a burst goes without it and
 * pushes them, and conn_flush pushes what an interrupted burst left held.
 * That is what the ciphertext-gathering buffer this BIO kept before
 * bought, at the price of a copy per byte each way (bench/README.md). */

struct sbio {
	int fd;
	const bool *more;         /* the connection's hint (struct conn.more) */
	bool *drained;            /* struct conn.drained, set by each recv() */
	bool corrupt_next;        /* fault injection: flip a byte of the next record */
	bool corked;              /* the last record went with MSG_MORE */
};

static int sbio_write(BIO *b, const char *data, int len)
{
	struct sbio *s = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	if (s->corrupt_next && len > 5) {
		/* past the 5-byte record header: ciphertext or tag, which the
		 * peer's TLS must reject (bad record mac). The record is
		 * OpenSSL's write buffer, and a partial send resends the rest
		 * from there, so the flipped byte goes out whatever happens */
		((char *)data)[5 + (len - 5) / 2] ^= 0x5a;
		s->corrupt_next = false;
	}
	/* held back while the writer says more follows: the last record of
	 * a burst goes without MSG_MORE and pushes the rest */
	bool more = *s->more;
	for (;;) {
		ssize_t n = send(s->fd, data, (size_t)len, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
		if (n > 0) {
			s->corked = more;
			return (int)n;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			BIO_set_retry_write(b);
		return -1;
	}
}

static int sbio_read(BIO *b, char *out, int len)
{
	struct sbio *s = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	ssize_t n;
	do
		n = recv(s->fd, out, (size_t)len, 0);
	while (n < 0 && errno == EINTR);
	/* OpenSSL asks for its buffer's free space (read-ahead): less means
	 * the socket is empty for now */
	if (n > 0)
		*s->drained = n < len;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		BIO_set_retry_read(b);
	return n < 0 ? -1 : (int)n;
}

static long sbio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	struct sbio *s = BIO_get_data(b);
	(void)num;
	(void)ptr;
	switch (cmd) {
	case BIO_CTRL_FLUSH:
		BIO_clear_retry_flags(b);
		if (s->corked) {
			/* setting TCP_NODELAY pushes what MSG_MORE held back */
			int one = 1;
			setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			s->corked = false;
		}
		return 1;
	case BIO_CTRL_DUP:
		return 1;
	default:
		return 0;
	}
}

static int sbio_destroy(BIO *b)
{
	free(BIO_get_data(b));
	BIO_set_data(b, NULL);
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

static BIO *sbio_new(int fd, const bool *more, bool *drained)
{
	pthread_once(&sbio_once, sbio_init);
	if (!sbio_method)
		return NULL;
	struct sbio *s = calloc(1, sizeof(*s));
	BIO *b = s ? BIO_new(sbio_method) : NULL;
	if (!b) {
		free(s);
		return NULL;
	}
	s->fd = fd;
	s->more = more;
	s->drained = drained;
	BIO_set_data(b, s);
	BIO_set_init(b, 1);
	return b;
}

/* ---- the switch to records of our own (net/tls_rec.h) ---- */

/* After OpenSSL's handshake: the connection's records are ours from here
 * (both directions at sequence number 0: no tickets, net/tls.c). OpenSSL
 * read with read-ahead off, so it holds no byte past its handshake; if it
 * did, those bytes would be lost to us, so that is refused. */
static int tls_switch(struct conn *c)
{
	struct tls_conn *t = tc(c);
	int rc = 0;
	const SSL_CIPHER *ciph = SSL_get_current_cipher(t->ssl);
	int suite = ciph ? tls_rec_suite_of(SSL_CIPHER_get_protocol_id(ciph)) : -1;
	if (SSL_has_pending(t->ssl) || SSL_pending(t->ssl)) {
		snprintf(c->err, sizeof(c->err),
			 "tls: openssl holds unread bytes from %s at the switch to our records",
			 c->peer_addr[0] ? c->peer_addr : "the peer");
		rc = -EPROTO;
	} else if (suite < 0) {
		snprintf(c->err, sizeof(c->err), "tls: suite %s with %s is not one our records know",
			 ciph ? SSL_CIPHER_get_name(ciph) : "(none)",
			 c->peer_addr[0] ? c->peer_addr : "the peer");
		rc = -EPROTO;
	} else if (t->sec.len[0] != tls_rec_secret_len(suite) ||
		   t->sec.len[1] != tls_rec_secret_len(suite)) {
		snprintf(c->err, sizeof(c->err),
			 "tls: openssl reported no traffic secrets for %s (a context not made by tls_ctx_new?)",
			 c->peer_addr[0] ? c->peer_addr : "the peer");
		rc = -EPROTO;
	} else {
		int us = SSL_is_server(t->ssl) ? 1 : 0;
		t->rec = tls_rec_new(suite, t->cipher, t->sec.secret[us], t->sec.secret[!us],
				     t->send_bytes, c->err, sizeof(c->err));
		if (!t->rec)
			rc = -EPROTO;
		else
			tls_rec_set_key_update(t->rec, t->key_update_every, t->key_updates);
	}
	OPENSSL_cleanse(&t->sec, sizeof(t->sec));
	return rc;
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
	if (tc(c)->rec)
		return 0;
	int ret = SSL_do_handshake(tc(c)->ssl);
	if (ret == 1) {
		c->want = CONN_WANT_NONE;
		return tc(c)->own ? tls_switch(c) : 0;
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
	if (tc(c)->rec)
		return tls_rec_read(tc(c)->rec, c, buf, len);
	size_t n = 0;
	errno = 0;
	c->drained = false;     /* until this read's recv(), if any, says so */
	int ret = SSL_read_ex(tc(c)->ssl, buf, len, &n);
	if (ret == 1)
		return (ssize_t)n;
	return tls_result(c, ret, "tls read");
}

static ssize_t tls_write(struct conn *c, const void *buf, size_t len)
{
	if (tc(c)->rec)
		return tls_rec_write(tc(c)->rec, c, buf, len);
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
	if (tc(c)->rec)
		return tls_rec_flush(tc(c)->rec, c);
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
	if (tc(c)->rec)
		return tls_rec_pending(tc(c)->rec);
	/* with read-ahead, bytes read off the socket but not yet decrypted */
	return SSL_has_pending(tc(c)->ssl);
}

static int tls_shutdown(struct conn *c)
{
	if (tc(c)->rec) {
		int rc = tls_rec_close(tc(c)->rec, c);
		if (rc == -EAGAIN)
			return rc;
		/* an error: the peer is gone already, nothing left to say */
		shutdown(c->fd, SHUT_WR);
		return 0;
	}
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
	tls_rec_free(tc(c)->rec);
	OPENSSL_cleanse(&tc(c)->sec, sizeof(tc(c)->sec));
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
	if (t->rec)
		tls_rec_set_key_update(t->rec, bytes, count);
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
	BIO *b = t->ssl ? sbio_new(fd, &t->c.more, &t->c.drained) : NULL;
	if (!b) {
		conn_free(&t->c);
		return NULL;
	}
	SSL_set_bio(t->ssl, b, b);
	SSL_set_app_data(t->ssl, t);
	/* OpenSSL reads the socket a record and a bit at a time: one recv()
	 * a record, not two (header, body), and no big buffer to move */
	SSL_set_read_ahead(t->ssl, 1);
	if (server)
		SSL_set_accept_state(t->ssl);
	else
		SSL_set_connect_state(t->ssl);
	return &t->c;
}

void tls_conn_set_records(struct conn *c, bool own, size_t send_bytes, enum aead_impl cipher)
{
	struct tls_conn *t = tc(c);
	if (c->type != &conn_type_tls || t->rec)
		return;
	t->own = own;
	t->send_bytes = send_bytes;
	t->cipher = cipher;
	/* ours: OpenSSL must not read past its handshake (a header, then
	 * exactly a body); the context's key log (tls_ctx_new) hands us the
	 * traffic secrets */
	SSL_set_read_ahead(t->ssl, own ? 0 : 1);
	tls_rec_secrets_attach(t->ssl, own ? &t->sec : NULL);
}

bool tls_conn_own_records(struct conn *c)
{
	return c->type == &conn_type_tls && tc(c)->rec;
}

struct tls_rec *tls_conn_rec(struct conn *c)
{
	return c->type == &conn_type_tls ? tc(c)->rec : NULL;
}

void tls_conn_describe(struct conn *c, char *buf, size_t len)
{
	if (c->type != &conn_type_tls) {
		snprintf(buf, len, "plaintext TCP");
		return;
	}
	struct tls_conn *t = tc(c);
	const SSL_CIPHER *ciph = SSL_get_current_cipher(t->ssl);
	const char *suite = ciph ? SSL_CIPHER_get_name(ciph) : "(no suite)";
	if (t->rec)
		snprintf(buf, len, "%s %s, meshrun's records, %s by %s", SSL_get_version(t->ssl), suite,
			 strstr(suite, "CHACHA") ? "ChaCha20-Poly1305" : "AES-GCM",
			 tls_rec_cipher_impl(t->rec));
	else
		snprintf(buf, len, "%s %s, OpenSSL's records", SSL_get_version(t->ssl), suite);
}

bool tls_conn_corrupt_next(struct conn *c)
{
	if (c->type != &conn_type_tls)
		return false;
	if (tc(c)->rec) {
		tls_rec_corrupt_next(tc(c)->rec);
		return true;
	}
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
