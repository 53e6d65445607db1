/* TLS 1.3 records of our own after OpenSSL's handshake ("kTLS in user
 * space"): once OpenSSL has done the whole handshake (certificates,
 * identity pinning), a connection's records are written and read here,
 * byte for byte as RFC 8446 section 5 has them. This is what OpenSSL
 * does when it hands a connection to kTLS, done in user space. Private to
 * net/ (net/tls_conn.c drives it; the record tests and
 * tests/fuzz/fuzz_records.c drive it over a socket).
 *
 * Records: a 5-byte header (type 23, 0x0303, length), the AEAD of
 * TLSInnerPlaintext (content, its content type, no padding) under the
 * header as AAD, the nonce the direction's iv XOR its record sequence
 * number; keys and ivs from the traffic secrets by HKDF-Expand-Label
 * (section 7.1, 7.3); KeyUpdate (4.6.3, 7.2) both ways; close_notify.
 * The cipher is net/aead.h's: ipsec-mb's AES-GCM or OpenSSL's EVP.
 *
 * Write: records of up to 2^14 plaintext bytes are encrypted from the
 * caller's buffer into an output buffer, which goes to send() once it
 * holds send_bytes or when the caller says no more bytes follow
 * (struct conn.more). Read: recv() of up to TLS_REC_IN_BYTES into an input
 * buffer; a record is decrypted straight into the caller's buffer as far
 * as it reaches, the rest of it into a record-sized scratch it is served
 * from next; no byte is returned before its record's tag verified.
 *
 * Every call works on c->fd and reports through c (want, drained, err);
 * the caller serialises calls on one connection (the link lock). */
#ifndef MESHRUN_TLS_REC_H
#define MESHRUN_TLS_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net/aead.h"
#include "net/conn.h"

#define TLS_REC_MAX_PLAIN   16384                 /* 2^14, RFC 8446 5.1 */
#define TLS_REC_OVERHEAD    (5 + 1 + 16)          /* header, content type, tag */
#define TLS_REC_MAX_CIPHER  (TLS_REC_MAX_PLAIN + 256)   /* 5.2 */
#define TLS_REC_IN_BYTES    (256 * 1024)
#define TLS_REC_SECRET_MAX  48                    /* SHA-384 */
/* Records one sending key encrypts at most before we renew it: RFC 8446
 * 5.5 allows AES-GCM 2^24.5 full-size records per key. */
#define TLS_REC_MAX_RECORDS_PER_KEY (1ull << 24)

/* The three suites net/tls.c allows. */
enum tls_rec_suite {
	TLS_REC_AES_128_GCM_SHA256,
	TLS_REC_AES_256_GCM_SHA384,
	TLS_REC_CHACHA20_POLY1305_SHA256,
};

struct tls_rec;

/* OpenSSL's own typedefs (openssl/types.h), repeated so that this header
 * does not pull in OpenSSL. */
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

/* A handshake's two application traffic secrets as OpenSSL's key log
 * reports them, kept for tls_rec_new. */
struct tls_rec_secrets {
	uint8_t secret[2][TLS_REC_SECRET_MAX];    /* [0] the client's, [1] the server's */
	size_t len[2];
};

/* Sets ctx's key log callback, once, where the context is made (net/tls.c
 * tls_ctx_new): during a handshake on ctx, the two application traffic
 * secrets go to the struct tls_rec_secrets its SSL carries
 * (tls_rec_secrets_attach); other lines, and an SSL that carries none,
 * are ignored, and nothing is logged anywhere. 0, or -1 if OpenSSL had no
 * ex_data index to give. */
int tls_rec_keylog_set(SSL_CTX *ctx);
/* From now on ssl's handshake hands its traffic secrets to s (NULL: to
 * nothing), which must outlive the handshake. Before the handshake. 0 or
 * -1. */
int tls_rec_secrets_attach(SSL *ssl, struct tls_rec_secrets *s);

/* The suite for an IANA cipher suite id (SSL_CIPHER_get_protocol_id), or
 * -1 when it is none of the three. */
int tls_rec_suite_of(uint16_t iana_id);
/* Length of the suite's traffic secrets (its hash's). */
size_t tls_rec_secret_len(enum tls_rec_suite s);

/* Records with both directions' application traffic secrets (tx: ours,
 * rx: the peer's), both sequence numbers at 0, sealed and opened by impl
 * (net/aead.h); output goes to the kernel in sends of about send_bytes
 * (0: 1 MiB). The secrets are copied (and wiped on renewal and free). NULL
 * with err on failure. */
struct tls_rec *tls_rec_new(enum tls_rec_suite s, enum aead_impl impl, const uint8_t *tx_secret,
			    const uint8_t *rx_secret, size_t send_bytes, char *err, size_t errlen);
/* Wipes the keys and frees r (NULL is fine). */
void tls_rec_free(struct tls_rec *r);
/* Who seals and opens r's records (aead_impl_name). */
const char *tls_rec_cipher_impl(const struct tls_rec *r);

/* The conn_type calls (net/conn.h). read may write anywhere in
 * [buf, buf + len), also bytes it does not return (a record's content type,
 * a control record, plaintext of a record whose tag then failed). */
ssize_t tls_rec_read(struct tls_rec *r, struct conn *c, void *buf, size_t len);
ssize_t tls_rec_write(struct tls_rec *r, struct conn *c, const void *buf, size_t len);
int tls_rec_flush(struct tls_rec *r, struct conn *c);
bool tls_rec_pending(const struct tls_rec *r);
/* Queues close_notify and flushes: 0, -EAGAIN or < 0. */
int tls_rec_close(struct tls_rec *r, struct conn *c);
/* Our KeyUpdate after every `bytes` of plaintext written (0: only the
 * per-key record cap), counted in *count (may be NULL). */
void tls_rec_set_key_update(struct tls_rec *r, uint64_t bytes, _Atomic uint64_t *count);
/* Sends a KeyUpdate now, asking the peer to renew its key as well when
 * request (tests). 0 or < 0 with c->err. */
int tls_rec_key_update(struct tls_rec *r, struct conn *c, bool request);
/* The records one sending key encrypts at most (default and at most
 * TLS_REC_MAX_RECORDS_PER_KEY; tests set fewer). */
void tls_rec_set_record_cap(struct tls_rec *r, uint64_t records);
/* Fault injection: flips a ciphertext byte of the next record written. */
void tls_rec_corrupt_next(struct tls_rec *r);
/* Records written and read so far, and key renewals each way (tests). */
void tls_rec_counts(const struct tls_rec *r, uint64_t *tx_records, uint64_t *rx_records,
		    uint64_t *tx_updates, uint64_t *rx_updates);

#endif
