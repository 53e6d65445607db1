/* Kernel instruction-set suite (kernels/isa.c): every kernel built for
 * several vector instruction sets gives the same bits in each as in the
 * x86-64 baseline build (SSE2), on lengths that leave every tail (1, 7,
 * 15, 17, 33, 1003), with outputs that accumulate prefilled; and the
 * choice of set refuses one the CPU lacks. A set this CPU lacks is skipped
 * (and said so on stderr): on a machine without AVX-512 only the others
 * are compared. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static const int lens[] = { 1, 7, 15, 17, 33, 1003 };
#define NLENS ((int)(sizeof lens / sizeof lens[0]))

static uint64_t rng_s;

/* uniform in [-amp, amp) (splitmix64) */
static float rnd(double amp)
{
	uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (float)(amp * ((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0));
}

/* A run's buffers, from one arena so a case is one memcmp: fill() hands
 * out n floats of seeded noise (every run of a case sees the same). */
struct arena {
	float *buf;
	size_t used, cap;
};

static float *fill(struct arena *a, size_t n, double amp)
{
	ck_assert_uint_le(a->used + n, a->cap);
	float *x = a->buf + a->used;
	for (size_t i = 0; i < n; i++)
		x[i] = rnd(amp);
	a->used += n;
	return x;
}

/* gate values reaching exp_fast's clamps (|x| > 88) as well as the usual */
static float *fill_wide(struct arena *a, size_t n)
{
	float *x = fill(a, n, 4.0);
	for (size_t i = 0; i < n; i += 5)
		x[i] *= 40.0f;
	return x;
}

typedef void (*case_fn)(struct arena *a, int n);

static void case_rmsnorm(struct arena *a, int n)
{
	int N = 3;
	float *out = fill(a, (size_t)N * n, 1), *rstd = fill(a, N, 1);
	float *x = fill(a, (size_t)N * n, 2);
	float *w = fill(a, n, 1), *dx = fill(a, (size_t)N * n, 1), *dw = fill(a, n, 1);
	float *dout = fill(a, (size_t)N * n, 1), *ss = fill(a, N, 1);
	rmsnorm_forward(out, rstd, x, w, N, n, 1e-5f);
	rmsnorm_backward(dx, dw, dout, x, w, rstd, N, n);
	rmsnorm_backward(dx, NULL, dout, out, w, rstd, N, n);
	rmsnorm_partial_sumsq(ss, x, N, n);
}

static void case_rope(struct arena *a, int n)
{
	int B = 1, T = 2, H = 2, D = 2 * n;
	size_t sz = (size_t)B * T * H * D;
	float *c = fill(a, (size_t)T * n, 1), *s = fill(a, (size_t)T * n, 1);
	float *x = fill(a, sz, 2), *y = fill(a, sz, 1), *dx = fill(a, sz, 1), *dx2 = fill(a, sz, 1);
	rope_forward(y, x, c, s, B, T, H, D);
	rope_forward(x, x, c, s, B, T, H, D);  /* in place */
	rope_backward(dx, y, c, s, B, T, H, D, 1);
	rope_backward(dx2, y, c, s, B, T, H, D, 0);
}

static void case_attention(struct arena *a, int n)
{
	/* T = n: the softmax rows and their backward at every length to n */
	int T = n, Hq = 2, Hkv = 1, Dk = 3, Dv = 5;
	float *q = fill(a, (size_t)T * Hq * Dk, 2), *k = fill(a, (size_t)T * Hkv * Dk, 2);
	float *v = fill(a, (size_t)T * Hkv * Dv, 1), *dout = fill(a, (size_t)T * Hq * Dv, 1);
	float *out = fill(a, (size_t)T * Hq * Dv, 1), *att = fill(a, (size_t)Hq * T * T, 1);
	float *scratch = fill(a, (size_t)T * T, 1), *dq = fill(a, (size_t)T * Hq * Dk, 1);
	float *dk = fill(a, (size_t)T * Hkv * Dk, 1), *dv = fill(a, (size_t)T * Hkv * Dv, 1);
	attention_forward(out, att, q, k, v, 1, T, Hq, Hkv, Dk, Dv, 0.7f);
	attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, 1, T, Hq, Hkv, Dk, Dv, 0.7f, 1);
	attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, 1, T, Hq, Hkv, Dk, Dv, 0.7f, 0);
}

static void case_swiglu(struct arena *a, int n)
{
	int N = 2;
	size_t sz = (size_t)N * n;
	float *g = fill_wide(a, sz), *u = fill(a, sz, 2), *h = fill(a, sz, 1), *d = fill(a, sz, 1);
	float *dg = fill(a, sz, 1), *du = fill(a, sz, 1);
	float *dg1 = fill(a, sz, 1), *du1 = fill(a, sz, 1);
	float *dg2 = fill(a, sz, 1), *du2 = fill(a, sz, 1);
	swiglu_forward(h, g, u, N, n);
	swiglu_backward(dg, du, d, g, u, N, n, 1);
	swiglu_backward(dg1, NULL, d, g, u, N, n, 1);
	swiglu_backward(NULL, du1, d, g, u, N, n, 1);
	swiglu_backward(dg2, du2, d, g, u, N, n, 0);
}

static void case_residual_embedding(struct arena *a, int n)
{
	int32_t tok[4] = { 2, 0, 2, 1 };
	float *x = fill(a, n, 1), *y = fill(a, n, 1), *out = fill(a, n, 1);
	float *dwte = fill(a, 3 * (size_t)n, 1), *dout = fill(a, 4 * (size_t)n, 1);
	residual_forward(out, x, y, n);
	residual_forward(x, x, y, n);  /* in place */
	embedding_backward(dwte, dout, tok, 4, n);
}

static void case_xent(struct arena *a, int n)
{
	int N = 3;
	int32_t tg[3] = { 0, n - 1, -1 };  /* the last row masked */
	size_t sz = (size_t)N * n;
	float *logits = fill_wide(a, sz), *probs = fill(a, sz, 1), *loss = fill(a, N, 1);
	float *dl = fill(a, sz, 1), *mx = fill(a, N, 1), *st = fill(a, 2 * (size_t)N, 1);
	float *p2 = fill(a, sz, 1), *loss2 = fill(a, N, 1), *tot = fill(a, 2, 1);
	tot[0] = (float)softmax_xent_forward(loss, probs, logits, tg, N, n);
	softmax_xent_backward(dl, probs, tg, 0.25f, N, n);
	xent_split_max(mx, logits, N, n);
	xent_split_sums(st, p2, logits, mx, tg, 0, N, n);
	tot[1] = (float)xent_split_finish(loss2, p2, mx, st, tg, N, n);
	xent_split_backward(dl, p2, tg, 0, 0.5f, N, n);
}

static void case_optim(struct arena *a, int n)
{
	float *p = fill(a, n, 1), *g = fill(a, n, 1), *m = fill(a, n, 0.1), *v = fill(a, n, 0.1);
	float *o = fill(a, n, 1), *buf = fill(a, n, 1), *norm = fill(a, 1, 1);
	for (int i = 0; i < n; i++)
		v[i] = fabsf(v[i]);  /* a second moment */
	adamw_update(p, g, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
	norm[0] = (float)sumsq(g, n);
	scale_inplace(g, n, 0.37f);
	muon_momentum(o, buf, g, n, 0.95f);
	muon_apply(p, o, n, 0.02f, 1.5f, 0.1f);
}

static void case_newton_schulz(struct arena *a, int n)
{
	/* the axpy of an r x r matrix: r = 1, 7, 15, 17, 33, 33 */
	int r = n < 33 ? n : 33, c = r + 2;
	float *G = fill(a, (size_t)r * c, 1), *out = fill(a, (size_t)r * c, 1);
	float *scratch = fill(a, 3 * (size_t)c * c + 2 * (size_t)r * c, 1);
	newton_schulz5(out, G, scratch, r, c);
}

static const struct {
	const char *name;
	case_fn run;
} cases[] = {
	{ "rmsnorm", case_rmsnorm },
	{ "rope", case_rope },
	{ "attention", case_attention },
	{ "swiglu", case_swiglu },
	{ "residual embedding", case_residual_embedding },
	{ "xent", case_xent },
	{ "optim", case_optim },
	{ "newton-schulz", case_newton_schulz },
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* runs case c at length n under isa into buf; returns the floats used */
static size_t run_under(enum kernel_isa isa, int c, int n, float *buf, size_t cap)
{
	struct arena a = { buf, 0, cap };
	ck_assert_int_eq(kernel_isa_set(isa), 0);
	rng_s = 0x5eed0000ull + (uint64_t)c * 7919 + (uint64_t)n;
	cases[c].run(&a, n);
	return a.used;
}

static enum kernel_isa saved;

static void setup(void)
{
	saved = kernel_isa();
}

static void teardown(void)
{
	kernel_isa_set(saved);
}

START_TEST(test_variants_bits)
{
	int c = _i;
	size_t cap = 4u << 20;  /* attention at T = 1003: about 3.0M floats */
	float *base = malloc(cap * sizeof(float)), *got = malloc(cap * sizeof(float));
	ck_assert_ptr_nonnull(base);
	ck_assert_ptr_nonnull(got);
	int compared = 0;
	for (int li = 0; li < NLENS; li++) {
		int n = lens[li];
		size_t used = run_under(KERNEL_ISA_BASE, c, n, base, cap);
		for (int isa = KERNEL_ISA_BASE + 1; isa < KERNEL_ISA_COUNT; isa++) {
			if (isa > (int)kernel_isa_best())
				continue;
			ck_assert_uint_eq(run_under((enum kernel_isa)isa, c, n, got, cap), used);
			const char *name = kernel_isa_name((enum kernel_isa)isa);
			for (size_t i = 0; i < used; i++)
				if (memcmp(&base[i], &got[i], sizeof(float)))
					ck_abort_msg("%s n=%d %s: float %zu of %zu is %a, sse2 gives %a",
						     cases[c].name, n, name, i, used, got[i], base[i]);
			compared++;
		}
	}
	if (kernel_isa_best() < KERNEL_ISA_AVX512)
		fprintf(stderr, "%s: this CPU has no avx512f, compared %d runs\n", cases[c].name,
			compared);
	free(base);
	free(got);
}
END_TEST

START_TEST(test_isa_choice)
{
	enum kernel_isa best = kernel_isa_best();
	/* the choice made before main is the best one */
	ck_assert_int_eq(saved, best);
	ck_assert_int_eq(kernel_isa_set(KERNEL_ISA_BASE), 0);
	ck_assert_int_eq(kernel_isa(), KERNEL_ISA_BASE);
	ck_assert_int_eq(kernel_isa_set(KERNEL_ISA_COUNT), -ENOTSUP);
	ck_assert_int_eq(kernel_isa_set((enum kernel_isa)-1), -ENOTSUP);
	ck_assert_int_eq(kernel_isa(), KERNEL_ISA_BASE);
	if (best < KERNEL_ISA_AVX512)
		ck_assert_int_eq(kernel_isa_set(KERNEL_ISA_AVX512), -ENOTSUP);
	ck_assert_str_eq(kernel_isa_name(KERNEL_ISA_AVX512), "avx512f");
	ck_assert_str_eq(kernel_isa_name(KERNEL_ISA_COUNT), "?");
}
END_TEST

static Suite *isa_suite(void)
{
	Suite *s = suite_create("kernel_isa");
	TCase *tc = tcase_create("choice");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_isa_choice);
	suite_add_tcase(s, tc);
	tc = tcase_create("variants bits");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_variants_bits, 0, NCASES);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(isa_suite());
	int failed;
	blas_set_threads(1);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
