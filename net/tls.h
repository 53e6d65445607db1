/* OpenSSL contexts for DCN links: TLS 1.3 only, mutual authentication
 * against the cluster CA, AES-128-GCM preferred, and the host identity
 * ("meshrun-host-<id>" as CN or DNS SAN) pinned after each handshake. Also
 * makes throwaway cluster certificates for local runs and tests. */
#ifndef MESHRUN_TLS_H
#define MESHRUN_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

#define TLS_IDENTITY_PREFIX "meshrun-host-"

struct conn;

/* A context for host host_id: CA from certs_dir/ca.pem, own certificate and
 * key from certs_dir/host<id>.pem and .key, verify-peer with
 * fail-if-no-peer-cert, TLS 1.3 only, no session tickets. Used for both
 * accepting and dialing. NULL with err naming the file on failure. */
SSL_CTX *tls_ctx_new(const char *certs_dir, int host_id, char *err, size_t errlen);
void tls_ctx_free(SSL_CTX *ctx);

/* The host id the peer certificate of a finished handshake names, or -1
 * with err saying why (no certificate, no meshrun-host-<id> identity, or
 * the CN and SAN name different hosts). For net/tls_conn.c; everyone else
 * asks a connection (conn_peer_host). */
int tls_peer_host(SSL *ssl, char *err, size_t errlen);
/* true if the peer of connection c (handshake done) is host_id; else false
 * with err saying which identity it carries. */
bool tls_peer_is_host(struct conn *c, int host_id, char *err, size_t errlen);

/* Appends the reason of the last OpenSSL failure (error queue, verify
 * result) to buf. */
void tls_error_string(SSL *ssl, char *buf, size_t len);

/* Writes a fresh CA's certificate (ca.pem; its key is never written, so
 * no other certificate can be signed for this set) and hosts
 * host<i>.pem/.key (0600) for i in [0, n) into dir (which must exist):
 * ECDSA P-256, CN and DNS SAN meshrun-host-<i>, valid for 30 days. 0 or
 * -errno with err. */
int tls_gen_certs(const char *dir, int n, char *err, size_t errlen);

#endif
