/* TLS 1.3 records of our own after OpenSSL's handshake; see net/tls_rec.h.
 * RFC 8446: records 5.1-5.4, limits 5.5, KeyUpdate 4.6.3, key schedule
 * 7.1-7.3, alerts 6. */
#include "net/tls_rec.h"
#include "net/aead.h"
#include "net/rec_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

enum {
	CT_ALERT = 21,
	CT_HANDSHAKE = 22,
	CT_APPDATA = 23,
	HS_KEY_UPDATE = 24,
	TAG_LEN = 16,
	IV_LEN = 12,
	/* room kept behind the data records for two control records
	 * (KeyUpdate, close_notify: 5 + 5 + 1 + 16 bytes each) */
	CTRL_ROOM = 2 * 64,
};

/* One direction: its traffic secret, key (in its cipher), iv and record
 * sequence number. */
struct dir {
	struct aead *aead;
	uint8_t secret[TLS_REC_SECRET_MAX];
	uint8_t iv[IV_LEN];
	uint64_t seq, updates;
};

struct tls_rec {
	const char *md;               /* the suite's hash, for HKDF */
	size_t hlen, klen;
	struct dir tx, rx;

	/* written records waiting for send(): [out_off, out_len) */
	uint8_t *out;
	size_t out_cap, out_off, out_len, send_bytes;
	bool corked;                  /* the last send() went with MSG_MORE */
	bool corrupt_next;
	bool ku_owed;                 /* the peer asked for our KeyUpdate */
	bool tx_closed;               /* close_notify queued */
	uint64_t tx_plain, ku_at, ku_every;
	uint64_t max_records;         /* per sending key (5.5) */
	_Atomic uint64_t *ku_count;
	uint64_t tx_records, rx_records;
	uint32_t log_ports;           /* net/rec_log.h's cache of the socket's ports */

	/* received bytes not yet decrypted: [in_off, in_len) */
	uint8_t *in;
	size_t in_off, in_len;
	bool rx_closed;               /* close_notify read */
	bool rx_short;                /* the latest recv() came back short */
	int rx_err;                   /* a failure found after bytes were returned */
	char rx_why[256];
	/* the part of a record that did not fit the reader's buffer,
	 * verified: [plain_off, plain_len) */
	size_t plain_off, plain_len;
	uint8_t plain[TLS_REC_MAX_CIPHER];
};

int tls_rec_suite_of(uint16_t iana_id)
{
	switch (iana_id) {
	case 0x1301: return TLS_REC_AES_128_GCM_SHA256;
	case 0x1302: return TLS_REC_AES_256_GCM_SHA384;
	case 0x1303: return TLS_REC_CHACHA20_POLY1305_SHA256;
	default: return -1;
	}
}

size_t tls_rec_secret_len(enum tls_rec_suite s)
{
	return s == TLS_REC_AES_256_GCM_SHA384 ? 48 : 32;
}

/* ---- the traffic secrets, from OpenSSL's key log ---- */

/* the SSL ex_data slot that holds a connection's struct tls_rec_secrets */
static int secrets_idx = -1;
static pthread_once_t secrets_once = PTHREAD_ONCE_INIT;

static void secrets_idx_new(void)
{
	secrets_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

static int hexval(char ch)
{
	return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
		: ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* OpenSSL's key log (NSS format, "LABEL <client random> <secret>"): the
 * two application traffic secrets go to the SSL's tls_rec_secrets; every
 * other line (handshake secrets, the exporter) is ignored. */
static void keylog(const SSL *ssl, const char *line)
{
	static const char *const labels[2] = { "CLIENT_TRAFFIC_SECRET_0 ",
						"SERVER_TRAFFIC_SECRET_0 " };
	struct tls_rec_secrets *t = secrets_idx < 0 ? NULL : SSL_get_ex_data(ssl, secrets_idx);
	if (!t)
		return;
	for (int k = 0; k < 2; k++) {
		size_t ll = strlen(labels[k]);
		if (strncmp(line, labels[k], ll))
			continue;
		const char *sp = strchr(line + ll, ' ');
		if (!sp)
			return;
		size_t hex = strlen(sp + 1), n = hex / 2;
		if (hex % 2 || n > TLS_REC_SECRET_MAX)
			return;
		for (size_t i = 0; i < n; i++) {
			int hi = hexval(sp[1 + 2 * i]), lo = hexval(sp[2 + 2 * i]);
			if (hi < 0 || lo < 0) {
				OPENSSL_cleanse(t->secret[k], sizeof(t->secret[k]));
				return;
			}
			t->secret[k][i] = (uint8_t)(hi << 4 | lo);
		}
		t->len[k] = n;
	}
}

int tls_rec_keylog_set(SSL_CTX *ctx)
{
	pthread_once(&secrets_once, secrets_idx_new);
	if (secrets_idx < 0)
		return -1;
	SSL_CTX_set_keylog_callback(ctx, keylog);
	return 0;
}

int tls_rec_secrets_attach(SSL *ssl, struct tls_rec_secrets *s)
{
	pthread_once(&secrets_once, secrets_idx_new);
	return secrets_idx >= 0 && SSL_set_ex_data(ssl, secrets_idx, s) == 1 ? 0 : -1;
}

/* HKDF-Expand-Label(secret, label, "", olen) (RFC 8446 7.1). */
static int expand_label(const struct tls_rec *r, const uint8_t *secret, const char *label,
			uint8_t *out, size_t olen)
{
	uint8_t info[2 + 1 + 6 + 32 + 1];
	size_t ll = strlen(label);
	info[0] = (uint8_t)(olen >> 8);
	info[1] = (uint8_t)olen;
	info[2] = (uint8_t)(6 + ll);
	memcpy(info + 3, "tls13 ", 6);
	memcpy(info + 9, label, ll);
	info[9 + ll] = 0;               /* empty context */
	int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)r->md, 0),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)secret, r->hlen),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, 10 + ll),
		OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
		OSSL_PARAM_construct_end(),
	};
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	EVP_KDF_CTX *k = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	int ok = k && EVP_KDF_derive(k, out, olen, params) == 1;
	EVP_KDF_CTX_free(k);
	EVP_KDF_free(kdf);
	return ok ? 0 : -1;
}

/* Key and iv of d from its secret (7.3); the sequence number restarts. */
static int dir_keys(struct tls_rec *r, struct dir *d)
{
	uint8_t key[32];
	int rc = -1;
	if (!expand_label(r, d->secret, "key", key, r->klen) &&
	    !expand_label(r, d->secret, "iv", d->iv, IV_LEN) && !aead_set_key(d->aead, key))
		rc = 0;
	OPENSSL_cleanse(key, sizeof(key));
	d->seq = 0;
	return rc;
}

/* The next generation of d's secret and keys (7.2); the old secret is
 * overwritten. */
static int dir_update(struct tls_rec *r, struct dir *d)
{
	uint8_t next[TLS_REC_SECRET_MAX];
	if (expand_label(r, d->secret, "traffic upd", next, r->hlen))
		return -1;
	memcpy(d->secret, next, r->hlen);
	OPENSSL_cleanse(next, sizeof(next));
	d->updates++;
	return dir_keys(r, d);
}

/* The per-record nonce: iv XOR the sequence number, left-padded (5.3). */
static void nonce(const struct dir *d, uint8_t *n)
{
	memcpy(n, d->iv, IV_LEN);
	for (int i = 0; i < 8; i++)
		n[IV_LEN - 1 - i] ^= (uint8_t)(d->seq >> (8 * i));
}

struct tls_rec *tls_rec_new(enum tls_rec_suite s, enum aead_impl impl, const uint8_t *tx_secret,
			    const uint8_t *rx_secret, size_t send_bytes, char *err, size_t errlen)
{
	enum aead_alg alg;
	struct tls_rec *r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "tls records: out of memory");
		return NULL;
	}
	switch (s) {
	case TLS_REC_AES_128_GCM_SHA256:
		alg = AEAD_AES_128_GCM;
		r->md = "SHA256";
		r->klen = 16;
		break;
	case TLS_REC_AES_256_GCM_SHA384:
		alg = AEAD_AES_256_GCM;
		r->md = "SHA384";
		r->klen = 32;
		break;
	default:
		alg = AEAD_CHACHA20_POLY1305;
		r->md = "SHA256";
		r->klen = 32;
		break;
	}
	r->hlen = tls_rec_secret_len(s);
	r->send_bytes = send_bytes ? send_bytes : (1u << 20);
	r->max_records = TLS_REC_MAX_RECORDS_PER_KEY;
	r->out_cap = r->send_bytes + TLS_REC_MAX_PLAIN + TLS_REC_OVERHEAD + CTRL_ROOM;
	r->out = malloc(r->out_cap);
	r->in = malloc(TLS_REC_IN_BYTES);
	memcpy(r->tx.secret, tx_secret, r->hlen);
	memcpy(r->rx.secret, rx_secret, r->hlen);
	if (!r->out || !r->in) {
		snprintf(err, errlen, "tls records: out of memory");
		tls_rec_free(r);
		return NULL;
	}
	if (!(r->tx.aead = aead_new(alg, impl, true, err, errlen)) ||
	    !(r->rx.aead = aead_new(alg, impl, false, err, errlen))) {
		tls_rec_free(r);
		return NULL;
	}
	if (dir_keys(r, &r->tx) || dir_keys(r, &r->rx)) {
		snprintf(err, errlen, "tls records: unable to set up the %s keys", r->md);
		tls_rec_free(r);
		return NULL;
	}
	return r;
}

void tls_rec_free(struct tls_rec *r)
{
	if (!r)
		return;
	aead_free(r->tx.aead);
	aead_free(r->rx.aead);
	free(r->out);
	free(r->in);
	/* the secrets, ivs and whatever plaintext is left */
	OPENSSL_cleanse(r, sizeof(*r));
	free(r);
}

const char *tls_rec_cipher_impl(const struct tls_rec *r)
{
	return aead_impl_name(r->tx.aead);
}

/* ---- writing ---- */

/* Encrypts one record of type with n bytes of src to r->out + out_len. */
static int seal(struct tls_rec *r, uint8_t type, const uint8_t *src, size_t n)
{
	uint8_t *d = r->out + r->out_len, iv[IV_LEN];
	size_t rlen = n + 1 + TAG_LEN;
	d[0] = CT_APPDATA;
	d[1] = 3;
	d[2] = 3;
	d[3] = (uint8_t)(rlen >> 8);
	d[4] = (uint8_t)rlen;
	/* TLSInnerPlaintext: the content, then its type */
	const struct aead_piece text[2] = { { src, d + 5, n }, { &type, d + 5 + n, 1 } };
	nonce(&r->tx, iv);
	if (aead_seal(r->tx.aead, iv, d, 5, text, 2, d + 5 + n + 1))
		return -1;
	if (r->corrupt_next) {
		/* past the header: ciphertext or tag, which the peer rejects */
		d[5 + rlen / 2] ^= 0x5a;
		r->corrupt_next = false;
	}
	r->tx.seq++;
	r->tx_records++;
	r->out_len += 5 + rlen;
	return 0;
}

/* Our KeyUpdate under the current key, then the next key (4.6.3). */
static int send_key_update(struct tls_rec *r, struct conn *c, bool request)
{
	const uint8_t ku[5] = { HS_KEY_UPDATE, 0, 0, 1, request ? 1 : 0 };
	if (seal(r, CT_HANDSHAKE, ku, sizeof(ku)) || dir_update(r, &r->tx)) {
		snprintf(c->err, sizeof(c->err), "tls key update failed after %llu bytes",
			 (unsigned long long)r->tx_plain);
		return -EPROTO;
	}
	if (r->ku_count)
		atomic_fetch_add_explicit(r->ku_count, 1, memory_order_relaxed);
	return 0;
}

/* send() of what the output buffer holds: 0 when all went, -EAGAIN, or
 * < 0. more: MSG_MORE (more bytes follow at once). */
static int send_out(struct tls_rec *r, struct conn *c, bool more)
{
	while (r->out_off < r->out_len) {
		uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
		ssize_t n = send(c->fd, r->out + r->out_off, r->out_len - r->out_off,
				 MSG_NOSIGNAL | (more ? MSG_MORE : 0));
		if (n > 0) {
			if (t0)
				rec_log(REC_SEND, c->fd, &r->log_ports, r->tx_records, (uint64_t)n, t0);
			r->out_off += (size_t)n;
			r->corked = more;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			c->want = CONN_WANT_WRITE;
			return -EAGAIN;
		}
		int e = n < 0 ? errno : EPIPE;
		snprintf(c->err, sizeof(c->err), "tls write: %s", conn_strerror(e));
		return -e;
	}
	r->out_off = r->out_len = 0;
	return 0;
}

/* Room for a record of n plaintext bytes and the control records behind
 * it; sends (and compacts) to make it. 0, -EAGAIN or < 0. */
static int make_room(struct tls_rec *r, struct conn *c, size_t n)
{
	size_t need = n + TLS_REC_OVERHEAD + CTRL_ROOM;
	if (r->out_cap - r->out_len >= need)
		return 0;
	int rc = send_out(r, c, true);
	if (rc && rc != -EAGAIN)
		return rc;
	if (r->out_off && r->out_len - r->out_off <= r->out_cap / 4) {
		memmove(r->out, r->out + r->out_off, r->out_len - r->out_off);
		r->out_len -= r->out_off;
		r->out_off = 0;
	}
	if (r->out_cap - r->out_len >= need)
		return 0;
	c->want = CONN_WANT_WRITE;
	return -EAGAIN;
}

ssize_t tls_rec_write(struct tls_rec *r, struct conn *c, const void *buf, size_t len)
{
	const uint8_t *src = buf;
	size_t n = 0;
	int rc;
	if (r->tx_closed) {
		snprintf(c->err, sizeof(c->err), "tls write: after our close_notify");
		return -EPIPE;
	}
	if (!len)
		return 0;
	if (r->ku_owed) {
		if ((rc = make_room(r, c, 0)))
			return rc;
		if ((rc = send_key_update(r, c, false)))
			return rc;
		r->ku_owed = false;
	}
	while (n < len) {
		size_t k = len - n < TLS_REC_MAX_PLAIN ? len - n : TLS_REC_MAX_PLAIN;
		rc = make_room(r, c, k);
		if (rc == -EAGAIN)
			break;
		if (rc)
			return rc;
		/* the cap of records per key (5.5), whatever ku_every says */
		if (r->tx.seq >= r->max_records && (rc = send_key_update(r, c, false)))
			return rc;
		uint64_t t0 = rec_log_on() ? rec_log_now() : 0, seq = r->tx_records;
		if (seal(r, CT_APPDATA, src + n, k)) {
			snprintf(c->err, sizeof(c->err), "tls write: encryption failed");
			return -EPROTO;
		}
		if (t0)
			rec_log(REC_SEAL, c->fd, &r->log_ports, seq, k, t0);
		n += k;
	}
	if (!n)
		return -EAGAIN;     /* c->want set by make_room */
	r->tx_plain += n;
	if (r->ku_every && r->tx_plain >= r->ku_at) {
		if ((rc = send_key_update(r, c, false)))
			return rc;
		r->ku_at = r->tx_plain + r->ku_every;
	}
	size_t push = c->push && c->push < r->send_bytes ? c->push : r->send_bytes;
	if (!c->more || r->out_len - r->out_off >= push) {
		rc = send_out(r, c, c->more);
		if (rc && rc != -EAGAIN)
			return rc;
	}
	return (ssize_t)n;
}

int tls_rec_flush(struct tls_rec *r, struct conn *c)
{
	int rc = send_out(r, c, false);
	if (rc)
		return rc;
	if (r->corked) {
		/* setting TCP_NODELAY pushes what MSG_MORE held back */
		int one = 1;
		setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		r->corked = false;
	}
	return 0;
}

int tls_rec_close(struct tls_rec *r, struct conn *c)
{
	if (!r->tx_closed) {
		const uint8_t alert[2] = { 1, 0 };      /* warning, close_notify */
		int rc = make_room(r, c, 0);
		if (rc)
			return rc;
		if (seal(r, CT_ALERT, alert, sizeof(alert))) {
			snprintf(c->err, sizeof(c->err), "tls shutdown: encryption failed");
			return -EPROTO;
		}
		r->tx_closed = true;
	}
	return tls_rec_flush(r, c);
}

void tls_rec_set_key_update(struct tls_rec *r, uint64_t bytes, _Atomic uint64_t *count)
{
	r->ku_every = bytes;
	r->ku_at = r->tx_plain + bytes;
	r->ku_count = count;
}

int tls_rec_key_update(struct tls_rec *r, struct conn *c, bool request)
{
	int rc = make_room(r, c, 0);
	if (!rc)
		rc = send_key_update(r, c, request);
	return rc;
}

void tls_rec_set_record_cap(struct tls_rec *r, uint64_t records)
{
	r->max_records = records;
}

void tls_rec_corrupt_next(struct tls_rec *r)
{
	r->corrupt_next = true;
}

void tls_rec_counts(const struct tls_rec *r, uint64_t *tx_records, uint64_t *rx_records,
		    uint64_t *tx_updates, uint64_t *rx_updates)
{
	*tx_records = r->tx_records;
	*rx_records = r->rx_records;
	*tx_updates = r->tx.updates;
	*rx_updates = r->rx.updates;
}

/* ---- reading ---- */

bool tls_rec_pending(const struct tls_rec *r)
{
	if (r->plain_off < r->plain_len)
		return true;
	size_t avail = r->in_len - r->in_off;
	if (avail < 5)
		return false;
	const uint8_t *h = r->in + r->in_off;
	return avail >= 5 + (((size_t)h[3] << 8) | h[4]);
}

static const char *alert_name(unsigned d)
{
	switch (d) {
	case 10: return "unexpected message";
	case 20: return "bad record mac";
	case 22: return "record overflow";
	case 40: return "handshake failure";
	case 42: return "bad certificate";
	case 43: return "unsupported certificate";
	case 44: return "certificate revoked";
	case 45: return "certificate expired";
	case 46: return "certificate unknown";
	case 47: return "illegal parameter";
	case 48: return "unknown ca";
	case 49: return "access denied";
	case 50: return "decode error";
	case 51: return "decrypt error";
	case 70: return "protocol version";
	case 80: return "internal error";
	case 90: return "user canceled";
	case 109: return "missing extension";
	case 110: return "unsupported extension";
	case 116: return "certificate required";
	default: return "unknown";
	}
}

/* A reader's failure: one line in c->err naming it and the peer. */
static int rx_fail(struct conn *c, int rc, const char *what, unsigned long long rec)
{
	snprintf(c->err, sizeof(c->err), "tls read: %s (record %llu from %s)", what, rec,
		 c->peer_addr[0] ? c->peer_addr : "the peer");
	return rc;
}

/* The alert the peer sent: 0 for close_notify, else its error. */
static int rx_alert(struct tls_rec *r, struct conn *c, const uint8_t *a, size_t n,
		    unsigned long long rec)
{
	char what[80];
	if (n != 2)
		return rx_fail(c, -EPROTO, "malformed alert", rec);
	if (a[1] == 0) {
		r->rx_closed = true;
		return 0;
	}
	snprintf(what, sizeof(what), "peer sent alert %s (%u)", alert_name(a[1]), a[1]);
	/* about certificates: a class of its own, as tls_conn.c's
	 * cert_failure says of OpenSSL's (net/net.h NET_ERR_TLS) */
	switch (a[1]) {
	case 42: case 43: case 44: case 45: case 46: case 48: case 51: case 116:
		return rx_fail(c, -EKEYREJECTED, what, rec);
	default:
		return rx_fail(c, -EPROTO, what, rec);
	}
}

/* Opens the whole record at r->in + in_off (header h, rlen bytes behind
 * it): its first bytes into dst (up to cap), the rest into r->plain.
 * Returns the application bytes it put in dst (their rest, if any, waits
 * in r->plain), 0 for a control record or an empty one, -1 at close_notify
 * (r->rx_closed), or < -1 an error. */
static ssize_t open_record(struct tls_rec *r, struct conn *c, uint8_t *dst, size_t cap)
{
	const uint8_t *h = r->in + r->in_off;
	size_t rlen = ((size_t)h[3] << 8) | h[4], inner = rlen - TAG_LEN;
	unsigned long long rec = (unsigned long long)r->rx_records;
	size_t n1 = inner < cap ? inner : cap;
	uint8_t iv[IV_LEN];
	const struct aead_piece text[2] = { { h + 5, dst, n1 },
					    { h + 5 + n1, r->plain, inner - n1 } };
	nonce(&r->rx, iv);
	if (aead_open(r->rx.aead, iv, h, 5, text, 2, h + 5 + inner))
		return rx_fail(c, -EPROTO, "bad record mac", rec);
	r->rx.seq++;
	r->rx_records++;
	r->in_off += 5 + rlen;
	/* the content type: the last byte that is not zero padding */
	size_t i = inner;
	uint8_t type = 0;
	while (i > 0) {
		i--;
		type = i < n1 ? dst[i] : r->plain[i - n1];
		if (type)
			break;
	}
	if (!type)
		return rx_fail(c, -EPROTO, "record with no content type", rec);
	size_t plen = i;
	if (plen > TLS_REC_MAX_PLAIN)
		return rx_fail(c, -EPROTO, "record overflow", rec);
	if (type == CT_APPDATA) {
		if (plen > n1) {
			r->plain_off = 0;
			r->plain_len = plen - n1;
			return (ssize_t)n1;
		}
		return (ssize_t)plen;
	}
	/* control records are short: gather them whole */
	uint8_t m[8];
	if (plen > sizeof(m) || !plen)
		return rx_fail(c, -EPROTO, type == CT_ALERT ? "malformed alert"
				   : type == CT_HANDSHAKE ? "unexpected handshake message"
				   : "unexpected record content type", rec);
	for (size_t k = 0; k < plen; k++)
		m[k] = k < n1 ? dst[k] : r->plain[k - n1];
	if (type == CT_ALERT) {
		int rc = rx_alert(r, c, m, plen, rec);
		return rc ? rc : -1;
	}
	if (type != CT_HANDSHAKE) {
		char what[60];
		snprintf(what, sizeof(what), "unexpected record content type %u", type);
		return rx_fail(c, -EPROTO, what, rec);
	}
	if (plen != 5 || m[0] != HS_KEY_UPDATE || m[1] || m[2] || m[3] != 1 || m[4] > 1)
		return rx_fail(c, -EPROTO, m[0] == HS_KEY_UPDATE ? "malformed key update"
				   : "unexpected handshake message", rec);
	if (dir_update(r, &r->rx))
		return rx_fail(c, -EPROTO, "key update failed", rec);
	if (m[4]) {
		/* answered before our next record; now if there is room (the
		 * reader's caller flushes, as after OpenSSL's SSL_read) */
		r->ku_owed = true;
		if (r->out_cap - r->out_len >= CTRL_ROOM && !r->tx_closed &&
		    !send_key_update(r, c, false))
			r->ku_owed = false;
	}
	return 0;
}

ssize_t tls_rec_read(struct tls_rec *r, struct conn *c, void *buf, size_t len)
{
	uint8_t *dst = buf;
	size_t got = 0;
	/* after a short recv(), a read that has bytes to return does not ask
	 * the socket again (it would likely meet EAGAIN) */
	bool may_recv = !r->rx_short;
	/* the latest recv(), in this read or an earlier one: a read served
	 * from records already here says what the socket said then, so the
	 * read that completes a message tells link_read the socket is empty
	 * (OpenSSL's record layer made a recv() for each record) */
	c->drained = r->rx_short;
	if (r->rx_err) {
		snprintf(c->err, sizeof(c->err), "%s", r->rx_why);
		return r->rx_err;
	}
	if (r->plain_off < r->plain_len) {
		size_t k = r->plain_len - r->plain_off;
		if (k > len)
			k = len;
		memcpy(dst, r->plain + r->plain_off, k);
		r->plain_off += k;
		return (ssize_t)k;
	}
	if (r->rx_closed)
		return 0;
	while (got < len) {
		size_t avail = r->in_len - r->in_off, need = 5;
		if (avail >= 5) {
			const uint8_t *h = r->in + r->in_off;
			size_t rlen = ((size_t)h[3] << 8) | h[4];
			if (h[0] != CT_APPDATA) {
				char what[60];
				snprintf(what, sizeof(what), "unexpected record type %u", h[0]);
				rx_fail(c, -EPROTO, what, (unsigned long long)r->rx_records);
				goto fail;
			}
			if (rlen > TLS_REC_MAX_CIPHER) {
				rx_fail(c, -EPROTO, "record overflow", (unsigned long long)r->rx_records);
				goto fail;
			}
			if (rlen < TAG_LEN + 1) {
				rx_fail(c, -EPROTO, "record too short", (unsigned long long)r->rx_records);
				goto fail;
			}
			need = 5 + rlen;
			if (avail >= need) {
				uint64_t t0 = rec_log_on() ? rec_log_now() : 0, seq = r->rx_records;
				ssize_t k = open_record(r, c, dst + got, len - got);
				if (t0)
					rec_log(REC_OPEN, c->fd, &r->log_ports, seq, rlen, t0);
				if (k < -1) {
					r->rx_err = (int)k;
					goto fail;
				}
				if (k == -1)          /* close_notify */
					return (ssize_t)got;
				got += (size_t)k;
				if (r->plain_off < r->plain_len)
					break;
				continue;
			}
		}
		if (got && !may_recv)
			break;
		/* more bytes off the socket, after the partial record */
		if (r->in_off == r->in_len) {
			r->in_off = r->in_len = 0;
		} else if (TLS_REC_IN_BYTES - r->in_off < need ||
			   TLS_REC_IN_BYTES - r->in_len < TLS_REC_MAX_CIPHER + 5) {
			memmove(r->in, r->in + r->in_off, avail);
			r->in_off = 0;
			r->in_len = avail;
		}
		size_t ask = TLS_REC_IN_BYTES - r->in_len;
		ssize_t n;
		uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
		do
			n = recv(c->fd, r->in + r->in_len, ask, 0);
		while (n < 0 && errno == EINTR);
		if (n > 0) {
			if (t0)
				rec_log(REC_RECV, c->fd, &r->log_ports, r->rx_records, (uint64_t)n, t0);
			r->in_len += (size_t)n;
			r->rx_short = c->drained = (size_t)n < ask;
			may_recv = !c->drained;
			continue;
		}
		if (n == 0) {
			if (avail) {
				rx_fail(c, -EPROTO, "connection closed in the middle of a record",
					(unsigned long long)r->rx_records);
				r->rx_err = -EPROTO;
				goto fail;
			}
			/* an end without close_notify reads as one, as OpenSSL's
			 * SSL_OP_IGNORE_UNEXPECTED_EOF has it (net/tls.c) */
			return (ssize_t)got;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			if (got)
				break;
			c->want = CONN_WANT_READ;
			return -EAGAIN;
		}
		int e = errno;
		snprintf(c->err, sizeof(c->err), "tls read: %s", conn_strerror(e));
		if (got) {
			r->rx_err = -e;
			snprintf(r->rx_why, sizeof(r->rx_why), "%s", c->err);
			break;
		}
		return -e;
	}
	return (ssize_t)got;
fail:
	if (!r->rx_err)
		r->rx_err = -EPROTO;
	snprintf(r->rx_why, sizeof(r->rx_why), "%s", c->err);
	/* bytes verified before the failure are still the caller's */
	return got ? (ssize_t)got : r->rx_err;
}
