/* The TLS connection type: a struct conn (net/conn.h) whose bytes go
 * through TLS 1.3 over a socket BIO that lets OpenSSL read and write the
 * socket itself (no buffer in between). Callers use
 * the conn_* calls; the peer's host identity and key renewal are asked
 * through the table, so no caller needs the SSL object. */
#ifndef MESHRUN_TLS_CONN_H
#define MESHRUN_TLS_CONN_H

#include <stdbool.h>

#include "net/conn.h"

/* OpenSSL's own typedefs (openssl/types.h), repeated so that this header
 * does not pull in OpenSSL. */
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

/* Wraps a connected (or connecting) non-blocking socket; server picks the
 * side of the handshake. Takes ownership of fd, even on failure; NULL on
 * allocation failure. ctx must outlive the connection. */
struct conn *tls_conn_new(SSL_CTX *ctx, int fd, bool server);

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
