/* safetensors reader and writer, and atomic JSON files (see safetensors.h).
 * The reader trusts nothing in the file: every length, offset and shape is
 * checked against the file's real size before a byte of data is read, and
 * tensor data lands in one aligned float arena whatever the header says. */
#include "host/ckpt/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/util/mem.h"
#include "host/util/out.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c stores floats as they lie in memory: little-endian hosts only"
#endif

/* JSON numbers are doubles: integers above this are not exact */
#define ST_MAX_INT 9007199254740992.0 /* 2^53 */
/* cJSON prints integers below 1e15 without an exponent */
#define ST_MAX_WRITE_BYTES 1000000000000000ULL
#define JSON_MAX_FILE (64u << 20)

struct st_item {
	struct st_entry pub; /* first: st_entry pointers are st_item pointers */
	uint64_t begin, end;
	int esize;
};

struct st_file {
	cJSON *root; /* owns every name and metadata string */
	const cJSON *meta;
	int n;
	struct st_item *items;    /* data-section order */
	struct st_item **by_name; /* sorted by name */
	float *arena;
	int fd;                   /* open until st_close */
	char *path;
	uint64_t data_start;      /* 8 + header length */
	uint64_t bytes_read;      /* header and data, atomically added */
	uint64_t size;            /* at open: what the header was checked against */
	const uint8_t *map;       /* the whole file read-only, between st_map and st_unmap */
	uint64_t map_len;
	int map_rc;               /* st_map's failure, until st_unmap: not tried again */
};

/* Every safetensors dtype and its element size; F32, BF16 and F16 load. */
static const struct { const char *name; int esize; bool loads; } dtypes[] = {
	{ "F32", 4, true }, { "BF16", 2, true }, { "F16", 2, true },
	{ "BOOL", 1, false }, { "U8", 1, false }, { "I8", 1, false }, { "F8_E5M2", 1, false },
	{ "F8_E4M3", 1, false }, { "F8_E8M0", 1, false }, { "I16", 2, false }, { "U16", 2, false },
	{ "I32", 4, false }, { "U32", 4, false }, { "F64", 8, false }, { "I64", 8, false },
	{ "U64", 8, false },
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* 0, or -EIO when the file ended early, or -errno */
static int pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;
	while (len) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EIO;
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* ---- atomic files: path.tmp, fsync, rename, fsync the directory ---- */

struct atomic_file {
	int fd;
	const char *path;
	char tmp[PATH_MAX];
};

static int atomic_begin(struct atomic_file *a, const char *path, const char *who, char *err,
			size_t errlen)
{
	a->fd = -1;
	a->path = path;
	if ((size_t)snprintf(a->tmp, sizeof(a->tmp), "%s.tmp", path) >= sizeof(a->tmp)) {
		seterr(err, errlen, "%s: path '%s' too long", who, path);
		return -ENAMETOOLONG;
	}
	/* a stale temp file from a crash is ours to replace; O_EXCL then
	 * refuses to write through anything else planted there */
	unlink(a->tmp);
	a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (a->fd < 0) {
		char es[128];
		int e = errno;
		seterr(err, errlen, "%s: unable to create '%s': %s", who, a->tmp, util_errstr(e, es, sizeof(es)));
		return -e;
	}
	return 0;
}

static int atomic_write(struct atomic_file *a, const void *buf, size_t len, const char *who,
			char *err, size_t errlen)
{
	char es[128];
	int rc = write_all(a->fd, buf, len);
	if (rc)
		seterr(err, errlen, "%s: unable to write '%s': %s", who, a->tmp, util_errstr(-rc, es, sizeof(es)));
	return rc;
}

/* Undoes atomic_begin after a failure: the target is left as it was. */
static void atomic_abort(struct atomic_file *a)
{
	if (a->fd >= 0) {
		close(a->fd);
		unlink(a->tmp);
		a->fd = -1;
	}
}

static int atomic_commit(struct atomic_file *a, const char *who, char *err, size_t errlen)
{
	char es[128];
	int e;
	if (fsync(a->fd) < 0) {
		e = errno;
		seterr(err, errlen, "%s: unable to sync '%s': %s", who, a->tmp, util_errstr(e, es, sizeof(es)));
		atomic_abort(a);
		return -e;
	}
	e = close(a->fd) < 0 ? errno : 0;
	a->fd = -1;
	if (e || rename(a->tmp, a->path) < 0) {
		e = e ? e : errno;
		seterr(err, errlen, "%s: unable to replace '%s': %s", who, a->path, util_errstr(e, es, sizeof(es)));
		unlink(a->tmp);
		return -e;
	}
	/* the rename itself must survive a crash */
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", a->path);
	char *slash = strrchr(dir, '/');
	if (!slash)
		strcpy(dir, ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd) < 0) {
		e = errno;
		if (dfd >= 0)
			close(dfd);
		seterr(err, errlen, "%s: wrote '%s' but unable to sync its directory: %s", who,
		       a->path, util_errstr(e, es, sizeof(es)));
		return -e;
	}
	close(dfd);
	return 0;
}

/* ---- writer ---- */

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the caller's tensors; *bytes receives each one's byte count. */
static int check_tensors(const char *path, const struct st_tensor *t, int n, uint64_t *bytes,
			 char *err, size_t errlen)
{
	uint64_t total = 0;
	for (int i = 0; i < n; i++) {
		const char *name = t[i].name;
		if (!name || !*name || !strcmp(name, "__metadata__")) {
			seterr(err, errlen, "safetensors: '%s': tensor %d has name '%s'", path, i,
			       name ? name : "(null)");
			return -EINVAL;
		}
		if (t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS) {
			seterr(err, errlen, "safetensors: '%s': tensor '%s' has %d dimensions (0..%d)",
			       path, name, t[i].ndim, ST_MAX_DIMS);
			return -EINVAL;
		}
		uint64_t numel = 1;
		for (int d = 0; d < t[i].ndim; d++) {
			int64_t s = t[i].shape[d];
			if (s < 0 || (s && numel > ST_MAX_WRITE_BYTES / 4 / (uint64_t)s)) {
				seterr(err, errlen, "safetensors: '%s': tensor '%s' has bad shape entry %lld",
				       path, name, (long long)s);
				return -EINVAL;
			}
			numel *= (uint64_t)s;
		}
		bytes[i] = numel * (t[i].dtype == ST_BF16 ? 2 : 4);
		if (bytes[i] && !t[i].data) {
			seterr(err, errlen, "safetensors: '%s': tensor '%s' has no data", path, name);
			return -EINVAL;
		}
		total += bytes[i];
		if (total > ST_MAX_WRITE_BYTES) {
			seterr(err, errlen, "safetensors: '%s': tensors too large", path);
			return -EFBIG;
		}
	}
	const char **names = malloc(sizeof(*names) * (n ? (size_t)n : 1));
	if (!names) {
		seterr(err, errlen, "safetensors: '%s': out of memory", path);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++)
		names[i] = t[i].name;
	qsort(names, (size_t)n, sizeof(*names), cmp_str_ptr);
	for (int i = 1; i < n; i++)
		if (!strcmp(names[i - 1], names[i])) {
			seterr(err, errlen, "safetensors: '%s': tensor name '%s' used twice", path,
			       names[i]);
			free(names);
			return -EINVAL;
		}
	free(names);
	return 0;
}

/* Builds the header text, padded with spaces to a multiple of 8. */
static char *build_header(const char *path, const struct st_tensor *t, int n,
			  const uint64_t *bytes, const char *const *meta_kv, size_t *len,
			  char *err, size_t errlen)
{
	cJSON *root = cJSON_CreateObject();
	char *text = NULL, *out = NULL;
	if (!root)
		goto out_nomem;
	if (meta_kv && meta_kv[0]) {
		cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
		if (!meta)
			goto out_nomem;
		for (int i = 0; meta_kv[i]; i += 2) {
			if (!meta_kv[i + 1]) {
				seterr(err, errlen, "safetensors: '%s': metadata key '%s' has no value",
				       path, meta_kv[i]);
				goto out_free;
			}
			if (cJSON_GetObjectItemCaseSensitive(meta, meta_kv[i])) {
				seterr(err, errlen, "safetensors: '%s': metadata key '%s' given twice",
				       path, meta_kv[i]);
				goto out_free;
			}
			if (!cJSON_AddStringToObject(meta, meta_kv[i], meta_kv[i + 1]))
				goto out_nomem;
		}
	}
	uint64_t off = 0;
	for (int i = 0; i < n; i++) {
		cJSON *e = cJSON_AddObjectToObject(root, t[i].name), *shape, *offs;
		if (!e || !cJSON_AddStringToObject(e, "dtype", t[i].dtype == ST_BF16 ? "BF16" : "F32") ||
		    !(shape = cJSON_AddArrayToObject(e, "shape")))
			goto out_nomem;
		for (int d = 0; d < t[i].ndim; d++) {
			cJSON *num = cJSON_CreateNumber((double)t[i].shape[d]);
			if (!num || !cJSON_AddItemToArray(shape, num)) {
				cJSON_Delete(num);
				goto out_nomem;
			}
		}
		if (!(offs = cJSON_AddArrayToObject(e, "data_offsets")))
			goto out_nomem;
		double be[2] = { (double)off, (double)(off + bytes[i]) };
		for (int j = 0; j < 2; j++) {
			cJSON *num = cJSON_CreateNumber(be[j]);
			if (!num || !cJSON_AddItemToArray(offs, num)) {
				cJSON_Delete(num);
				goto out_nomem;
			}
		}
		off += bytes[i];
	}
	text = cJSON_PrintUnformatted(root);
	if (!text)
		goto out_nomem;
	size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
	out = malloc(padded + 1);
	if (!out)
		goto out_nomem;
	memcpy(out, text, tl);
	memset(out + tl, ' ', padded - tl);
	out[padded] = '\0';
	*len = padded;
	goto out_free;
out_nomem:
	seterr(err, errlen, "safetensors: '%s': out of memory", path);
out_free:
	free(text);
	cJSON_Delete(root);
	return out;
}

uint16_t st_bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)  /* NaN stays a (quiet) NaN */
		return (uint16_t)((u >> 16) | 0x0040);
	/* round to nearest, ties to even: add 0x7fff plus the bit that
	 * decides the tie; a carry into the exponent is the right rounding
	 * (up to infinity past the largest bfloat16) */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* n floats as bfloat16, in chunks */
static int write_bf16(struct atomic_file *a, const float *x, size_t n, char *err, size_t errlen)
{
	uint16_t buf[8192];
	for (size_t i = 0; i < n; i += 8192) {
		size_t m = n - i < 8192 ? n - i : 8192;
		for (size_t j = 0; j < m; j++)
			buf[j] = st_bf16(x[i + j]);
		int rc = atomic_write(a, buf, m * sizeof(uint16_t), "safetensors", err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

int st_write(const char *path, const struct st_tensor *t, int n, const char *const *meta_kv,
	     char *err, size_t errlen)
{
	if (n < 0) {
		seterr(err, errlen, "safetensors: '%s': negative tensor count", path);
		return -EINVAL;
	}
	uint64_t *bytes = malloc(sizeof(*bytes) * (n ? (size_t)n : 1));
	if (!bytes) {
		seterr(err, errlen, "safetensors: '%s': out of memory", path);
		return -ENOMEM;
	}
	int rc = check_tensors(path, t, n, bytes, err, errlen);
	if (rc)
		goto out_free_bytes;
	size_t hlen = 0;
	char *header = build_header(path, t, n, bytes, meta_kv, &hlen, err, errlen);
	if (!header) {
		rc = -EINVAL;
		goto out_free_bytes;
	}

	struct atomic_file a;
	rc = atomic_begin(&a, path, "safetensors", err, errlen);
	if (rc)
		goto out_free_header;
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
	rc = atomic_write(&a, len8, 8, "safetensors", err, errlen);
	if (!rc)
		rc = atomic_write(&a, header, hlen, "safetensors", err, errlen);
	for (int i = 0; i < n && !rc; i++)
		rc = t[i].dtype == ST_BF16 ? write_bf16(&a, t[i].data, bytes[i] / 2, err, errlen)
					   : atomic_write(&a, t[i].data, bytes[i], "safetensors", err, errlen);
	if (rc)
		atomic_abort(&a);
	else
		rc = atomic_commit(&a, "safetensors", err, errlen);
out_free_header:
	free(header);
out_free_bytes:
	free(bytes);
	return rc;
}

/* ---- reader ---- */

/* A non-negative integer that a double holds exactly. */
static bool json_uint(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v))
		return false;
	double d = v->valuedouble;
	if (!(d >= 0 && d <= ST_MAX_INT) || d != (double)(uint64_t)d)
		return false;
	*out = (uint64_t)d;
	return true;
}

static int cmp_offset(const void *a, const void *b)
{
	const struct st_item *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->pub.name, y->pub.name); /* deterministic errors */
}

static int cmp_name(const void *a, const void *b)
{
	const struct st_item *x = *(struct st_item *const *)a, *y = *(struct st_item *const *)b;
	return strcmp(x->pub.name, y->pub.name);
}

/* Fills it from one header entry; datalen bounds its byte range. */
static int parse_entry(struct st_item *it, const cJSON *e, uint64_t datalen, const char *path,
		       char *err, size_t errlen)
{
	const char *name = e->string;
	const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");

	memset(it, 0, sizeof(*it));
	it->pub.name = name;
	if (!cJSON_IsObject(e) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
	    !cJSON_IsArray(offs)) {
		seterr(err, errlen, "safetensors: '%s': tensor '%s' needs dtype, shape and data_offsets",
		       path, name);
		return -EPROTO;
	}
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]) && !it->esize; i++)
		if (!strcmp(dtype->valuestring, dtypes[i].name)) {
			it->esize = dtypes[i].esize;
			it->pub.loads = dtypes[i].loads;
		}
	if (!it->esize) {
		seterr(err, errlen, "safetensors: '%s': tensor '%s' has unknown dtype '%.32s'",
		       path, name, dtype->valuestring);
		return -EPROTO;
	}
	it->pub.dtype = dtype->valuestring;
	it->pub.esize = it->esize;

	int nd = cJSON_GetArraySize(shape);
	if (nd > ST_MAX_DIMS) {
		seterr(err, errlen, "safetensors: '%s': tensor '%s' has %d dimensions (at most %d)",
		       path, name, nd, ST_MAX_DIMS);
		return -EPROTO;
	}
	it->pub.ndim = nd;
	uint64_t numel = 1;
	bool overflow = false;
	int d = 0;
	const cJSON *v;
	cJSON_ArrayForEach(v, shape) {
		uint64_t s;
		if (!json_uint(v, &s)) {
			seterr(err, errlen, "safetensors: '%s': tensor '%s' shape entry %d is not a non-negative integer",
			       path, name, d);
			return -EPROTO;
		}
		it->pub.shape[d++] = (int64_t)s;
		if (s && numel > UINT64_MAX / 8 / s)
			overflow = true;
		else
			numel *= s;
	}

	uint64_t be[2];
	if (cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, &be[0]) ||
	    !json_uint(offs->child->next, &be[1]) || be[0] > be[1]) {
		seterr(err, errlen, "safetensors: '%s': tensor '%s' data_offsets must be [begin, end] integers with begin <= end",
		       path, name);
		return -EPROTO;
	}
	it->begin = be[0];
	it->end = be[1];
	if (be[1] > datalen) {
		seterr(err, errlen, "safetensors: '%s': tensor '%s' data_offsets [%llu, %llu] outside the %llu-byte data section",
		       path, name, (unsigned long long)be[0], (unsigned long long)be[1],
		       (unsigned long long)datalen);
		return -EPROTO;
	}
	if (overflow || numel * (uint64_t)it->esize != be[1] - be[0]) {
		char dims[ST_MAX_DIMS * 22 + 1] = "", *p = dims;
		for (int i = 0; i < nd; i++)
			p += sprintf(p, "%s%lld", i ? ", " : "", (long long)it->pub.shape[i]);
		seterr(err, errlen, "safetensors: '%s': tensor '%s' shape [%s] of %s does not fit data_offsets [%llu, %llu]",
		       path, name, dims, it->pub.dtype, (unsigned long long)be[0],
		       (unsigned long long)be[1]);
		return -EPROTO;
	}
	it->pub.numel = (int64_t)numel;
	it->pub.nbytes = be[1] - be[0];
	return 0;
}

/* Checks names are unique and the ranges tile [0, datalen); sorts f->items
 * by offset and fills f->by_name. */
static int check_layout(struct st_file *f, uint64_t datalen, const char *path, char *err,
			size_t errlen)
{
	qsort(f->items, (size_t)f->n, sizeof(*f->items), cmp_offset);
	for (int i = 0; i < f->n; i++)
		f->by_name[i] = &f->items[i];
	qsort(f->by_name, (size_t)f->n, sizeof(*f->by_name), cmp_name);
	for (int i = 1; i < f->n; i++)
		if (!strcmp(f->by_name[i - 1]->pub.name, f->by_name[i]->pub.name)) {
			seterr(err, errlen, "safetensors: '%s': tensor '%s' appears twice", path,
			       f->by_name[i]->pub.name);
			return -EPROTO;
		}

	uint64_t at = 0;
	for (int i = 0; i < f->n; i++) {
		const struct st_item *it = &f->items[i];
		if (it->begin < at) {
			seterr(err, errlen, "safetensors: '%s': tensor '%s' data_offsets [%llu, %llu] overlap tensor '%s'",
			       path, it->pub.name, (unsigned long long)it->begin,
			       (unsigned long long)it->end, f->items[i - 1].pub.name);
			return -EPROTO;
		}
		if (it->begin > at) {
			seterr(err, errlen, "safetensors: '%s': bytes [%llu, %llu) of the data section belong to no tensor (before '%s')",
			       path, (unsigned long long)at, (unsigned long long)it->begin,
			       it->pub.name);
			return -EPROTO;
		}
		at = it->end;
	}
	if (at != datalen) {
		seterr(err, errlen, "safetensors: '%s': tensors cover %llu bytes of the %llu-byte data section",
		       path, (unsigned long long)at, (unsigned long long)datalen);
		return -EPROTO;
	}
	return 0;
}

static int check_meta(const cJSON *meta, const char *path, char *err, size_t errlen)
{
	if (!cJSON_IsObject(meta)) {
		seterr(err, errlen, "safetensors: '%s': __metadata__ is not an object", path);
		return -EPROTO;
	}
	const cJSON *v;
	cJSON_ArrayForEach(v, meta) {
		if (!cJSON_IsString(v)) {
			seterr(err, errlen, "safetensors: '%s': __metadata__ value of '%s' is not a string",
			       path, v->string);
			return -EPROTO;
		}
	}
	return 0;
}

/* float32 of an IEEE half: subnormals, infinities and NaN kept */
static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (man << 13);
	} else if (exp) {
		u = sign | ((exp + 112) << 23) | (man << 13);
	} else if (!man) {
		u = sign;
	} else {  /* subnormal: normalise */
		exp = 113;
		while (!(man & 0x400)) {
			man <<= 1;
			exp--;
		}
		u = sign | (exp << 23) | ((man & 0x3ff) << 13);
	}
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Every half's float32 (256 KiB, filled on first use): a lookup per
 * value instead of half_to_float's branches */
static float half_table[65536];
static pthread_once_t half_once = PTHREAD_ONCE_INIT;

static void half_table_fill(void)
{
	for (uint32_t h = 0; h < 65536; h++)
		half_table[h] = half_to_float((uint16_t)h);
}

#if defined(__SSE2__)
#include <emmintrin.h>
/* bfloat16 to float32 8 at a time: each value becomes the upper half of
 * a 32-bit lane (zeros interleaved below it), stored with streaming
 * (non-temporal) stores: a loaded checkpoint is far larger than the
 * caches, and a plain store first reads each destination line in. The
 * caller aligns d to 16 bytes and fences (util_store_fence) once after
 * all its rows. Returns the values done. (Two destinations from one
 * load, as the AVX-512 loop does, measured no better here.) */
static size_t widen_bf16_sse2(uint32_t *d, const uint16_t *s, size_t n)
{
	const __m128i zero = _mm_setzero_si128();
	size_t j = 0;
	for (; j + 8 <= n; j += 8) {
		__m128i v = _mm_loadu_si128((const __m128i *)(s + j));
		_mm_stream_si128((__m128i *)(d + j), _mm_unpacklo_epi16(zero, v));
		_mm_stream_si128((__m128i *)(d + j + 4), _mm_unpackhi_epi16(zero, v));
	}
	return j;
}
#define WIDEN_ALIGN 16
#else
static size_t widen_bf16_sse2(uint32_t *d, const uint16_t *s, size_t n)
{
	(void)d, (void)s, (void)n;
	return 0;
}
#define WIDEN_ALIGN 4
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_WIDEN_AVX512 1
/* The same 16 at a time, a whole 64-byte line per streaming store (d0,
 * d1 aligned to 64 bytes): ~10-15% less CPU than SSE2 for the same
 * bytes on this machine's Skylake-X (bench/load_bound.sh). */
__attribute__((target("avx512f,avx512bw"))) static size_t widen_bf16_avx512(uint32_t *d0, uint32_t *d1,
									   const uint16_t *s, size_t n)
{
	size_t j = 0;
	for (; j + 16 <= n; j += 16) {
		__m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + j))), 16);
		_mm512_stream_si512((void *)(d0 + j), v);
		if (d1)
			_mm512_stream_si512((void *)(d1 + j), v);
	}
	return j;
}
#else
#define HAVE_WIDEN_AVX512 0
#endif

/* d0 (and d1 when not NULL) = n bfloat16s of s widened: a scalar head
 * up to the vector loop's alignment, the loop, a scalar tail. With
 * AVX-512 both destinations from one pass when they share its alignment;
 * else one after the other (the source piece is still in cache). */
static void widen_bf16(uint32_t *d0, uint32_t *d1, const uint16_t *s, size_t n)
{
	size_t align = util_stream_avx512() ? 64 : WIDEN_ALIGN, j = 0;
	if (d1 && (align != 64 || ((uintptr_t)d0 - (uintptr_t)d1) % align)) {
		widen_bf16(d0, NULL, s, n);
		widen_bf16(d1, NULL, s, n);
		return;
	}
	for (; j < n && ((uintptr_t)(d0 + j) % align); j++) {
		d0[j] = (uint32_t)s[j] << 16;
		if (d1)
			d1[j] = d0[j];
	}
#if HAVE_WIDEN_AVX512
	if (align == 64)
		j += widen_bf16_avx512(d0 + j, d1 ? d1 + j : NULL, s + j, n - j);
#endif
	if (!d1)  /* all of it, or AVX-512's tail of one destination */
		j += widen_bf16_sse2(d0 + j, s + j, n - j);
	for (; j < n; j++) {
		d0[j] = (uint32_t)s[j] << 16;
		if (d1)
			d1[j] = d0[j];
	}
}

/* dst (n floats) and dst2 (when not NULL) = the n 2-byte values of src,
 * widened with streaming stores the caller fences (st_read_rows, once
 * per call) */
static void widen(float *dst, float *dst2, const uint16_t *src, size_t n, bool bf16)
{
	if (bf16) {  /* a bfloat16 is a float32's upper half */
		widen_bf16((uint32_t *)dst, (uint32_t *)dst2, src, n);
		return;
	}
	pthread_once(&half_once, half_table_fill);
	float *d[2] = { dst, dst2 };
	for (int i = 0; i < 2 && d[i]; i++) {
		size_t j = 0;
#if defined(__SSE2__)
		for (; j < n && ((uintptr_t)(d[i] + j) & 15); j++)
			d[i][j] = half_table[src[j]];
		for (; j + 4 <= n; j += 4)
			_mm_stream_ps(d[i] + j, _mm_setr_ps(half_table[src[j]], half_table[src[j + 1]],
							    half_table[src[j + 2]], half_table[src[j + 3]]));
#endif
		for (; j < n; j++)
			d[i][j] = half_table[src[j]];
	}
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  /* Linux 5.14 */
#endif

/* Maps [off, off + len) of f's mapping into the page table before it is
 * read: one call for a piece instead of a fault per 64 KiB, and a file
 * cut short since it was opened is -EIO here, not a SIGBUS when the
 * bytes are touched. A kernel without MADV_POPULATE_READ (< 5.14) is
 * read through faults. */
static int map_populate(const struct st_file *f, uint64_t off, uint64_t len)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), lo = off / page * page;
	if (!len || !madvise((void *)(f->map + lo), (size_t)(off + len - lo), MADV_POPULATE_READ))
		return 0;
	return errno == EINVAL ? 0 : -EIO;
}

/* Row k of r, n elements at src, into its destinations: copied (F32) or
 * widened with streaming stores, a cache-sized piece at a time, each
 * piece copied to dst and then to dst2 while it is still in cache, or
 * widened into both in one pass. */
static void put_row(const struct st_item *it, const struct st_rows *r, size_t k, const uint8_t *src)
{
	bool bf16 = !strcmp(it->pub.dtype, "BF16");
	float *d[2] = { r->dst + (ptrdiff_t)k * r->dstride, r->dst2 ? r->dst2 + (ptrdiff_t)k * r->dstride : NULL };
	for (size_t done = 0; done < r->n; done += ST_BOUNCE) {
		size_t m = r->n - done < ST_BOUNCE ? r->n - done : ST_BOUNCE;
		if (it->esize == 2) {
			widen(d[0] + done, d[1] ? d[1] + done : NULL, (const uint16_t *)src + done, m, bf16);
			continue;
		}
		util_copy_stream_nf(d[0] + done, d[1] ? d[1] + done : NULL, (const float *)src + done, m);
	}
}

/* r out of the mapping: one populate for the span of the rows, then each
 * row put in place. */
static int map_rows(struct st_file *f, const struct st_item *it, const struct st_rows *r)
{
	uint64_t off = f->data_start + it->begin + r->first * (uint64_t)it->esize;
	uint64_t span = ((r->rows - 1) * r->fstride + r->n) * (uint64_t)it->esize;
	if (off > f->map_len || span > f->map_len - off)
		return -EIO;  /* the file was shorter when mapped than its header says */
	int rc = map_populate(f, off, span);
	for (size_t k = 0; k < r->rows && !rc; k++)
		put_row(it, r, k, f->map + off + k * r->fstride * (uint64_t)it->esize);
	return rc;
}

/* r with a pread per row (per bounce buffer of 2-byte values); F32
 * straight into dst, then copied into dst2. */
static int pread_rows(struct st_file *f, const struct st_item *it, const struct st_rows *r, uint16_t *buf,
		      size_t cap)
{
	uint64_t off = f->data_start + it->begin + r->first * (uint64_t)it->esize;
	bool bf16 = !strcmp(it->pub.dtype, "BF16");
	int rc = 0;
	for (size_t k = 0; k < r->rows && !rc; k++, off += r->fstride * (uint64_t)it->esize) {
		float *d = r->dst + (ptrdiff_t)k * r->dstride;
		float *d2 = r->dst2 ? r->dst2 + (ptrdiff_t)k * r->dstride : NULL;
		if (it->esize == 4) {
			rc = pread_all(f->fd, d, r->n * sizeof(float), off);
			if (!rc && d2)
				util_copy_stream_nf(d2, NULL, d, r->n);
			continue;
		}
		for (size_t done = 0; done < r->n && !rc; done += cap) {
			size_t m = r->n - done < cap ? r->n - done : cap;
			rc = pread_all(f->fd, buf, m * sizeof(uint16_t), off + done * sizeof(uint16_t));
			if (!rc)
				widen(d + done, d2 ? d2 + done : NULL, buf, m, bf16);
		}
	}
	return rc;
}

int st_read_rows(struct st_file *f, const struct st_entry *e, const struct st_rows *r, uint16_t *buf, size_t cap,
		 char *err, size_t errlen)
{
	const struct st_item *it = (const struct st_item *)e;
	int rc;
	if (!e->loads) {
		seterr(err, errlen, "safetensors: '%s': tensor '%s' has dtype '%s' (only F32, BF16 and F16 load)",
		       f->path, e->name, e->dtype);
		return -ENOTSUP;
	}
	uint64_t last = r->rows > 1 ? (r->rows - 1) * r->fstride : 0;
	if (!r->rows || r->first > (uint64_t)e->numel || last > (uint64_t)e->numel - r->first ||
	    r->n > (uint64_t)e->numel - r->first - last) {
		seterr(err, errlen, "safetensors: '%s': elements [%llu, +%zu) x %zu rows outside tensor '%s' of %lld",
		       f->path, (unsigned long long)r->first, r->n, r->rows, e->name, (long long)e->numel);
		return -ERANGE;
	}
	uint64_t off = f->data_start + it->begin + r->first * (uint64_t)it->esize;
	if (f->map && !(off % (uint64_t)it->esize))  /* values at their alignment: read in place */
		rc = map_rows(f, it, r);
	else
		rc = pread_rows(f, it, r, buf, cap);
	util_store_fence();  /* the rows' streaming stores, once: not per row */
	if (rc) {
		seterr(err, errlen, "safetensors: '%s': unable to read tensor '%s': %s", f->path, e->name,
		       rc == -EIO ? "file ended early" : strerror(-rc));
		return rc;
	}
	__atomic_fetch_add(&f->bytes_read, (uint64_t)r->rows * r->n * (uint64_t)it->esize, __ATOMIC_RELAXED);
	return 0;
}

int st_read_buf(struct st_file *f, const struct st_entry *e, uint64_t first, size_t n, float *dst,
		uint16_t *buf, size_t cap, char *err, size_t errlen)
{
	const struct st_rows r = { .first = first, .n = n, .rows = 1, .dst = dst };
	return st_read_rows(f, e, &r, buf, cap, err, errlen);
}

int st_map(struct st_file *f)
{
	struct stat st;
	if (f->map || f->map_rc)
		return f->map_rc;
	if (fstat(f->fd, &st) < 0)
		return f->map_rc = -errno;
	if ((uint64_t)st.st_size != f->size)  /* changed since its header was checked: pread says how */
		return f->map_rc = -ESTALE;
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, f->fd, 0);
	if (p == MAP_FAILED)
		return f->map_rc = -errno;
	f->map = p;
	f->map_len = (uint64_t)st.st_size;
	return 0;
}

void st_unmap(struct st_file *f)
{
	if (f->map)
		munmap((void *)f->map, (size_t)f->map_len);
	f->map = NULL;
	f->map_len = 0;
	f->map_rc = 0;
}

/* 2-byte values go through a bounce buffer a chunk at a time (the
 * destination is written once, in float32, and the chunk stays in
 * cache): a small one on the stack, ST_BOUNCE values for long reads */
#define ST_CHUNK 4096

int st_read(struct st_file *f, const struct st_entry *e, uint64_t first, size_t n, float *dst,
	    char *err, size_t errlen)
{
	uint16_t small[ST_CHUNK], *buf = NULL;
	if (n > ST_CHUNK && ((const struct st_item *)e)->esize == 2)
		buf = malloc(sizeof(uint16_t) * ST_BOUNCE);
	int rc = st_read_buf(f, e, first, n, dst, buf ? buf : small, buf ? ST_BOUNCE : ST_CHUNK, err, errlen);
	free(buf);
	return rc;
}

/* Reads every tensor into the arena. */
static int load_data(struct st_file *f, char *err, size_t errlen)
{
	size_t total = 0;
	for (int i = 0; i < f->n; i++)
		total += (size_t)f->items[i].pub.numel;
	f->arena = malloc(sizeof(float) * (total ? total : 1));
	if (!f->arena) {
		seterr(err, errlen, "safetensors: '%s': out of memory: %zu bytes for its tensors", f->path,
		       sizeof(float) * total);
		return -ENOMEM;
	}
	float *dst = f->arena;
	for (int i = 0; i < f->n; i++) {
		struct st_item *it = &f->items[i];
		size_t ne = (size_t)it->pub.numel;
		int rc = st_read(f, &it->pub, 0, ne, dst, err, errlen);
		if (rc)
			return rc;
		it->pub.data = dst;
		dst += ne;
	}
	return 0;
}

/* The header of an open file: its length, the JSON, every entry and the
 * layout checked against the file's size. 0 or -errno with err. */
static int read_header(struct st_file *f, const char *path, uint64_t size, char *err, size_t errlen)
{
	char *header = NULL;
	uint8_t len8[8];
	int rc = pread_all(f->fd, len8, 8, 0);
	if (rc) {
		seterr(err, errlen, "safetensors: unable to read '%s': %s", path,
		       rc == -EIO ? "file ended early" : strerror(-rc));
		return rc;
	}
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | len8[i];
	if (hlen > ST_MAX_HEADER || hlen > size - 8) {
		seterr(err, errlen, "safetensors: '%s': header length %llu exceeds %s (%llu bytes)", path,
		       (unsigned long long)hlen,
		       hlen > ST_MAX_HEADER ? "the 100 MiB limit" : "the rest of the file",
		       hlen > ST_MAX_HEADER ? (unsigned long long)ST_MAX_HEADER
					    : (unsigned long long)(size - 8));
		return -EPROTO;
	}
	header = malloc((size_t)hlen + 1);
	if (!header) {
		seterr(err, errlen, "safetensors: '%s': out of memory for the %llu-byte header", path,
		       (unsigned long long)hlen);
		return -ENOMEM;
	}
	rc = pread_all(f->fd, header, (size_t)hlen, 8);
	if (rc) {
		seterr(err, errlen, "safetensors: unable to read '%s': %s", path,
		       rc == -EIO ? "file ended early" : strerror(-rc));
		goto out;
	}
	f->bytes_read = 8 + hlen;
	f->data_start = 8 + hlen;
	header[hlen] = '\0';
	const char *end = NULL;
	rc = -EPROTO;
	if (memchr(header, '\0', (size_t)hlen) ||
	    !(f->root = cJSON_ParseWithOpts(header, &end, 1))) {
		size_t at = end ? (size_t)(end - header) : strlen(header);
		seterr(err, errlen, "safetensors: '%s': header is not valid JSON (near byte %zu of %llu)",
		       path, at, (unsigned long long)hlen);
		goto out;
	}
	if (!cJSON_IsObject(f->root)) {
		seterr(err, errlen, "safetensors: '%s': header is not a JSON object", path);
		goto out;
	}

	uint64_t datalen = size - 8 - hlen;
	int n = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, f->root) {
		if (!strcmp(e->string, "__metadata__")) {
			if (f->meta) {
				seterr(err, errlen, "safetensors: '%s': __metadata__ appears twice", path);
				goto out;
			}
			if (check_meta(e, path, err, errlen))
				goto out;
			f->meta = e;
		} else {
			n++;
		}
	}
	f->items = calloc(n ? (size_t)n : 1, sizeof(*f->items));
	f->by_name = calloc(n ? (size_t)n : 1, sizeof(*f->by_name));
	if (!f->items || !f->by_name) {
		seterr(err, errlen, "safetensors: '%s': out of memory for %d tensors", path, n);
		rc = -ENOMEM;
		goto out;
	}
	cJSON_ArrayForEach(e, f->root) {
		if (e == f->meta)
			continue;
		if ((rc = parse_entry(&f->items[f->n], e, datalen, path, err, errlen)))
			goto out;
		f->n++;
	}
	rc = check_layout(f, datalen, path, err, errlen);
out:
	free(header);
	return rc;
}

struct st_file *st_open_header(const char *path, char *err, size_t errlen)
{
	struct st_file *f = calloc(1, sizeof(*f));
	struct stat st;
	if (f)
		f->fd = -1;
	if (!f || !(f->path = strdup(path))) {
		free(f);
		seterr(err, errlen, "safetensors: '%s': out of memory", path);
		return NULL;
	}
	f->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0 || fstat(f->fd, &st) < 0) {
		seterr(err, errlen, "safetensors: unable to open '%s': %s", path, strerror(errno));
		goto out_fail;
	}
	if (!S_ISREG(st.st_mode)) {
		seterr(err, errlen, "safetensors: '%s' is not a regular file", path);
		goto out_fail;
	}
	uint64_t size = (uint64_t)st.st_size;
	if (size < 8) {
		seterr(err, errlen, "safetensors: '%s': file is %llu bytes, too short for the 8-byte header length",
		       path, (unsigned long long)size);
		goto out_fail;
	}
	if (read_header(f, path, size, err, errlen))
		goto out_fail;
	f->size = size;
	return f;
out_fail:
	st_close(f);
	return NULL;
}

struct st_file *st_open(const char *path, char *err, size_t errlen)
{
	struct st_file *f = st_open_header(path, err, errlen);
	int rc = f ? load_data(f, err, errlen) : 0;
	if (rc) {
		st_close(f);
		errno = -rc;  /* ENOMEM: the caller tells memory from bad input */
		return NULL;
	}
	return f;
}

void st_close(struct st_file *f)
{
	if (!f)
		return;
	st_unmap(f);
	if (f->fd >= 0)
		close(f->fd);
	free(f->path);
	free(f->arena);
	free(f->by_name);
	free(f->items);
	cJSON_Delete(f->root);
	free(f);
}

uint64_t st_bytes_read(const struct st_file *f)
{
	return __atomic_load_n(&f->bytes_read, __ATOMIC_RELAXED);
}

uint64_t st_header_bytes(const struct st_file *f)
{
	return f->data_start;
}

const char *st_path(const struct st_file *f)
{
	return f->path;
}

int st_count(const struct st_file *f)
{
	return f->n;
}

const struct st_entry *st_entry_at(const struct st_file *f, int i)
{
	return i >= 0 && i < f->n ? &f->items[i].pub : NULL;
}

const struct st_entry *st_find(const struct st_file *f, const char *name)
{
	int lo = 0, hi = f->n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2, c = strcmp(f->by_name[mid]->pub.name, name);
		if (!c)
			return &f->by_name[mid]->pub;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *st_meta(const struct st_file *f, const char *key)
{
	const cJSON *v = f->meta ? cJSON_GetObjectItemCaseSensitive(f->meta, key) : NULL;
	return v ? v->valuestring : NULL;
}

/* ---- JSON files ---- */

int json_write_atomic(const char *path, const struct cJSON *root, char *err, size_t errlen)
{
	char *text = cJSON_Print(root);
	if (!text) {
		seterr(err, errlen, "json: '%s': unable to print", path);
		return -ENOMEM;
	}
	struct atomic_file a;
	int rc = atomic_begin(&a, path, "json", err, errlen);
	if (!rc) {
		rc = atomic_write(&a, text, strlen(text), "json", err, errlen);
		if (!rc)
			rc = atomic_write(&a, "\n", 1, "json", err, errlen);
		if (rc)
			atomic_abort(&a);
		else
			rc = atomic_commit(&a, "json", err, errlen);
	}
	free(text);
	return rc;
}

struct cJSON *json_read_file(const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	char *buf = NULL;
	cJSON *root = NULL;
	if (fd < 0 || fstat(fd, &st) < 0) {
		seterr(err, errlen, "json: unable to open '%s': %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > JSON_MAX_FILE) {
		seterr(err, errlen, "json: '%s' is not a regular file of at most 64 MiB", path);
		goto out;
	}
	size_t len = (size_t)st.st_size;
	buf = malloc(len + 1);
	if (!buf) {
		seterr(err, errlen, "json: '%s': out of memory", path);
		goto out;
	}
	int rc = pread_all(fd, buf, len, 0);
	if (rc) {
		seterr(err, errlen, "json: unable to read '%s': %s", path,
		       rc == -EIO ? "file ended early" : strerror(-rc));
		goto out;
	}
	buf[len] = '\0';
	const char *end = NULL;
	if (memchr(buf, '\0', len) || !(root = cJSON_ParseWithOpts(buf, &end, 1))) {
		size_t at = end ? (size_t)(end - buf) : strlen(buf);
		seterr(err, errlen, "json: '%s' is not valid JSON (near byte %zu)", path, at);
	}
out:
	free(buf);
	if (fd >= 0)
		close(fd);
	return root;
}
