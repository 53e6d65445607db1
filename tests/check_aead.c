/* The records' AEAD (net/aead.h), in process: ipsec-mb's AES-GCM and
 * OpenSSL's seal the same text under the same key, nonce and AAD to the
 * same bytes and tag, for texts cut into pieces at odd places (0 to 40000
 * bytes, pieces not multiples of 16, empty ones); each opens what the
 * other sealed; a flipped bit of the text, the tag, the AAD or the nonce
 * fails the open on both; a new key gives other bytes; ipsec-mb is
 * refused for ChaCha20-Poly1305, and by a build without it. The same
 * cipher on the wire is tests/check_tlsrec.c's (ours against OpenSSL's
 * record layer). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/aead.h"

static uint32_t rnd_state = 12345;

static uint32_t rnd(void)
{
	rnd_state = rnd_state * 1103515245u + 12345u;
	return rnd_state >> 8;
}

static void fill(uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)rnd();
}

static struct aead *make(enum aead_alg alg, enum aead_impl impl, bool enc, const uint8_t *key)
{
	char err[200];
	struct aead *a = aead_new(alg, impl, enc, err, sizeof(err));
	ck_assert_msg(a, "%s", err);
	ck_assert_int_eq(aead_set_key(a, key), 0);
	return a;
}

/* text of n bytes cut into np pieces at random places (some empty) */
static int cut(struct aead_piece *p, const uint8_t *in, uint8_t *out, size_t n)
{
	int np = 1 + (int)(rnd() % 4);
	size_t at = 0;
	for (int i = 0; i < np; i++) {
		size_t k = i == np - 1 ? n - at : (n - at) ? rnd() % (n - at + 1) : 0;
		p[i] = (struct aead_piece){ in + at, out + at, k };
		at += k;
	}
	return np;
}

START_TEST(test_same_as_openssl)
{
	if (!aead_have_ipsec_mb())
		return;          /* one implementation: nothing to compare */
	enum aead_alg alg = _i ? AEAD_AES_256_GCM : AEAD_AES_128_GCM;
	uint8_t key[AEAD_KEY_MAX], iv[AEAD_IV_LEN], aad[13];
	static const size_t lens[] = { 0, 1, 15, 16, 17, 255, 4097, 16385, 40000 };
	fill(key, sizeof(key));
	struct aead *si = make(alg, AEAD_IMPL_IPSEC_MB, true, key);
	struct aead *so = make(alg, AEAD_IMPL_OPENSSL, true, key);
	struct aead *oi = make(alg, AEAD_IMPL_IPSEC_MB, false, key);
	struct aead *oo = make(alg, AEAD_IMPL_OPENSSL, false, key);
	ck_assert(!strncmp(aead_impl_name(si), "ipsec-mb", 8));
	ck_assert_str_eq(aead_impl_name(so), "openssl");
	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
		size_t n = lens[l];
		uint8_t *txt = malloc(n + 1), *c1 = malloc(n + 1), *c2 = malloc(n + 1);
		uint8_t *back = malloc(n + 1), t1[AEAD_TAG_LEN], t2[AEAD_TAG_LEN];
		struct aead_piece p[4];
		fill(txt, n);
		fill(iv, sizeof(iv));
		size_t aadlen = rnd() % (sizeof(aad) + 1);
		fill(aad, sizeof(aad));
		int np = cut(p, txt, c1, n);
		ck_assert_int_eq(aead_seal(si, iv, aad, aadlen, p, np, t1), 0);
		np = cut(p, txt, c2, n);
		ck_assert_int_eq(aead_seal(so, iv, aad, aadlen, p, np, t2), 0);
		ck_assert_msg(!memcmp(c1, c2, n) && !memcmp(t1, t2, sizeof(t1)),
			      "%zu bytes: ipsec-mb and openssl sealed different bytes", n);
		if (n)
			ck_assert(memcmp(c1, txt, n));
		/* each opens the other's, then fails on every kind of flip */
		struct aead *op[2] = { oi, oo };
		for (int k = 0; k < 2; k++) {
			np = cut(p, c1, back, n);
			ck_assert_int_eq(aead_open(op[k], iv, aad, aadlen, p, np, t1), 0);
			ck_assert(!memcmp(back, txt, n));
			for (int flip = 0; flip < 4; flip++) {
				uint8_t t[AEAD_TAG_LEN], v[AEAD_IV_LEN], ad[13], *c = c1;
				memcpy(t, t1, sizeof(t));
				memcpy(v, iv, sizeof(v));
				memcpy(ad, aad, sizeof(ad));
				size_t adl = aadlen;
				if (flip == 0 && n)
					c1[rnd() % n] ^= 1 << (rnd() % 8);
				else if (flip == 1)
					t[rnd() % sizeof(t)] ^= 0x80;
				else if (flip == 2 && aadlen)
					ad[rnd() % aadlen] ^= 4;
				else if (flip == 2)
					adl = 1;
				else
					v[rnd() % sizeof(v)] ^= 1;
				np = cut(p, c, back, n);
				ck_assert_msg(aead_open(op[k], v, ad, adl, p, np, t) == -1,
					      "%s opened %zu bytes after flip %d", aead_impl_name(op[k]),
					      n, flip);
				memcpy(c1, c2, n);      /* undo a text flip */
			}
		}
		free(txt);
		free(c1);
		free(c2);
		free(back);
	}
	/* another key: other bytes, and the old key does not open them */
	uint8_t txt[100], c1[100], c2[100], t1[AEAD_TAG_LEN], t2[AEAD_TAG_LEN];
	struct aead_piece p[1] = { { txt, c1, sizeof(txt) } };
	fill(txt, sizeof(txt));
	ck_assert_int_eq(aead_seal(si, iv, aad, 5, p, 1, t1), 0);
	key[0] ^= 1;
	ck_assert_int_eq(aead_set_key(si, key), 0);
	p[0].out = c2;
	ck_assert_int_eq(aead_seal(si, iv, aad, 5, p, 1, t2), 0);
	ck_assert(memcmp(c1, c2, sizeof(c1)) || memcmp(t1, t2, sizeof(t1)));
	p[0] = (struct aead_piece){ c2, txt, sizeof(txt) };
	ck_assert_int_eq(aead_open(oo, iv, aad, 5, p, 1, t2), -1);
	aead_free(si);
	aead_free(so);
	aead_free(oi);
	aead_free(oo);
}
END_TEST

START_TEST(test_refusals)
{
	char err[200] = "";
	enum aead_impl impl;
	ck_assert_int_eq(aead_impl_parse("ipsec-mb", &impl), 0);
	ck_assert_int_eq(impl, AEAD_IMPL_IPSEC_MB);
	ck_assert_int_eq(aead_impl_parse("openssl", &impl), 0);
	ck_assert_int_eq(impl, AEAD_IMPL_OPENSSL);
	ck_assert_int_eq(aead_impl_parse("auto", &impl), 0);
	ck_assert_int_eq(impl, AEAD_IMPL_AUTO);
	ck_assert_int_eq(aead_impl_parse("aesni", &impl), -1);
	ck_assert_ptr_null(aead_new(AEAD_CHACHA20_POLY1305, AEAD_IMPL_IPSEC_MB, true, err,
				    sizeof(err)));
	ck_assert_msg(strstr(err, "AES-GCM only"), "%s", err);
	/* auto takes ChaCha20-Poly1305 to OpenSSL */
	struct aead *a = aead_new(AEAD_CHACHA20_POLY1305, AEAD_IMPL_AUTO, true, err, sizeof(err));
	ck_assert_msg(a, "%s", err);
	ck_assert_str_eq(aead_impl_name(a), "openssl");
	aead_free(a);
	a = aead_new(AEAD_AES_128_GCM, AEAD_IMPL_IPSEC_MB, true, err, sizeof(err));
	if (aead_have_ipsec_mb()) {
		ck_assert_msg(a, "%s", err);
		aead_free(a);
	} else {
		ck_assert_ptr_null(a);
		ck_assert_msg(strstr(err, "no ipsec-mb"), "%s", err);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("aead");
	TCase *tc = tcase_create("aead");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_same_as_openssl, 0, 2);
	tcase_add_test(tc, test_refusals);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
