/* The records' AEAD, by ipsec-mb or OpenSSL; see net/aead.h. */
#include "net/aead.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#ifdef MESHRUN_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

struct aead {
	bool enc;
	bool ipsec;                /* ipsec-mb's code, else OpenSSL's */
	EVP_CIPHER *cipher;        /* OpenSSL: fetched once, ours to free */
	EVP_CIPHER_CTX *ctx;
#ifdef MESHRUN_IPSEC_MB
	/* ipsec-mb: the expanded key and a record's running state, 64-byte
	 * aligned (its code stores to them with aligned moves; its header
	 * says so only when LINUX is defined); aead_new aligns the struct */
	_Alignas(64) struct gcm_key_data key;
	_Alignas(64) struct gcm_context_data run;
	/* the key size's and the direction's calls, from the manager */
	aes_gcm_pre_t pre;
	aes_gcm_init_var_iv_t init;
	aes_gcm_enc_dec_update_t update;
	aes_gcm_enc_dec_finalize_t finalize;
#endif
};

int aead_impl_parse(const char *word, enum aead_impl *impl)
{
	if (!strcmp(word, "auto"))
		*impl = AEAD_IMPL_AUTO;
	else if (!strcmp(word, "openssl"))
		*impl = AEAD_IMPL_OPENSSL;
	else if (!strcmp(word, "ipsec-mb"))
		*impl = AEAD_IMPL_IPSEC_MB;
	else
		return -1;
	return 0;
}

#ifdef MESHRUN_IPSEC_MB

/* One manager for the process, made once: its table of the CPU's code
 * paths is only read after init_mb_mgr_auto, so threads share it (the GCM
 * calls keep their state in the key and the context they are given; each
 * also stores 0, or an error code for a NULL argument, in the library's
 * process-wide error word, which nothing reads after mgr_make). */
static IMB_MGR *mgr;
static IMB_ARCH mgr_arch;
static pthread_once_t mgr_once = PTHREAD_ONCE_INIT;

static void mgr_make(void)
{
	IMB_MGR *m = alloc_mb_mgr(0);
	if (!m)
		return;
	init_mb_mgr_auto(m, &mgr_arch);
	if (imb_get_errno(m)) {
		free_mb_mgr(m);
		return;
	}
	mgr = m;
}

static IMB_MGR *mgr_get(void)
{
	pthread_once(&mgr_once, mgr_make);
	return mgr;
}

bool aead_have_ipsec_mb(void)
{
	return true;
}

#else

bool aead_have_ipsec_mb(void)
{
	return false;
}

#endif

struct aead *aead_new(enum aead_alg alg, enum aead_impl impl, bool enc, char *err, size_t errlen)
{
	static const char *const names[] = { "AES-128-GCM", "AES-256-GCM", "ChaCha20-Poly1305" };
	bool gcm = alg != AEAD_CHACHA20_POLY1305;
	if (impl == AEAD_IMPL_IPSEC_MB && !gcm) {
		snprintf(err, errlen, "tls cipher: ipsec-mb is used for AES-GCM only, not %s",
			 names[alg]);
		return NULL;
	}
#ifndef MESHRUN_IPSEC_MB
	if (impl == AEAD_IMPL_IPSEC_MB) {
		snprintf(err, errlen, "tls cipher: this build has no ipsec-mb (install "
			 "libipsec-mb-dev and rebuild, or set tls_cipher_impl to auto or openssl)");
		return NULL;
	}
#endif
	size_t size = (sizeof(struct aead) + 63) / 64 * 64;
	struct aead *a = aligned_alloc(64, size);
	if (!a) {
		snprintf(err, errlen, "tls cipher: out of memory");
		return NULL;
	}
	memset(a, 0, size);
	a->enc = enc;
#ifdef MESHRUN_IPSEC_MB
	if (gcm && impl != AEAD_IMPL_OPENSSL) {
		const IMB_MGR *m = mgr_get();
		if (m) {
			bool k128 = alg == AEAD_AES_128_GCM;
			a->ipsec = true;
			a->pre = k128 ? m->gcm128_pre : m->gcm256_pre;
			a->init = k128 ? m->gcm128_init_var_iv : m->gcm256_init_var_iv;
			a->update = enc ? (k128 ? m->gcm128_enc_update : m->gcm256_enc_update)
					: (k128 ? m->gcm128_dec_update : m->gcm256_dec_update);
			a->finalize = enc ? (k128 ? m->gcm128_enc_finalize : m->gcm256_enc_finalize)
					  : (k128 ? m->gcm128_dec_finalize : m->gcm256_dec_finalize);
			return a;
		}
		if (impl == AEAD_IMPL_IPSEC_MB) {
			snprintf(err, errlen, "tls cipher: ipsec-mb found no code path for this CPU");
			free(a);
			return NULL;
		}
	}
#endif
	a->cipher = EVP_CIPHER_fetch(NULL, names[alg], NULL);
	a->ctx = EVP_CIPHER_CTX_new();
	if (!a->cipher || !a->ctx ||
	    EVP_CipherInit_ex(a->ctx, a->cipher, NULL, NULL, NULL, enc) != 1) {
		snprintf(err, errlen, "tls cipher: openssl has no %s", names[alg]);
		aead_free(a);
		return NULL;
	}
	return a;
}

void aead_free(struct aead *a)
{
	if (!a)
		return;
	EVP_CIPHER_CTX_free(a->ctx);
	EVP_CIPHER_free(a->cipher);
	/* the expanded key and a record's state */
	OPENSSL_cleanse(a, sizeof(*a));
	free(a);
}

int aead_set_key(struct aead *a, const uint8_t *key)
{
#ifdef MESHRUN_IPSEC_MB
	if (a->ipsec) {
		a->pre(key, &a->key);
		return 0;
	}
#endif
	return EVP_CipherInit_ex(a->ctx, NULL, NULL, key, NULL, a->enc) == 1 ? 0 : -1;
}

/* The tag as an OSSL_PARAM of its own: read after a seal with
 * EVP_CIPHER_CTX_get_params, given to the open's init. Straight to the
 * provider, without EVP_CIPHER_CTX_ctrl's translation of a ctrl into
 * parameters. */
static void tag_param(OSSL_PARAM p[2], uint8_t *tag)
{
	p[0] = (OSSL_PARAM){ OSSL_CIPHER_PARAM_AEAD_TAG, OSSL_PARAM_OCTET_STRING, tag,
			     AEAD_TAG_LEN, OSSL_PARAM_UNMODIFIED };
	p[1] = (OSSL_PARAM)OSSL_PARAM_END;
}

/* OpenSSL's run over the pieces after its init: AAD, text, final. */
static int evp_run(EVP_CIPHER_CTX *x, const uint8_t *aad, size_t aadlen,
		   const struct aead_piece *p, int np)
{
	int o;
	if (aadlen && EVP_CipherUpdate(x, NULL, &o, aad, (int)aadlen) != 1)
		return -1;
	for (int i = 0; i < np; i++)
		if (p[i].len && EVP_CipherUpdate(x, p[i].out, &o, p[i].in, (int)p[i].len) != 1)
			return -1;
	uint8_t end[16];
	return EVP_CipherFinal_ex(x, end, &o) == 1 ? 0 : -1;
}

#ifdef MESHRUN_IPSEC_MB
/* ipsec-mb's run over the pieces, sealing or opening as a was made: the
 * tag it computes to tag. */
static void imb_run(struct aead *a, const uint8_t *iv, const uint8_t *aad, size_t aadlen,
		    const struct aead_piece *p, int np, uint8_t *tag)
{
	a->init(&a->key, &a->run, iv, AEAD_IV_LEN, aad, aadlen);
	for (int i = 0; i < np; i++)
		if (p[i].len)
			a->update(&a->key, &a->run, p[i].out, p[i].in, p[i].len);
	a->finalize(&a->key, &a->run, tag, AEAD_TAG_LEN);
}
#endif

int aead_seal(struct aead *a, const uint8_t iv[AEAD_IV_LEN], const uint8_t *aad, size_t aadlen,
	      const struct aead_piece *p, int np, uint8_t tag[AEAD_TAG_LEN])
{
#ifdef MESHRUN_IPSEC_MB
	if (a->ipsec) {
		imb_run(a, iv, aad, aadlen, p, np, tag);
		return 0;
	}
#endif
	OSSL_PARAM t[2];
	tag_param(t, tag);
	if (EVP_EncryptInit_ex(a->ctx, NULL, NULL, NULL, iv) != 1 ||
	    evp_run(a->ctx, aad, aadlen, p, np) || EVP_CIPHER_CTX_get_params(a->ctx, t) != 1)
		return -1;
	return 0;
}

int aead_open(struct aead *a, const uint8_t iv[AEAD_IV_LEN], const uint8_t *aad, size_t aadlen,
	      const struct aead_piece *p, int np, const uint8_t tag[AEAD_TAG_LEN])
{
#ifdef MESHRUN_IPSEC_MB
	if (a->ipsec) {
		uint8_t got[AEAD_TAG_LEN];
		imb_run(a, iv, aad, aadlen, p, np, got);
		return CRYPTO_memcmp(got, tag, AEAD_TAG_LEN) ? -1 : 0;
	}
#endif
	/* the expected tag goes in with the nonce: one call to the provider */
	OSSL_PARAM t[2];
	tag_param(t, (uint8_t *)tag);
	if (EVP_DecryptInit_ex2(a->ctx, NULL, NULL, iv, t) != 1)
		return -1;
	return evp_run(a->ctx, aad, aadlen, p, np);
}

const char *aead_impl_name(const struct aead *a)
{
#ifdef MESHRUN_IPSEC_MB
	if (a->ipsec) {
		switch (mgr_arch) {
		case IMB_ARCH_AVX512: return "ipsec-mb (avx512)";
		case IMB_ARCH_AVX2: return "ipsec-mb (avx2)";
		case IMB_ARCH_AVX: return "ipsec-mb (avx)";
		case IMB_ARCH_SSE: return "ipsec-mb (sse)";
		default: return "ipsec-mb (no aes-ni)";
		}
	}
#endif
	(void)a;
	return "openssl";
}
