/* safetensors and JSON files: round trips, the exact byte layout, a
 * hand-built file, every truncation and a catalogue of malformed headers
 * (each refused with a one-line error naming the file), and atomic writes
 * that leave no temp file and an existing file intact when they fail. */
#include <check.h>
#include <cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/ckpt/safetensors.h"
#include "host/util/mem.h"

static char dir[64];
static char err[512];

/* one directory per TCase, made and removed by the parent process so a
 * failing (forked) test leaves nothing behind */
static void setup(void)
{
	strcpy(dir, "/tmp/check_st.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	err[0] = '\0';
}

static int rm_one(const char *p, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)type;
	(void)ftw;
	return remove(p);
}

static void teardown(void)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static char *path_in(const char *name)
{
	static char buf[4][256];
	static int next;
	char *p = buf[next++ % 4];
	snprintf(p, 256, "%s/%s", dir, name);
	return p;
}

static int exists(const char *p)
{
	struct stat st;
	return lstat(p, &st) == 0;
}

static uint8_t *slurp(const char *p, size_t *len)
{
	FILE *f = fopen(p, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc((size_t)n + 1);
	ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return b;
}

static void spit(const char *p, const void *b, size_t len)
{
	FILE *f = fopen(p, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite(b, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
}

/* header length field + header text + data bytes */
static void make_file(const char *p, uint64_t hlen_field, const char *header, const void *data,
		      size_t dlen)
{
	size_t hl = strlen(header);
	uint8_t *b = malloc(8 + hl + dlen + 1);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(hlen_field >> (8 * i));
	memcpy(b + 8, header, hl);
	if (dlen)
		memcpy(b + 8 + hl, data, dlen);
	spit(p, b, 8 + hl + dlen);
	free(b);
}

/* ---- round trip ---- */

START_TEST(test_roundtrip)
{
	float emb[12], norm[3] = { 1, 1.5f, -0.0f }, scalar = 42.5f;
	for (int i = 0; i < 12; i++)
		emb[i] = (float)i * 0.37f - 2.0f;
	struct st_tensor t[4] = {
		{ "model.embed_tokens.weight", 2, { 4, 3 }, emb, ST_F32 },
		{ "scalar", 0, { 0 }, &scalar, ST_F32 },
		{ "empty", 2, { 0, 5 }, NULL, ST_F32 },
		{ "model.norm.weight", 1, { 3 }, norm, ST_F32 },
	};
	const char *meta[] = { "format", "pt", "note", "h\xc3\xa9llo \"quoted\"\n", NULL };
	const char *p = path_in("model.safetensors");
	ck_assert_int_eq(st_write(p, t, 4, meta, err, sizeof(err)), 0);
	ck_assert(!exists(path_in("model.safetensors.tmp")));

	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_int_eq(st_count(f), 4);
	for (int i = 0; i < 4; i++) {
		/* data-section order is the order written */
		const struct st_entry *e = st_entry_at(f, i);
		ck_assert_str_eq(e->name, t[i].name);
		ck_assert_ptr_eq(st_find(f, t[i].name), e);
		ck_assert_int_eq(e->ndim, t[i].ndim);
		int64_t numel = 1;
		for (int d = 0; d < e->ndim; d++) {
			ck_assert_int_eq(e->shape[d], t[i].shape[d]);
			numel *= t[i].shape[d];
		}
		ck_assert_int_eq(e->numel, numel);
		ck_assert_str_eq(e->dtype, "F32");
		if (numel)
			ck_assert(!memcmp(e->data, t[i].data, sizeof(float) * (size_t)numel));
	}
	ck_assert_ptr_null(st_entry_at(f, 4));
	ck_assert_ptr_null(st_entry_at(f, -1));
	ck_assert_ptr_null(st_find(f, "model.missing"));
	ck_assert_str_eq(st_meta(f, "format"), "pt");
	ck_assert_str_eq(st_meta(f, "note"), meta[3]);
	ck_assert_ptr_null(st_meta(f, "absent"));
	st_close(f);

	/* overwriting replaces the file */
	struct st_tensor one = { "only", 1, { 2 }, norm, ST_F32 };
	ck_assert_int_eq(st_write(p, &one, 1, NULL, err, sizeof(err)), 0);
	f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_int_eq(st_count(f), 1);
	ck_assert_ptr_null(st_find(f, "scalar"));
	ck_assert_ptr_null(st_meta(f, "format"));
	ck_assert_float_eq(st_find(f, "only")->data[1], 1.5f);
	st_close(f);

	/* no tensors at all is a valid file */
	ck_assert_int_eq(st_write(p, NULL, 0, NULL, err, sizeof(err)), 0);
	f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_int_eq(st_count(f), 0);
	ck_assert_ptr_null(st_find(f, "x"));
	st_close(f);
}
END_TEST

START_TEST(test_layout_bytes)
{
	float v[2] = { 1.0f, -2.0f };
	struct st_tensor t = { "a", 1, { 2 }, v, ST_F32 };
	const char *p = path_in("a.safetensors");
	ck_assert_int_eq(st_write(p, &t, 1, NULL, err, sizeof(err)), 0);
	const char *json = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	size_t jl = strlen(json), hl = (jl + 7) / 8 * 8, len;
	ck_assert_int_eq(jl, 54);
	ck_assert_int_eq(hl, 56);
	uint8_t *b = slurp(p, &len);
	ck_assert_int_eq(len, 8 + hl + 8);
	const uint8_t len8[8] = { 56, 0, 0, 0, 0, 0, 0, 0 };
	ck_assert(!memcmp(b, len8, 8));
	ck_assert(!memcmp(b + 8, json, jl));
	for (size_t i = jl; i < hl; i++)
		ck_assert_int_eq(b[8 + i], ' ');
	/* data starts at 8 + N, little-endian IEEE floats */
	const uint8_t data[8] = { 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0 };
	ck_assert(!memcmp(b + 8 + hl, data, 8));
	free(b);
}
END_TEST

START_TEST(test_hand_built)
{
	/* unpadded header, BF16 first so the F32 tensor sits at an odd
	 * offset of the file: the reader must still hand back aligned floats */
	const char *header =
		"{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [6, 22]},"
		" \"__metadata__\": {\"format\": \"pt\"},"
		" \"h\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 6]}}";
	uint8_t data[22] = {
		0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f, /* bf16 1.0, -2.0, 0.5 */
		0x00, 0x00, 0xc0, 0x3f, /* 1.5 */
		0x00, 0x00, 0x80, 0xbe, /* -0.25 */
		0x00, 0x00, 0x40, 0x40, /* 3 */
		0x00, 0x00, 0x20, 0x41, /* 10 */
	};
	ck_assert_int_ne(strlen(header) % 4, 0);
	const char *p = path_in("hand.safetensors");
	make_file(p, strlen(header), header, data, sizeof(data));
	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_int_eq(st_count(f), 2);
	ck_assert_str_eq(st_entry_at(f, 0)->name, "h");
	ck_assert_str_eq(st_entry_at(f, 1)->name, "w");
	const struct st_entry *w = st_find(f, "w"), *h = st_find(f, "h");
	ck_assert_int_eq(w->ndim, 2);
	ck_assert_int_eq(w->shape[0], 2);
	ck_assert_int_eq(w->shape[1], 2);
	ck_assert_int_eq((uintptr_t)w->data % sizeof(float), 0);
	ck_assert_float_eq(w->data[0], 1.5f);
	ck_assert_float_eq(w->data[1], -0.25f);
	ck_assert_float_eq(w->data[2], 3.0f);
	ck_assert_float_eq(w->data[3], 10.0f);
	ck_assert_str_eq(h->dtype, "BF16");
	ck_assert_int_eq(h->numel, 3);
	ck_assert_float_eq(h->data[0], 1.0f);
	ck_assert_float_eq(h->data[1], -2.0f);
	ck_assert_float_eq(h->data[2], 0.5f);
	ck_assert_str_eq(st_meta(f, "format"), "pt");
	st_close(f);
}
END_TEST

/* ---- dtypes: BF16 written, F16 read; ranged reads ---- */

/* The bfloat16 nearest to x, found by comparing both neighbours in
 * double (ties to the even one); NaN checked apart. */
static uint16_t nearest_bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
	if (isinf(x))
		return (uint16_t)(lo >> 16);
	float flo, fhi;
	memcpy(&flo, &lo, sizeof(flo));
	memcpy(&fhi, &hi, sizeof(fhi));
	/* above the largest bfloat16 the next step up is 2^128 (infinity) */
	double dhi = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(ldexp(1.0, 128), x) : (double)fhi;
	double dl = fabs((double)x - flo), dh = fabs((double)x - dhi);
	if (dl < dh || (dl == dh && !(lo & 0x10000u)))
		return (uint16_t)(lo >> 16);
	return (uint16_t)(hi >> 16);
}

START_TEST(test_bf16_write)
{
	float v[] = { 1.0f, -2.5f, 0.1f, 3.14159265f, 1e-40f, -0.0f, 65504.0f, 3.4e38f, INFINITY,
		      -INFINITY, NAN, 1.00390625f /* 1 + 2^-8: a tie, stays 1 */,
		      1.01171875f /* 1 + 3 * 2^-8: a tie, up to 1 + 2^-6 */, 0.0f };
	enum { N = sizeof(v) / sizeof(v[0]) };
	float big[1000];
	uint64_t r = 77;
	for (int i = 0; i < 1000; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t u = (uint32_t)(r >> 32) & 0xbfffffffu; /* no NaN or inf */
		memcpy(&big[i], &u, sizeof(u));
	}
	struct st_tensor t[2] = { { "v", 1, { N }, v, ST_BF16 }, { "big", 2, { 10, 100 }, big, ST_BF16 } };
	const char *p = path_in("bf16.safetensors");
	ck_assert_int_eq(st_write(p, t, 2, NULL, err, sizeof(err)), 0);
	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	for (int k = 0; k < 2; k++) {
		const struct st_entry *e = st_find(f, t[k].name);
		ck_assert_str_eq(e->dtype, "BF16");
		ck_assert_int_eq(e->nbytes, 2 * (uint64_t)e->numel);
		for (int64_t i = 0; i < e->numel; i++) {
			float x = t[k].data[i];
			uint32_t got;
			memcpy(&got, &e->data[i], sizeof(got));
			ck_assert_int_eq(got & 0xffff, 0);
			if (isnan(x)) {
				ck_assert(isnan(e->data[i]));
				continue;
			}
			ck_assert_msg((got >> 16) == nearest_bf16(x), "%s[%lld] %a: wrote %#x, nearest %#x",
				      t[k].name, (long long)i, x, got >> 16, nearest_bf16(x));
			ck_assert_int_eq(st_bf16(x), got >> 16);
		}
	}
	/* the ties went to even; 3.4e38 rounds up past the largest bf16 */
	ck_assert_float_eq(st_find(f, "v")->data[11], 1.0f);
	ck_assert_float_eq(st_find(f, "v")->data[12], 1.015625f);
	ck_assert(isinf(st_find(f, "v")->data[7]));
	ck_assert_uint_eq(st_bf16(-0.0f), 0x8000);
	st_close(f);
}
END_TEST

/* The value of IEEE half h, from its fields (not the reader's code) */
static double half_value(uint16_t h)
{
	int sgn = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
	return sgn ? -v : v;
}

START_TEST(test_f16_read)
{
	static const uint16_t h[] = { 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x7c00, 0xfc00,
				      0x7e00, 0x8000, 0x3555, 0x8001, 0x5640 };
	enum { N = sizeof(h) / sizeof(h[0]) };
	char header[160];
	snprintf(header, sizeof(header), "{\"h\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[0,%d]}}",
		 N, 2 * N);
	const char *p = path_in("f16.safetensors");
	make_file(p, strlen(header), header, h, sizeof(h));
	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	const struct st_entry *e = st_find(f, "h");
	for (int i = 0; i < N; i++) {
		double want = half_value(h[i]);
		if (isnan(want))
			ck_assert(isnan(e->data[i]));
		else
			ck_assert_msg((double)e->data[i] == want && !!signbit(e->data[i]) == !!signbit(want),
				      "half %#x: %a, want %a", h[i], e->data[i], want);
	}
	st_close(f);
}
END_TEST

/* A file of one 2-byte tensor 'x' (dtype, n values h), its header open. */
static struct st_file *open_halves(const char *name, const char *dtype, const uint16_t *h, int n)
{
	char header[160];
	int len = snprintf(header, sizeof(header), "{\"x\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[0,%d]}}",
			   dtype, n, 2 * n);
	while (len % 8)  /* padded as the format says: the values at their alignment, so st_map reads them in place */
		header[len++] = ' ';
	header[len] = '\0';
	const char *p = path_in(name);
	make_file(p, strlen(header), header, h, 2 * (size_t)n);
	struct st_file *f = st_open_header(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	return f;
}

/* BF16 widens to exactly the float32 whose upper half it is, every one
 * of the 65,536 bit patterns (NaNs with their payloads, infinities,
 * denormals, -0): read from element 0, 1 and 7 into destinations at
 * each 4-byte offset of 16 (every head the SSE2 loop aligns), lengths
 * that end at no vector width, through st_read and bounce buffers of 1,
 * 7 and 4096 values, and out of the file's mapping (st_map). */
START_TEST(test_bf16_every_pattern)
{
	enum { N = 65536 };
	uint16_t *h = malloc(2 * N);
	float *got = malloc(sizeof(float) * (N + 4));
	uint16_t buf[4096];
	ck_assert(h && got);
	for (int i = 0; i < N; i++)
		h[i] = (uint16_t)(i * 40503u);  /* odd: every pattern once, neighbours far apart */
	struct st_file *f = open_halves("bf16all.safetensors", "BF16", h, N);
	const struct st_entry *e = st_find(f, "x");
	static const size_t caps[] = { 1, 7, 4096 };
	static const int firsts[] = { 0, 1, 7 };  /* the source's alignment */
	ck_assert_uint_eq(st_header_bytes(f) % 8, 0);
	for (int mapped = 0; mapped < 2; mapped++) {  /* pread and a bounce buffer, then out of the mapping */
		ck_assert_int_eq(mapped ? st_map(f) : 0, 0);
		for (int fi = 0; fi < 3; fi++)
			for (int dst_off = 0; dst_off < 4; dst_off++)  /* every head alignment of the destination */
				for (int c = -1; c < 3; c++) {
					int first = firsts[fi];
					size_t n = (size_t)(N - first - 3 * (first % 3));
					if (c >= 0 && caps[c] == 1)
						n = 1001;  /* one value at a time: a short run */
					float *d = got + dst_off;
					memset(got, 0xa5, sizeof(float) * (N + 4));
					int rc = c < 0 ? st_read(f, e, (uint64_t)first, n, d, err, sizeof(err))
						       : st_read_buf(f, e, (uint64_t)first, n, d, buf, caps[c], err, sizeof(err));
					ck_assert_msg(rc == 0, "%s", err);
					size_t bad = n;  /* the first wrong value (one assert: check marks every one) */
					for (size_t i = 0; i < n && bad == n; i++) {
						uint32_t u;
						memcpy(&u, &d[i], sizeof(u));
						if (u != (uint32_t)h[first + i] << 16)
							bad = i;
					}
					ck_assert_msg(bad == n, "mapped %d first %d offset %d cap %d: value %zu (bf16 %#x) is %a",
						      mapped, first, dst_off, c, bad, bad < n ? h[first + bad] : 0, bad < n ? d[bad] : 0.0f);
					uint32_t after;
					memcpy(&after, &d[n], sizeof(after));
					ck_assert_uint_eq(after, 0xa5a5a5a5u);  /* nothing past the n floats */
				}
	}
	st_close(f);
	free(h);
	free(got);
}
END_TEST

/* BF16 widening and F32 copying as the loader runs them for two devices:
 * every BF16 bit pattern (F32: 65,536 values with as many different
 * bits) into one destination and into two at once (st_read_rows with
 * dst2), by pread and out of the mapping, and runs of 300-318 values
 * with the destination at each other 4-byte offset of 64 (every head
 * the AVX-512 loops align), the second destination at the same
 * alignment (one pass for both) or off by 4 and 32 bytes (one after
 * the other); lengths ending at no vector width; nothing written past
 * either. Loops 0 and 2 force SSE2
 * (MESHRUN_LOAD_AVX512=0), 1 and 3 take AVX-512 when the CPU has it;
 * 0-1 BF16, 2-3 F32. */
START_TEST(test_two_dests)
{
	enum { N = 65536 };
	int avx = _i & 1, f32 = _i >> 1;
	ck_assert_int_eq(avx ? unsetenv("MESHRUN_LOAD_AVX512") : setenv("MESHRUN_LOAD_AVX512", "0", 1), 0);
	__builtin_cpu_init();
	int has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
	ck_assert_int_eq(util_stream_avx512(), avx ? has : 0);  /* this process's pick (each test forks) */
	uint16_t *h = malloc(2 * N);
	uint32_t *w = malloc(4 * N);
	float *got = malloc(sizeof(float) * (N + 16)), *got2 = malloc(sizeof(float) * (N + 48));
	uint16_t buf[4096];
	ck_assert(h && w && got && got2);
	for (int i = 0; i < N; i++) {
		h[i] = (uint16_t)(i * 40503u);  /* odd: every pattern once, neighbours far apart */
		w[i] = (uint32_t)i * 2654435761u;
	}
	struct st_file *f;
	if (f32) {
		char header[160];
		int len = snprintf(header, sizeof(header),
				   "{\"x\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", N, 4 * N);
		while (len % 8)
			header[len++] = ' ';
		header[len] = '\0';
		const char *p = path_in("f32two.safetensors");
		make_file(p, strlen(header), header, w, 4 * (size_t)N);
		f = st_open_header(p, err, sizeof(err));
		ck_assert_msg(f, "%s", err);
	} else {
		f = open_halves("bf16two.safetensors", "BF16", h, N);
	}
	const struct st_entry *e = st_find(f, "x");
	static const int firsts[] = { 0, 1, 7 }, skew[] = { -1, 0, 1, 8 };  /* -1: no second destination */
	for (int mapped = 0; mapped < 2; mapped++) {
		ck_assert_int_eq(mapped ? st_map(f) : 0, 0);
		for (int fi = 0; fi < 3; fi++)
			for (int off = 0; off < 16; off++)
				for (int k = 0; k < 4; k++) {
					int first = firsts[fi];
					/* every value once per destination layout at offset 0;
					 * elsewhere a short run: head, loop, tail */
					size_t n = off ? (size_t)(300 + 7 * fi + off % 5) : (size_t)(N - first - 16);
					float *d = got + off, *d2 = skew[k] < 0 ? NULL : got2 + off + skew[k];
					memset(got, 0xa5, sizeof(float) * (n + 16));
					memset(got2, 0xa5, sizeof(float) * (n + 48));
					struct st_rows r = { .first = (uint64_t)first, .n = n, .rows = 1, .dst = d, .dst2 = d2 };
					int rc = st_read_rows(f, e, &r, buf, 4096, err, sizeof(err));
					ck_assert_msg(rc == 0, "%s", err);
					size_t bad = n;  /* the first wrong value (one assert: check marks every one) */
					for (size_t i = 0; i < n && bad == n; i++) {
						uint32_t want = f32 ? w[first + i] : (uint32_t)h[first + i] << 16, u, u2 = want;
						memcpy(&u, &d[i], sizeof(u));
						if (d2)
							memcpy(&u2, &d2[i], sizeof(u2));
						if (u != want || u2 != want)
							bad = i;
					}
					ck_assert_msg(bad == n, "f32 %d avx512 %d mapped %d first %d offset %d skew %d: value %zu wrong",
						      f32, util_stream_avx512(), mapped, first, off, skew[k], bad);
					uint32_t after, after2 = 0xa5a5a5a5u;
					memcpy(&after, &d[n], sizeof(after));
					if (d2)
						memcpy(&after2, &d2[n], sizeof(after2));
					ck_assert_uint_eq(after, 0xa5a5a5a5u);  /* nothing past the n floats */
					ck_assert_uint_eq(after2, 0xa5a5a5a5u);
				}
	}
	st_close(f);
	free(h);
	free(w);
	free(got);
	free(got2);
}
END_TEST

/* F16 widens exactly, every one of the 65,536 bit patterns: the value
 * (half_value's, computed in double), its sign (-0 too), and NaNs with
 * their payloads kept in the upper mantissa bits; read out of the
 * file's mapping, the same bits. */
START_TEST(test_f16_every_pattern)
{
	enum { N = 65536 };
	uint16_t *h = malloc(2 * N);
	float *got = malloc(sizeof(float) * N), *mapped = malloc(sizeof(float) * N);
	ck_assert(h && got && mapped);
	for (int i = 0; i < N; i++)
		h[i] = (uint16_t)i;
	struct st_file *f = open_halves("f16all.safetensors", "F16", h, N);
	ck_assert_msg(st_read(f, st_find(f, "x"), 0, N, got, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(st_map(f), 0);  /* out of the mapping: the same bits */
	ck_assert_msg(st_read(f, st_find(f, "x"), 0, N, mapped, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(!memcmp(got, mapped, sizeof(float) * N), "F16 out of the mapping differs");
	int bad = N;  /* the first wrong value (one assert: check marks every one) */
	for (int i = 0; i < N && bad == N; i++) {
		double want = half_value(h[i]);
		uint32_t u;
		memcpy(&u, &got[i], sizeof(u));
		if (isnan(want) ? u != ((uint32_t)(h[i] & 0x8000) << 16 | 0x7f800000u | (uint32_t)(h[i] & 0x3ff) << 13)
				: (double)got[i] != want || !!signbit(got[i]) != !!signbit(want))
			bad = i;
	}
	ck_assert_msg(bad == N, "half %#x: %a, want %a", bad, bad < N ? got[bad] : 0.0f,
		      bad < N ? half_value((uint16_t)bad) : 0.0);
	st_close(f);
	free(h);
	free(got);
	free(mapped);
}
END_TEST

/* st_open_header reads the header only; st_read and st_read_rows read
 * exactly the elements asked for, and count their bytes. */
START_TEST(test_ranged_read)
{
	float a[60], b[8];
	for (int i = 0; i < 60; i++)
		a[i] = (float)i - 7.5f;  /* exact in bfloat16 */
	for (int i = 0; i < 8; i++)
		b[i] = 1.0f / (float)(i + 1);
	struct st_tensor t[2] = { { "a", 2, { 6, 10 }, a, ST_BF16 }, { "b", 1, { 8 }, b, ST_F32 } };
	const char *p = path_in("ranged.safetensors");
	ck_assert_int_eq(st_write(p, t, 2, NULL, err, sizeof(err)), 0);
	struct st_file *f = st_open_header(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	uint64_t h = st_header_bytes(f);
	ck_assert_uint_eq(st_bytes_read(f), h);
	const struct st_entry *ea = st_find(f, "a"), *eb = st_find(f, "b");
	ck_assert_ptr_null(ea->data);
	float out[10] = { 0 };
	ck_assert_int_eq(st_read(f, ea, 23, 5, out, err, sizeof(err)), 0);
	for (int i = 0; i < 5; i++)
		ck_assert_float_eq(out[i], a[23 + i]);
	ck_assert_uint_eq(st_bytes_read(f), h + 10);
	ck_assert_int_eq(st_read(f, eb, 6, 2, out, err, sizeof(err)), 0);
	ck_assert_float_eq(out[0], b[6]);
	ck_assert_float_eq(out[1], b[7]);
	ck_assert_uint_eq(st_bytes_read(f), h + 18);
	ck_assert_int_eq(st_read(f, eb, 6, 3, out, err, sizeof(err)), -ERANGE);
	ck_assert_msg(strstr(err, "outside tensor 'b'"), "%s", err);
	ck_assert_uint_eq(st_bytes_read(f), h + 18);
	/* a column block: rows 1-4 of a's columns 3-6, and b's elements
	 * {1, 2, 4, 5}, by pread and out of the mapping, into rows 5 floats
	 * apart and into a second destination too; the bytes of the elements
	 * read are counted, once, either way */
	uint16_t buf[3];
	for (int mapped = 0; mapped < 2; mapped++) {
		float blk[20], two[20];
		uint64_t before = st_bytes_read(f);
		ck_assert_int_eq(mapped ? st_map(f) : 0, 0);
		memset(blk, 0xa5, sizeof(blk));
		memset(two, 0xa5, sizeof(two));
		struct st_rows r = { .first = 13, .fstride = 10, .n = 4, .rows = 4, .dst = blk, .dst2 = two, .dstride = 5 };
		ck_assert_msg(st_read_rows(f, ea, &r, buf, 3, err, sizeof(err)) == 0, "%s", err);
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 5; j++) {
				uint32_t u;
				memcpy(&u, &blk[5 * i + j], sizeof(u));
				ck_assert_msg(j < 4 ? blk[5 * i + j] == a[13 + 10 * i + j] : u == 0xa5a5a5a5u,
					      "mapped %d row %d col %d: %g", mapped, i, j, blk[5 * i + j]);
			}
		ck_assert(!memcmp(blk, two, sizeof(blk)));
		r = (struct st_rows){ .first = 1, .fstride = 3, .n = 2, .rows = 2, .dst = blk, .dst2 = two, .dstride = 2 };
		ck_assert_int_eq(st_read_rows(f, eb, &r, buf, 3, err, sizeof(err)), 0);
		ck_assert(blk[0] == b[1] && blk[1] == b[2] && blk[2] == b[4] && blk[3] == b[5]);
		ck_assert(!memcmp(blk, two, 4 * sizeof(float)));
		ck_assert_uint_eq(st_bytes_read(f), before + 32 + 16);
		/* the last row ends past the tensor */
		r.rows = 3;
		ck_assert_int_eq(st_read_rows(f, eb, &r, buf, 3, err, sizeof(err)), -ERANGE);
		ck_assert_msg(strstr(err, "outside tensor 'b'") && !strchr(err, '\n'), "%s", err);
	}
	st_close(f);

	/* a dtype that does not load is refused by name when read */
	const char *hd = "{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}";
	const uint8_t q[4] = { 1, 2, 3, 4 };
	p = path_in("fp8.safetensors");
	make_file(p, strlen(hd), hd, q, 4);
	f = st_open_header(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert(!st_find(f, "q")->loads);
	ck_assert_int_eq(st_read(f, st_find(f, "q"), 0, 4, out, err, sizeof(err)), -ENOTSUP);
	ck_assert_msg(strstr(err, "tensor 'q' has dtype 'F8_E4M3' (only F32, BF16 and F16 load)"), "%s", err);
	st_close(f);
	ck_assert_ptr_null(st_open(p, err, sizeof(err)));
}
END_TEST

/* ---- refusals ---- */

START_TEST(test_truncated)
{
	float a[3] = { 1, 2, 3 }, b[2] = { 4, 5 };
	struct st_tensor t[2] = { { "a", 1, { 3 }, a, ST_F32 }, { "b", 2, { 1, 2 }, b, ST_F32 } };
	const char *p = path_in("full.safetensors"), *q = path_in("cut.safetensors");
	ck_assert_int_eq(st_write(p, t, 2, NULL, err, sizeof(err)), 0);
	size_t len;
	uint8_t *bytes = slurp(p, &len);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | bytes[i];
	ck_assert_int_eq(len, 8 + hlen + 20);
	for (size_t cut = 0; cut < len; cut++) {
		spit(q, bytes, cut);
		err[0] = '\0';
		struct st_file *f = st_open(q, err, sizeof(err));
		ck_assert_msg(!f, "a file cut to %zu of %zu bytes was accepted", cut, len);
		ck_assert_msg(strstr(err, q) && !strncmp(err, "safetensors: ", 13) &&
				      !strchr(err, '\n'),
			      "cut %zu: bad error '%s'", cut, err);
		if (cut < 8)
			ck_assert_msg(strstr(err, "too short"), "cut %zu: %s", cut, err);
		else if (cut < 8 + hlen)
			ck_assert_msg(strstr(err, "header length"), "cut %zu: %s", cut, err);
		else
			ck_assert_msg(strstr(err, "outside the"), "cut %zu: %s", cut, err);
	}
	free(bytes);
	/* and a missing file */
	ck_assert_ptr_null(st_open(path_in("none.safetensors"), err, sizeof(err)));
	ck_assert_msg(strstr(err, "unable to open") && strstr(err, "none.safetensors"), "%s", err);
	ck_assert_ptr_null(st_open(dir, err, sizeof(err)));
	ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
}
END_TEST

/* A file cut short after its header was checked: a mapping made before
 * the cut reads -EIO (its pages are populated before they are read:
 * no SIGBUS), and one asked for after it is refused (-ESTALE) and the
 * pread that follows says -EIO; one line naming the file and tensor. */
START_TEST(test_truncated_mapped)
{
	enum { N = 8192 };  /* 32 KiB: the cut leaves whole pages out */
	float *x = malloc(sizeof(float) * N), out[1024];
	ck_assert(x);
	for (int i = 0; i < N; i++)
		x[i] = (float)i;
	struct st_tensor t = { "x", 1, { N }, x, ST_F32 };
	const char *p = path_in("mapcut.safetensors");
	ck_assert_int_eq(st_write(p, &t, 1, NULL, err, sizeof(err)), 0);
	struct st_file *f = st_open_header(p, err, sizeof(err)), *g = st_open_header(p, err, sizeof(err));
	ck_assert_msg(f && g, "%s", err);
	const struct st_entry *e = st_find(f, "x");
	ck_assert_int_eq(st_map(f), 0);
	ck_assert_int_eq(st_read(f, e, 4096, 1024, out, err, sizeof(err)), 0);
	ck_assert(out[0] == 4096.0f && out[1023] == 5119.0f);
	ck_assert_int_eq(truncate(p, (off_t)(st_header_bytes(f) + 100)), 0);
	uint64_t before = st_bytes_read(f);
	ck_assert_int_eq(st_read(f, e, 4096, 1024, out, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, p) && strstr(err, "tensor 'x': file ended early") && !strchr(err, '\n'), "%s",
		      err);
	ck_assert_uint_eq(st_bytes_read(f), before);
	ck_assert_int_eq(st_map(g), -ESTALE);
	ck_assert_int_eq(st_read(g, st_find(g, "x"), 4096, 1024, out, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "file ended early"), "%s", err);
	st_close(f);
	st_close(g);
	free(x);
}
END_TEST

/* A file larger than the address space left: st_map fails (and says
 * so again without trying), and the reads stay preads with the same
 * values and byte count (a sparse 8 GiB tensor, under a 4 GiB limit). */
START_TEST(test_map_refused)
{
	const uint64_t n = (uint64_t)1 << 31;
	char header[128];
	int len = snprintf(header, sizeof(header), "{\"x\":{\"dtype\":\"F32\",\"shape\":[%llu],"
			   "\"data_offsets\":[0,%llu]}}", (unsigned long long)n, (unsigned long long)(4 * n));
	while (len % 8)
		header[len++] = ' ';
	header[len] = '\0';
	const char *p = path_in("sparse.safetensors");
	make_file(p, (uint64_t)len, header, NULL, 0);
	ck_assert_int_eq(truncate(p, (off_t)(8 + (uint64_t)len + 4 * n)), 0);
	struct st_file *f = st_open_header(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	struct rlimit old, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
	lim = old;
	lim.rlim_cur = (rlim_t)4 << 30;
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
	ck_assert_int_eq(st_map(f), -ENOMEM);
	ck_assert_int_eq(st_map(f), -ENOMEM);
	float out[16];
	memset(out, 0xa5, sizeof(out));
	uint64_t before = st_bytes_read(f);
	ck_assert_msg(st_read(f, st_find(f, "x"), n - 16, 16, out, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < 16; i++)
		ck_assert(out[i] == 0.0f);
	ck_assert_uint_eq(st_bytes_read(f), before + 64);
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
	st_close(f);
	unlink(p);
}
END_TEST

static const struct bad_case {
	const char *header;
	size_t dlen;
	const char *want; /* substring of the error */
} bad_cases[] = {
	{ "{not json", 0, "header is not valid JSON" },
	{ "{} trailing", 0, "header is not valid JSON" },
	{ "", 0, "header is not valid JSON" },
	{ "[1, 2]", 0, "header is not a JSON object" },
	{ "{\"x\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 16]}}", 16,
	  "tensor 'x' has dtype 'F64' (only F32, BF16 and F16 load)" },
	{ "{\"x\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 1,
	  "tensor 'x' has unknown dtype 'Q4'" },
	{ "{\"x\": {\"dtype\": 7, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "tensor 'x' needs" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8, "tensor 'x' needs" },
	{ "{\"x\": 5}", 0, "tensor 'x' needs" },
	{ "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]}}", 8,
	  "tensor 'model.norm.weight' data_offsets [0, 12] outside the 8-byte data section" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8,
	  "tensor 'x' data_offsets must be" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0.5, 8]}}", 8,
	  "tensor 'x' data_offsets must be" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 9]}}", 9,
	  "tensor 'x' data_offsets must be" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 8,
	  "tensor 'x' data_offsets must be" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 1e300]}}", 8,
	  "tensor 'x' data_offsets must be" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
	  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
	  12, "tensor 'b' data_offsets [4, 12] overlap tensor 'a'" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
	  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
	  8, "tensor 'b' data_offsets [0, 8] overlap tensor 'a'" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
	  " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
	  12, "bytes [4, 8) of the data section belong to no tensor" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8,
	  "tensors cover 4 bytes of the 8-byte data section" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}", 12,
	  "tensor 'x' shape [2, 2] of F32 does not fit data_offsets [0, 12]" },
	{ "{\"x\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 12]}}", 12,
	  "tensor 'x' shape [3] of BF16 does not fit" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 0,
	  "tensor 'x' shape [4294967296, 4294967296] of F32 does not fit" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 0]}}", 0,
	  "tensor 'x' shape entry 0 is not a non-negative integer" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [1, \"2\"], \"data_offsets\": [0, 8]}}", 8,
	  "tensor 'x' shape entry 1" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4,
	  "tensor 'x' has 9 dimensions" },
	{ "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
	  " \"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
	  8, "tensor 'x' appears twice" },
	{ "{\"__metadata__\": {\"a\": 1}}", 0, "__metadata__ value of 'a' is not a string" },
	{ "{\"__metadata__\": [\"a\"]}", 0, "__metadata__ is not an object" },
	{ "{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "__metadata__ appears twice" },
};

START_TEST(test_bad_header)
{
	const struct bad_case *c = &bad_cases[_i];
	const char *p = path_in("bad.safetensors");
	uint8_t zeros[64] = { 0 };
	make_file(p, strlen(c->header), c->header, zeros, c->dlen);
	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(!f, "case %d accepted: %s", _i, c->header);
	char want[512];
	snprintf(want, sizeof(want), "safetensors: '%s': %s", p, c->want);
	ck_assert_msg(!strncmp(err, want, strlen(want)), "case %d: got '%s', want '%s...'", _i, err,
		      want);
	ck_assert(!strchr(err, '\n'));
}
END_TEST

START_TEST(test_bad_lengths)
{
	const char *p = path_in("len.safetensors");
	const char *h = "{}";
	/* header length beyond the file */
	make_file(p, 1000, h, NULL, 0);
	ck_assert_ptr_null(st_open(p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "header length 1000 exceeds the rest of the file (2 bytes)"), "%s", err);
	/* beyond the 100 MiB limit (and the file) */
	make_file(p, 200u << 20, h, NULL, 0);
	ck_assert_ptr_null(st_open(p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "100 MiB"), "%s", err);
	/* a length that wraps when added to 8 */
	make_file(p, UINT64_MAX - 3, h, NULL, 0);
	ck_assert_ptr_null(st_open(p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "header length"), "%s", err);
	/* a NUL inside the header */
	uint8_t b[12] = { 4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' ' };
	spit(p, b, sizeof(b));
	ck_assert_ptr_null(st_open(p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "not valid JSON"), "%s", err);
	/* and the same with a space is fine */
	b[10] = ' ';
	spit(p, b, sizeof(b));
	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_int_eq(st_count(f), 0);
	st_close(f);
}
END_TEST

START_TEST(test_write_invalid)
{
	float v[4] = { 0 };
	const char *p = path_in("w.safetensors");
	struct st_tensor dup[2] = { { "a", 1, { 1 }, v, ST_F32 }, { "a", 1, { 1 }, v, ST_F32 } };
	ck_assert_int_eq(st_write(p, dup, 2, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "'a' used twice"), "%s", err);
	struct st_tensor bad[] = {
		{ "__metadata__", 1, { 1 }, v, ST_F32 },
		{ "", 1, { 1 }, v, ST_F32 },
		{ NULL, 1, { 1 }, v, ST_F32 },
		{ "x", 9, { 1 }, v, ST_F32 },
		{ "x", -1, { 1 }, v, ST_F32 },
		{ "x", 1, { -2 }, v, ST_F32 },
		{ "x", 1, { 3 }, NULL, ST_F32 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		ck_assert_int_eq(st_write(p, &bad[i], 1, NULL, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, p), "case %zu: %s", i, err);
	}
	const char *meta_odd[] = { "k", NULL, NULL };
	ck_assert_int_eq(st_write(p, dup, 1, meta_odd, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "metadata key 'k' has no value"), "%s", err);
	ck_assert(!exists(p));
	ck_assert(!exists(path_in("w.safetensors.tmp")));
}
END_TEST

/* ---- atomic writes ---- */

static void write_small(const char *p, float val)
{
	float v[2] = { val, val };
	struct st_tensor t = { "v", 1, { 2 }, v, ST_F32 };
	ck_assert_int_eq(st_write(p, &t, 1, NULL, err, sizeof(err)), 0);
}

static void assert_small(const char *p, float val)
{
	struct st_file *f = st_open(p, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_int_eq(st_count(f), 1);
	ck_assert_float_eq(st_find(f, "v")->data[1], val);
	st_close(f);
}

START_TEST(test_atomic_not_dir)
{
	/* tests run as root, so a permission failure cannot be relied on:
	 * make the parent a regular file instead */
	const char *plain = path_in("plain");
	spit(plain, "x", 1);
	char p[300];
	snprintf(p, sizeof(p), "%s/model.safetensors", plain);
	float v = 1;
	struct st_tensor t = { "v", 0, { 0 }, &v, ST_F32 };
	ck_assert_int_eq(st_write(p, &t, 1, NULL, err, sizeof(err)), -ENOTDIR);
	ck_assert_msg(strstr(err, "unable to create") && strstr(err, plain), "%s", err);

	cJSON *root = cJSON_CreateObject();
	cJSON_AddNumberToObject(root, "a", 1);
	snprintf(p, sizeof(p), "%s/config.json", plain);
	ck_assert_int_eq(json_write_atomic(p, root, err, sizeof(err)), -ENOTDIR);
	ck_assert_msg(strstr(err, "json: unable to create"), "%s", err);
	cJSON_Delete(root);
}
END_TEST

START_TEST(test_atomic_midwrite_failure)
{
	const char *p = path_in("m.safetensors"), *tmp = path_in("m.safetensors.tmp");
	write_small(p, 7.0f);

	/* a file-size limit makes the data write fail half way */
	size_t n = 1 << 16;
	float *big = calloc(n, sizeof(float));
	struct st_tensor t = { "v", 1, { (int64_t)n }, big, ST_F32 };
	struct rlimit old, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
	void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
	lim = old;
	lim.rlim_cur = 4096;
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	int rc = st_write(p, &t, 1, NULL, err, sizeof(err));
	setrlimit(RLIMIT_FSIZE, &old);
	signal(SIGXFSZ, oldsig);
	free(big);
	ck_assert_int_eq(rc, -EFBIG);
	ck_assert_msg(strstr(err, "unable to write") && strstr(err, tmp), "%s", err);
	ck_assert(!exists(tmp));
	assert_small(p, 7.0f);
}
END_TEST

START_TEST(test_atomic_tmp_occupied)
{
	/* something that is not our temp file sits at path.tmp: refuse, and
	 * neither it nor the existing file is touched */
	const char *p = path_in("o.safetensors"), *tmp = path_in("o.safetensors.tmp");
	write_small(p, 3.0f);
	ck_assert_int_eq(mkdir(tmp, 0755), 0);
	float v[2] = { 9, 9 };
	struct st_tensor t = { "v", 1, { 2 }, v, ST_F32 };
	ck_assert_int_lt(st_write(p, &t, 1, NULL, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "unable to create"), "%s", err);
	struct stat st;
	ck_assert_int_eq(stat(tmp, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	assert_small(p, 3.0f);

	/* a stale temp file from a crash is simply replaced */
	ck_assert_int_eq(rmdir(tmp), 0);
	spit(tmp, "junk", 4);
	write_small(p, 5.0f);
	assert_small(p, 5.0f);
	ck_assert(!exists(tmp));
}
END_TEST

/* ---- JSON files ---- */

START_TEST(test_json_files)
{
	const char *p = path_in("config.json");
	cJSON *root = cJSON_CreateObject();
	cJSON_AddStringToObject(root, "model_type", "llama");
	cJSON_AddNumberToObject(root, "hidden_size", 256);
	cJSON_AddNumberToObject(root, "rms_norm_eps", 1e-5);
	ck_assert_int_eq(json_write_atomic(p, root, err, sizeof(err)), 0);
	cJSON_Delete(root);
	ck_assert(!exists(path_in("config.json.tmp")));

	size_t len;
	uint8_t *b = slurp(p, &len);
	ck_assert(len > 0 && b[len - 1] == '\n');
	free(b);

	cJSON *back = json_read_file(p, err, sizeof(err));
	ck_assert_msg(back, "%s", err);
	ck_assert_str_eq(cJSON_GetObjectItem(back, "model_type")->valuestring, "llama");
	ck_assert_int_eq(cJSON_GetObjectItem(back, "hidden_size")->valueint, 256);
	ck_assert_double_eq(cJSON_GetObjectItem(back, "rms_norm_eps")->valuedouble, 1e-5);
	cJSON_Delete(back);

	ck_assert_ptr_null(json_read_file(path_in("missing.json"), err, sizeof(err)));
	ck_assert_msg(strstr(err, "json: unable to open") && strstr(err, "missing.json"), "%s", err);
	spit(p, "{\"a\": 1,,}", 10);
	ck_assert_ptr_null(json_read_file(p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "is not valid JSON (near byte ") && strstr(err, p), "%s", err);
	spit(p, "", 0);
	ck_assert_ptr_null(json_read_file(p, err, sizeof(err)));
	ck_assert_msg(strstr(err, "is not valid JSON"), "%s", err);
}
END_TEST

static Suite *st_suite(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc;

	tc = tcase_create("roundtrip");
	tcase_set_timeout(tc, 30);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_layout_bytes);
	tcase_add_test(tc, test_hand_built);
	tcase_add_test(tc, test_bf16_write);
	tcase_add_test(tc, test_f16_read);
	tcase_add_test(tc, test_bf16_every_pattern);
	tcase_add_loop_test(tc, test_two_dests, 0, 4);
	tcase_add_test(tc, test_f16_every_pattern);
	tcase_add_test(tc, test_ranged_read);
	suite_add_tcase(s, tc);

	tc = tcase_create("refusals");
	tcase_set_timeout(tc, 30);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_truncated);
	tcase_add_test(tc, test_truncated_mapped);
	tcase_add_test(tc, test_map_refused);
	tcase_add_loop_test(tc, test_bad_header, 0, (int)(sizeof(bad_cases) / sizeof(bad_cases[0])));
	tcase_add_test(tc, test_bad_lengths);
	tcase_add_test(tc, test_write_invalid);
	suite_add_tcase(s, tc);

	tc = tcase_create("atomic");
	tcase_set_timeout(tc, 30);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_atomic_not_dir);
	tcase_add_test(tc, test_atomic_midwrite_failure);
	tcase_add_test(tc, test_atomic_tmp_occupied);
	tcase_add_test(tc, test_json_files);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(st_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
