/* TLS contexts, peer identity pinning and cluster certificates; see
 * net/tls.h. The TLS connection type itself is net/tls_conn.c. */
#include "net/tls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "net/conn.h"
#include "net/tls_rec.h"

/* AES-128-GCM first: the fastest suite with AES-NI; the server's order
 * wins so both sides pick it. */
static const char suites[] =
	"TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

static void last_ssl_error(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();
	const char *r = e ? ERR_reason_error_string(e) : NULL;
	snprintf(buf, len, "%s", r ? r : "unknown error");
	ERR_clear_error();
}

static int check_file(const char *path, const char *what, char *err, size_t errlen)
{
	if (access(path, R_OK)) {
		int rc = -errno;
		snprintf(err, errlen, "tls: unable to read %s '%s': %s", what, path, conn_strerror(errno));
		return rc;
	}
	return 0;
}

SSL_CTX *tls_ctx_new(const char *certs_dir, int host_id, char *err, size_t errlen)
{
	char ca[4096], crt[4096], key[4096], why[256];
	SSL_CTX *ctx;

	snprintf(ca, sizeof(ca), "%s/ca.pem", certs_dir);
	snprintf(crt, sizeof(crt), "%s/host%d.pem", certs_dir, host_id);
	snprintf(key, sizeof(key), "%s/host%d.key", certs_dir, host_id);
	if (check_file(ca, "cluster ca", err, errlen) ||
	    check_file(crt, "certificate", err, errlen) ||
	    check_file(key, "private key", err, errlen))
		return NULL;

	ERR_clear_error();
	ctx = SSL_CTX_new(TLS_method());
	if (!ctx) {
		last_ssl_error(why, sizeof(why));
		snprintf(err, errlen, "tls: unable to create a context: %s", why);
		return NULL;
	}
	if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(ctx, suites)) {
		last_ssl_error(why, sizeof(why));
		snprintf(err, errlen, "tls: unable to restrict the context to tls 1.3: %s", why);
		goto out_free;
	}
	SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_TICKET |
				 SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
	SSL_CTX_set_num_tickets(ctx, 0);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	/* the traffic secrets for records of our own come through the key
	 * log (net/tls_rec.c); a connection with OpenSSL's records carries
	 * nothing for it to fill, so its lines are dropped */
	if (tls_rec_keylog_set(ctx)) {
		snprintf(err, errlen, "tls: unable to set the context's key log callback");
		goto out_free;
	}

	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	SSL_CTX_set_verify_depth(ctx, 2);

	if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
		last_ssl_error(why, sizeof(why));
		snprintf(err, errlen, "tls: unable to load cluster ca '%s': %s", ca, why);
		goto out_free;
	}
	STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
	if (names)
		SSL_CTX_set_client_CA_list(ctx, names);
	if (SSL_CTX_use_certificate_chain_file(ctx, crt) != 1) {
		last_ssl_error(why, sizeof(why));
		snprintf(err, errlen, "tls: unable to load certificate '%s': %s", crt, why);
		goto out_free;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		last_ssl_error(why, sizeof(why));
		snprintf(err, errlen, "tls: unable to load private key '%s': %s", key, why);
		goto out_free;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		last_ssl_error(why, sizeof(why));
		snprintf(err, errlen, "tls: key '%s' does not match certificate '%s': %s", key, crt, why);
		goto out_free;
	}
	return ctx;

out_free:
	SSL_CTX_free(ctx);
	return NULL;
}

void tls_ctx_free(SSL_CTX *ctx)
{
	SSL_CTX_free(ctx);
}

/* Host id named by s ("meshrun-host-<canonical decimal>"), or -1. */
static int parse_identity(const unsigned char *s, int len)
{
	size_t pl = strlen(TLS_IDENTITY_PREFIX);
	char num[16], canon[16];
	if (len <= (int)pl || len - (int)pl >= (int)sizeof(num) ||
	    memcmp(s, TLS_IDENTITY_PREFIX, pl))
		return -1;
	memcpy(num, s + pl, (size_t)len - pl);
	num[len - pl] = 0;
	for (char *p = num; *p; p++)
		if (*p < '0' || *p > '9')
			return -1;
	long v = strtol(num, NULL, 10);
	if (v < 0 || v > 1000000)
		return -1;
	snprintf(canon, sizeof(canon), "%ld", v);
	return strcmp(canon, num) ? -1 : (int)v;
}

int tls_peer_host(SSL *ssl, char *err, size_t errlen)
{
	X509 *cert = SSL_get0_peer_certificate(ssl);
	int id = -1;
	char cn[128] = "";

	if (!cert) {
		snprintf(err, errlen, "peer sent no certificate");
		return -1;
	}
	X509_NAME *subj = X509_get_subject_name(cert);
	int idx = subj ? X509_NAME_get_index_by_NID(subj, NID_commonName, -1) : -1;
	if (idx >= 0) {
		ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, idx));
		int n = ASN1_STRING_length(d);
		id = parse_identity(ASN1_STRING_get0_data(d), n);
		snprintf(cn, sizeof(cn), "%.*s", n < 100 ? n : 100, ASN1_STRING_get0_data(d));
	}
	GENERAL_NAMES *sans = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
	for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
		GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
		if (g->type != GEN_DNS)
			continue;
		int s = parse_identity(ASN1_STRING_get0_data(g->d.dNSName),
				       ASN1_STRING_length(g->d.dNSName));
		if (s < 0)
			continue;
		if (id >= 0 && s != id) {
			snprintf(err, errlen, "peer certificate names two hosts (%d and %d)", id, s);
			GENERAL_NAMES_free(sans);
			return -1;
		}
		id = s;
	}
	GENERAL_NAMES_free(sans);
	if (id < 0)
		snprintf(err, errlen, "peer certificate (cn '%s') names no %s<id> identity",
			 cn, TLS_IDENTITY_PREFIX);
	return id;
}

bool tls_peer_is_host(struct conn *c, int host_id, char *err, size_t errlen)
{
	int id = conn_peer_host(c, err, errlen);
	if (id < 0)
		return false;
	if (id != host_id) {
		snprintf(err, errlen, "certificate identity '%s%d' does not match claimed host %d",
			 TLS_IDENTITY_PREFIX, id, host_id);
		return false;
	}
	return true;
}

void tls_error_string(SSL *ssl, char *buf, size_t len)
{
	unsigned long e;
	size_t used = 0;
	buf[0] = 0;
	if (ssl) {
		long v = SSL_get_verify_result(ssl);
		if (v != X509_V_OK)
			used += snprintf(buf, len, "certificate verify failed: %s",
					 X509_verify_cert_error_string(v));
	}
	while ((e = ERR_get_error()) && used < len) {
		const char *r = ERR_reason_error_string(e);
		if (!r)
			continue;
		if (used && strstr(buf, r))
			continue;
		used += snprintf(buf + used, len - used, "%s%s", used ? ": " : "", r);
	}
	if (!buf[0])
		snprintf(buf, len, "connection closed during the handshake");
}

/* ---- certificates ---- */

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX v3;
	X509V3_set_ctx_nodb(&v3);
	X509V3_set_ctx(&v3, issuer, cert, NULL, NULL, 0);
	X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
	if (!ext)
		return -1;
	int ok = X509_add_ext(cert, ext, -1);
	X509_EXTENSION_free(ext);
	return ok ? 0 : -1;
}

/* A certificate for cn signed by ca_key (self-signed when ca is NULL). */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *ca, EVP_PKEY *ca_key)
{
	X509 *x = X509_new();
	unsigned char serial[8];
	char san[160];
	if (!x)
		return NULL;
	RAND_bytes(serial, sizeof(serial));
	serial[0] &= 0x7f;
	BIGNUM *bn = BN_bin2bn(serial, sizeof(serial), NULL);
	if (!bn)
		goto out_free;
	BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
	BN_free(bn);
	X509_set_version(x, 2);
	X509_gmtime_adj(X509_getm_notBefore(x), -3600);
	X509_gmtime_adj(X509_getm_notAfter(x), 30L * 24 * 3600);
	X509_set_pubkey(x, key);
	X509_NAME *name = X509_get_subject_name(x);
	X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"meshrun", -1, -1, 0);
	X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
	X509_set_issuer_name(x, ca ? X509_get_subject_name(ca) : name);
	X509 *iss = ca ? ca : x;
	if (add_ext(x, iss, NID_subject_key_identifier, "hash"))
		goto out_free;
	if (ca) {
		snprintf(san, sizeof(san), "DNS:%s", cn);
		if (add_ext(x, iss, NID_basic_constraints, "critical,CA:FALSE") ||
		    add_ext(x, iss, NID_key_usage, "critical,digitalSignature") ||
		    add_ext(x, iss, NID_ext_key_usage, "serverAuth,clientAuth") ||
		    add_ext(x, iss, NID_subject_alt_name, san) ||
		    add_ext(x, iss, NID_authority_key_identifier, "keyid:always"))
			goto out_free;
	} else if (add_ext(x, iss, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
		   add_ext(x, iss, NID_key_usage, "critical,keyCertSign,cRLSign")) {
		goto out_free;
	}
	if (!X509_sign(x, ca ? ca_key : key, EVP_sha256()))
		goto out_free;
	return x;
out_free:
	X509_free(x);
	return NULL;
}

/* cert as BASE.pem and, unless key is NULL, the key as BASE.key (0600). */
static int write_pem(const char *dir, const char *base, X509 *cert, EVP_PKEY *key,
		     char *err, size_t errlen)
{
	char path[4096];
	FILE *f;
	snprintf(path, sizeof(path), "%s/%s.pem", dir, base);
	f = fopen(path, "w");
	if (!f || !PEM_write_X509(f, cert) || fclose(f)) {
		int rc = errno ? -errno : -EIO;
		snprintf(err, errlen, "tls: unable to write '%s'", path);
		return rc;
	}
	if (!key)
		return 0;
	snprintf(path, sizeof(path), "%s/%s.key", dir, base);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f || !PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) || fclose(f)) {
		int rc = errno ? -errno : -EIO;
		snprintf(err, errlen, "tls: unable to write '%s'", path);
		return rc;
	}
	return 0;
}

int tls_gen_certs(const char *dir, int n, char *err, size_t errlen)
{
	char cn[64], base[32];
	int rc = -EIO;
	EVP_PKEY *ca_key = EVP_EC_gen("P-256");
	X509 *ca = ca_key ? make_cert(ca_key, "meshrun cluster ca", NULL, NULL) : NULL;
	if (!ca) {
		snprintf(err, errlen, "tls: unable to make a cluster ca");
		goto out;
	}
	/* the CA's key signs the hosts' certificates below and is never
	 * written: nobody can sign another certificate for this job */
	rc = write_pem(dir, "ca", ca, NULL, err, errlen);
	for (int i = 0; !rc && i < n; i++) {
		EVP_PKEY *k = EVP_EC_gen("P-256");
		snprintf(cn, sizeof(cn), "%s%d", TLS_IDENTITY_PREFIX, i);
		X509 *c = k ? make_cert(k, cn, ca, ca_key) : NULL;
		if (!c) {
			snprintf(err, errlen, "tls: unable to make a certificate for host %d", i);
			rc = -EIO;
		} else {
			snprintf(base, sizeof(base), "host%d", i);
			rc = write_pem(dir, base, c, k, err, errlen);
		}
		X509_free(c);
		EVP_PKEY_free(k);
	}
out:
	X509_free(ca);
	EVP_PKEY_free(ca_key);
	ERR_clear_error();
	return rc;
}
