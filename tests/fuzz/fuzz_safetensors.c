/* (e) A safetensors file (host/ckpt/safetensors.h), or a checkpoint's
 * index (host/ckpt/hf_load.h).
 *
 * A file: the input is the whole file, written to a scratch path and
 * opened with st_open. Properties: a failure always says why; a file
 * that opens has entries whose shapes multiply to their element count
 * and whose data can be read in full (F32, BF16, F16), every name is
 * found by st_find; st_open_header of the same file reads only its
 * header, and st_read of a range of each tensor gives st_open's floats
 * and counts its bytes exactly; writing the tensors back with st_write
 * (when it accepts them: the writer is stricter about shapes) reopens to
 * the same names, shapes and float bits.
 *
 * An index: input starting "HFINDEX\n" is a model.safetensors.index.json
 * beside two fixed shards (s1.safetensors: "a", "b"; s2.safetensors: "c"
 * in BF16) and hf_src_open opens the directory: it refuses with one line,
 * or succeeds only for an index that lists exactly what the shards hold;
 * no shard named outside the directory is opened. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "host/ckpt/hf_load.h"
#include "host/ckpt/safetensors.h"
#include "tests/fuzz/fuzz.h"

#define INDEX_MAGIC "HFINDEX\n"

/* every float is read (a checksum the compiler must keep) */
static volatile uint32_t sink;

static void check_same(const struct st_file *a, const struct st_file *b)
{
	FUZZ_CHECK(st_count(a) == st_count(b));
	for (int i = 0; i < st_count(a); i++) {
		const struct st_entry *x = st_entry_at(a, i), *y = st_entry_at(b, i);
		FUZZ_CHECK(!strcmp(x->name, y->name) && x->ndim == y->ndim && x->numel == y->numel);
		FUZZ_CHECK(!memcmp(x->shape, y->shape, sizeof(x->shape[0]) * (size_t)x->ndim));
		FUZZ_CHECK(!x->numel || !memcmp(x->data, y->data, sizeof(float) * (size_t)x->numel));
		FUZZ_CHECK(!strcmp(y->dtype, "F32"));
	}
}

/* st_open_header and st_read agree with st_open's data for f at path:
 * for each tensor, the elements [numel/3, numel/3 + numel/2). */
static void check_ranges(const char *path, const struct st_file *f)
{
	char err[600];
	struct st_file *h = st_open_header(path, err, sizeof(err));
	FUZZ_CHECK(h && st_count(h) == st_count(f));
	uint64_t expect = st_header_bytes(h);
	FUZZ_CHECK(st_bytes_read(h) == expect);
	for (int i = 0; i < st_count(h); i++) {
		const struct st_entry *e = st_entry_at(h, i), *full = st_find(f, e->name);
		FUZZ_CHECK(full && !e->data && e->numel == full->numel);
		uint64_t first = (uint64_t)e->numel / 3, n = (uint64_t)e->numel / 2;
		float *out = malloc(sizeof(float) * (n ? n : 1));
		FUZZ_CHECK(out);
		FUZZ_CHECK(st_read(h, e, first, (size_t)n, out, err, sizeof(err)) == 0);
		FUZZ_CHECK(!n || !memcmp(out, full->data + first, sizeof(float) * n));
		expect += n * (uint64_t)e->esize;
		FUZZ_CHECK(st_bytes_read(h) == expect);
		FUZZ_CHECK(st_read(h, e, (uint64_t)e->numel, 1, out, err, sizeof(err)) == -ERANGE && err[0]);
		free(out);
	}
	st_close(h);
}

/* The fixed shards an index input is tried against. */
static void write_shards(const char *dir)
{
	static const float a[6] = { 1, 2, 3, 4, 5, 6 }, b[2] = { -1, 0.5f }, c[4] = { 0.25f, 8, -3, 1 };
	struct st_tensor s1[2] = { { "a", 2, { 2, 3 }, a, ST_F32 }, { "b", 1, { 2 }, b, ST_F32 } };
	struct st_tensor s2[1] = { { "c", 2, { 2, 2 }, c, ST_BF16 } };
	char path[300], err[600];
	snprintf(path, sizeof(path), "%s/s1.safetensors", dir);
	FUZZ_CHECK(st_write(path, s1, 2, NULL, err, sizeof(err)) == 0);
	snprintf(path, sizeof(path), "%s/s2.safetensors", dir);
	FUZZ_CHECK(st_write(path, s2, 1, NULL, err, sizeof(err)) == 0);
}

static int index_input(const uint8_t *data, size_t size)
{
	static char dir[256];
	char path[300], err[600] = "";
	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "%s/ck", fuzz_tmpdir());
		FUZZ_CHECK(mkdir(dir, 0700) == 0);
		write_shards(dir);
	}
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	fuzz_write_file(path, data + strlen(INDEX_MAGIC), size - strlen(INDEX_MAGIC));
	struct hf_src *s = NULL;
	int rc = hf_src_open(&s, dir, 1, err, sizeof(err));
	if (rc) {
		FUZZ_CHECK((rc == -EBADMSG || rc == -ENOMEM) && err[0] && !strchr(err, '\n') && !s);
		return 0;
	}
	/* both shards' headers were read, and nothing else of them */
	uint64_t n = hf_src_bytes_read(s);
	FUZZ_CHECK(n >= size - strlen(INDEX_MAGIC) + 16);
	hf_src_close(s);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[256], out[256];
	char err[600];

	if (size > (1 << 20))
		return 0;
	if (size >= strlen(INDEX_MAGIC) && !memcmp(data, INDEX_MAGIC, strlen(INDEX_MAGIC)))
		return index_input(data, size);
	if (!path[0]) {
		snprintf(path, sizeof(path), "%s/in.safetensors", fuzz_tmpdir());
		snprintf(out, sizeof(out), "%s/out.safetensors", fuzz_tmpdir());
	}
	fuzz_write_file(path, data, size);
	err[0] = 0;
	struct st_file *f = st_open(path, err, sizeof(err));
	if (!f) {
		FUZZ_CHECK(err[0]);
		return 0;
	}
	int n = st_count(f);
	FUZZ_CHECK(n >= 0 && !st_entry_at(f, -1) && !st_entry_at(f, n));
	struct st_tensor *t = calloc((size_t)n + 1, sizeof(*t));
	FUZZ_CHECK(t);
	for (int i = 0; i < n; i++) {
		const struct st_entry *e = st_entry_at(f, i);
		FUZZ_CHECK(e && e->name && e->ndim >= 0 && e->ndim <= ST_MAX_DIMS);
		FUZZ_CHECK(e->loads && (!strcmp(e->dtype, "F32") || !strcmp(e->dtype, "BF16") || !strcmp(e->dtype, "F16")));
		int64_t numel = 1;
		for (int d = 0; d < e->ndim; d++) {
			FUZZ_CHECK(e->shape[d] >= 0);
			numel = e->shape[d] ? numel * e->shape[d] : 0;
		}
		FUZZ_CHECK(numel == e->numel);
		for (int64_t j = 0; j < e->numel; j++) {
			uint32_t bits;
			memcpy(&bits, &e->data[j], sizeof(bits));
			sink ^= bits;
		}
		FUZZ_CHECK(st_find(f, e->name) == e);
		t[i] = (struct st_tensor){ e->name, e->ndim, { 0 }, e->data, ST_F32 };
		memcpy(t[i].shape, e->shape, sizeof(t[i].shape));
	}
	(void)st_meta(f, "format");
	(void)st_find(f, "");
	check_ranges(path, f);

	err[0] = 0;
	int rc = st_write(out, t, n, NULL, err, sizeof(err));
	if (rc) {
		FUZZ_CHECK(rc == -EINVAL && err[0]);
	} else {
		struct st_file *g = st_open(out, err, sizeof(err));
		if (!g) {
			fprintf(stderr, "st_write wrote a file st_open refuses: %s\n", err);
			abort();
		}
		check_same(f, g);
		st_close(g);
	}
	free(t);
	st_close(f);
	return 0;
}
