/* The TLS connection type: a struct conn (net/conn.h) whose bytes go
 * through TLS 1.3: OpenSSL's handshake over a socket BIO that lets
 * OpenSSL read and write the socket itself (no buffer in between), then
 * records of our own (net/tls_rec.h) or OpenSSL's. Callers use
 * the conn_* calls; the peer's host identity and key renewal are asked
 * through the table, so no caller needs the SSL object. */
#ifndef MESHRUN_TLS_CONN_H
#define MESHRUN_TLS_CONN_H

#include <stdbool.h>

#include "net/aead.h"
#include "net/conn.h"

/* OpenSSL's own typedefs (openssl/types.h), repeated so that this header
 * does not pull in OpenSSL. */
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;
struct tls_rec;

/* Wraps a connected (or connecting) non-blocking socket; server picks the
 * side of the handshake. Takes ownership of fd, even on failure; NULL on
 * allocation failure. ctx must outlive the connection. */
struct conn *tls_conn_new(SSL_CTX *ctx, int fd, bool server);

/* Who writes and reads the records once OpenSSL's handshake is done:
 * OpenSSL (own false, the default of tls_conn_new) or net/tls_rec.c
 * (own true: the same TLS 1.3 records, RFC 8446 section 5, sealed and
 * opened by cipher's implementation, net/aead.h; written into a buffer
 * that goes to send() once it holds about send_bytes, 0: 1 MiB). Before
 * the handshake only. The traffic secrets come through the key log
 * callback tls_ctx_new set on the context (net/tls_rec.c), so ctx must be
 * one it made. */
void tls_conn_set_records(struct conn *c, bool own, size_t send_bytes, enum aead_impl cipher);
/* true once the connection's records are ours (after the handshake). */
bool tls_conn_own_records(struct conn *c);
/* Our record layer under c, NULL before the switch or with OpenSSL's
 * (tests: counts and a KeyUpdate on demand, net/tls_rec.h). */
struct tls_rec *tls_conn_rec(struct conn *c);
/* What protects c's bytes, in one phrase for a log, e.g. "TLS 1.3
 * TLS_AES_128_GCM_SHA256, meshrun's records, AES-GCM by ipsec-mb" or
 * "..., OpenSSL's records"; "plaintext TCP" for a connection of another
 * type. Call after the handshake. */
void tls_conn_describe(struct conn *c, char *buf, size_t len);
/* The SSL object under a TLS connection (NULL for another type). For tests
 * that inspect or drive TLS itself (the negotiated cipher, records
 * encrypted into memory); the runtime never needs it. */
SSL *tls_conn_ssl(struct conn *c);

/* Fault injection: the next TLS record this connection writes gets one
 * byte of its ciphertext flipped on its way to the socket, after
 * encryption, so the peer's TLS rejects it. false (nothing armed) for a
 * connection that is not TLS. */
bool tls_conn_corrupt_next(struct conn *c);

#endif
