/* (e) A safetensors file (host/ckpt/safetensors.h): the input is the whole
 * file, written to a scratch path and opened with st_open. Properties: a
 * failure always says why; a file that opens has entries whose shapes
 * multiply to their element count and whose data can be read in full,
 * every name is found by st_find, and writing the tensors back with
 * st_write (when it accepts them: the writer is stricter about shapes)
 * reopens to the same names, shapes and float bits. */
#include <errno.h>
#include <string.h>

#include "host/ckpt/safetensors.h"
#include "tests/fuzz/fuzz.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[256], out[256];
	char err[600];

	if (size > (1 << 20))
		return 0;
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
