/* The AEAD that seals and opens our TLS records (net/tls_rec.c): one
 * direction's key, and a record's seal or open under a nonce and AAD.
 *
 * Two implementations of the same ciphers, chosen per connection
 * (net_params.tls_cipher, config key tls_cipher_impl):
 *   - Intel's ipsec-mb (Debian's libipsec-mb, amd64), AES-128-GCM and
 *     AES-256-GCM: it has the VAES/AVX-512 code path that Debian 12's
 *     OpenSSL 3.0 lacks (12.4 against 4.0 GB/s for 16 KiB records on a
 *     Zen 4, bench/results/transport.md);
 *   - OpenSSL's EVP, every suite (ChaCha20-Poly1305 always goes here).
 * Both give the same bytes: the wire does not tell them apart, and a peer
 * on one talks to a peer on the other (tests/check_aead.c).
 *
 * A struct aead is one thread's at a time (the link lock); the
 * implementation's code is shared read-only. */
#ifndef MESHRUN_AEAD_H
#define MESHRUN_AEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AEAD_IV_LEN  12
#define AEAD_TAG_LEN 16
#define AEAD_KEY_MAX 32

enum aead_alg {
	AEAD_AES_128_GCM,
	AEAD_AES_256_GCM,
	AEAD_CHACHA20_POLY1305,
};

enum aead_impl {
	AEAD_IMPL_AUTO,      /* ipsec-mb for AES-GCM when built with it, else OpenSSL */
	AEAD_IMPL_OPENSSL,
	AEAD_IMPL_IPSEC_MB,  /* AES-GCM only; refused by a build without ipsec-mb */
};

/* A run of the text: len bytes from in to out (in == out is fine). A
 * record's text is its pieces in order. */
struct aead_piece {
	const uint8_t *in;
	uint8_t *out;
	size_t len;
};

struct aead;

/* "auto", "openssl" or "ipsec-mb" into *impl: 0, or -1 for another word. */
int aead_impl_parse(const char *word, enum aead_impl *impl);
/* true when this build has ipsec-mb (the Makefile finds its header). */
bool aead_have_ipsec_mb(void);
/* A direction's cipher, for sealing (enc) or opening; no key yet. NULL
 * with err on failure (ipsec-mb asked for where it is not built, or for
 * ChaCha20-Poly1305; no memory). */
struct aead *aead_new(enum aead_alg alg, enum aead_impl impl, bool enc, char *err, size_t errlen);
/* Wipes the key and frees a (NULL is fine). */
void aead_free(struct aead *a);
/* The key, of the algorithm's length (16 or 32 bytes). 0 or -1. */
int aead_set_key(struct aead *a, const uint8_t *key);
/* Seals the pieces under iv and aad; the tag to tag. 0 or -1. */
int aead_seal(struct aead *a, const uint8_t iv[AEAD_IV_LEN], const uint8_t *aad, size_t aadlen,
	      const struct aead_piece *p, int np, uint8_t tag[AEAD_TAG_LEN]);
/* Opens the pieces under iv and aad: 0 when tag verifies, -1 when it does
 * not (the outputs then hold text that must not be used). */
int aead_open(struct aead *a, const uint8_t iv[AEAD_IV_LEN], const uint8_t *aad, size_t aadlen,
	      const struct aead_piece *p, int np, const uint8_t tag[AEAD_TAG_LEN]);
/* Who does the work: "ipsec-mb (avx512)", "openssl", ... */
const char *aead_impl_name(const struct aead *a);

#endif
