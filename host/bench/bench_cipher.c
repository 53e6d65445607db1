/* Seal and open rates of the records' AEAD (net/aead.h), each
 * implementation, in CPU time: the cipher's share of a message's cost,
 * and the figure bench/goals19.sh subtracts as "AES-GCM itself". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/bench/bench_cipher.h"
#include "net/aead.h"

static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GB/s of CPU time sealing (enc) or opening n-byte records for about
 * seconds; -1 when a call fails. */
static double rate(struct aead *a, bool enc, uint8_t *buf, size_t n, uint8_t *tag,
		   double seconds)
{
	uint8_t iv[AEAD_IV_LEN] = { 0 }, aad[5] = { 23, 3, 3, 0, 0 };
	struct aead_piece p = { buf, buf, n };
	double t0 = cpu_now(), t = t0;
	long long calls = 0;
	while (t - t0 < seconds) {
		for (int k = 0; k < 16; k++) {
			iv[0]++;
			/* an open fails on the tag (no seal made it): the
			 * work is the same as a good one's */
			int rc = enc ? aead_seal(a, iv, aad, sizeof(aad), &p, 1, tag)
				     : aead_open(a, iv, aad, sizeof(aad), &p, 1, tag);
			if (enc && rc)
				return -1;
		}
		calls += 16;
		t = cpu_now();
	}
	return (double)calls * (double)n / (t - t0) / 1e9;
}

int bench_cipher_run(size_t bytes, double seconds)
{
	static const struct { enum aead_alg alg; const char *name; int klen; } algs[] = {
		{ AEAD_AES_128_GCM, "AES-128-GCM", 16 },
		{ AEAD_AES_256_GCM, "AES-256-GCM", 32 },
	};
	enum aead_impl impls[2] = { AEAD_IMPL_OPENSSL, AEAD_IMPL_IPSEC_MB };
	int nimpl = aead_have_ipsec_mb() ? 2 : 1;
	uint8_t *buf = malloc(bytes), key[AEAD_KEY_MAX], tag[AEAD_TAG_LEN] = { 0 };
	char err[200];
	if (!buf) {
		fprintf(stderr, "meshrun: bench cipher: out of memory for %zu bytes\n", bytes);
		return -ENOMEM;
	}
	for (size_t i = 0; i < bytes; i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	for (int i = 0; i < AEAD_KEY_MAX; i++)
		key[i] = (uint8_t)(i * 7 + 1);
	const char *auto_name = "openssl";
	for (size_t g = 0; g < sizeof(algs) / sizeof(algs[0]); g++) {
		for (int m = 0; m < nimpl; m++) {
			struct aead *s = aead_new(algs[g].alg, impls[m], true, err, sizeof(err));
			struct aead *o = aead_new(algs[g].alg, impls[m], false, err, sizeof(err));
			if (!s || !o || aead_set_key(s, key) || aead_set_key(o, key)) {
				fprintf(stderr, "meshrun: bench cipher: %s\n", err);
				aead_free(s);
				aead_free(o);
				free(buf);
				return -EINVAL;
			}
			double se = rate(s, true, buf, bytes, tag, seconds);
			double op = rate(o, false, buf, bytes, tag, seconds);
			printf("cipher %s %s: %zu-byte records, seal %.2f GB/s, open %.2f GB/s (CPU time)\n",
			       algs[g].name, aead_impl_name(s), bytes, se, op);
			if (impls[m] == AEAD_IMPL_IPSEC_MB)
				auto_name = aead_impl_name(s);
			aead_free(s);
			aead_free(o);
		}
	}
	printf("cipher auto: %s for AES-GCM\n", auto_name);
	free(buf);
	return 0;
}
