/* safetensors files (the Hugging Face checkpoint format, docs/training-step.md#checkpoints) and the
 * small JSON-file helpers a checkpoint directory's config.json needs.
 *
 * Layout: u64 little-endian header length N; N bytes of JSON
 *   {"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [...],
 *    "data_offsets": [begin, end]}, ...}
 * padded with spaces so N is a multiple of 8; then the data section, which
 * the tensors tile exactly (offsets relative to its start). Everything read
 * from a file is validated before it is trusted. Writes are atomic: a
 * temporary file beside the target, fsync, rename, fsync of the directory. */
#ifndef MESHRUN_SAFETENSORS_H
#define MESHRUN_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
/* headers larger than this are refused (the reference reader's limit) */
#define ST_MAX_HEADER (100u << 20)

struct cJSON;

/* How a tensor is stored: float32, or bfloat16 rounded to nearest even
 * (a NaN stays a NaN). */
enum st_dtype { ST_F32 = 0, ST_BF16 };

/* One tensor to write from float32, row-major, `shape[0..ndim)` (ndim 0
 * is a scalar), stored as dtype (ST_F32 when zeroed). data may be NULL
 * only when the tensor has no elements. */
struct st_tensor {
	const char *name;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	const float *data;
	enum st_dtype dtype;
};

/* One tensor of an open file. data (st_open only) is float32 whatever
 * the stored dtype (BF16 and F16 are widened on load), aligned, valid
 * until st_close. */
struct st_entry {
	const char *name;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	const float *data;
	int64_t numel;
	const char *dtype; /* as stored: any safetensors dtype ("F32", "BF16", "F8_E4M3", ...) */
	int esize;         /* bytes per element */
	bool loads;        /* F32, BF16 or F16: st_read widens it to float32 */
	uint64_t nbytes;   /* bytes in the file */
};

struct st_file;

/* The bfloat16 of x, rounded to nearest even (what ST_BF16 stores). */
uint16_t st_bf16(float x);

/* Writes n tensors, packed in the order given, with optional string
 * metadata meta_kv = { key, value, ..., NULL } (NULL for none), atomically
 * to path (via path.tmp, removed on failure; an existing file at path is
 * untouched unless the write succeeds). Names must be unique, non-empty and
 * not "__metadata__". 0 or a negative errno, detail in err. */
int st_write(const char *path, const struct st_tensor *t, int n, const char *const *meta_kv,
	     char *err, size_t errlen);

/* Opens a file and validates its header against the file's real size
 * before any data is read: header length within the file and <=
 * ST_MAX_HEADER, JSON header, a known safetensors dtype, shapes matching
 * their byte ranges, ranges inside the data section, not overlapping and
 * covering it exactly, unique names, string-only metadata. Reads 8 bytes
 * plus the header, no tensor data (entries' data are NULL): st_read
 * fetches the ranges a caller needs. The file stays open until st_close.
 * NULL with a one-line error naming the file (and tensor) in err. */
struct st_file *st_open_header(const char *path, char *err, size_t errlen);
/* st_open_header, then every tensor read into memory as float32 (each
 * entry's data); a dtype other than F32, BF16, F16 is refused. The
 * caller frees with st_close. NULL with err; errno is ENOMEM when the
 * tensors did not fit in memory. */
struct st_file *st_open(const char *path, char *err, size_t errlen);
void st_close(struct st_file *f);

/* Reads elements [first, first + n) of entry e (row-major) into dst as
 * float32: F32 one pread straight into dst (n floats); BF16 and F16 a
 * pread of a bounce buffer's worth at a time, widened into dst.
 * 0; -ENOTSUP for a dtype that does not load, -ERANGE for elements
 * outside e, -EIO when the file ended early, -errno; err names the file
 * and tensor. Safe to call from several threads. */
int st_read(struct st_file *f, const struct st_entry *e, uint64_t first, size_t n, float *dst,
	    char *err, size_t errlen);
/* st_read with the caller's bounce buffer for 2-byte dtypes: buf of cap
 * values (cap > 0; ST_BOUNCE stays in a core's L2 cache). BF16 is
 * widened with streaming stores (SSE2), F16 value by value. */
#define ST_BOUNCE 65536
int st_read_buf(struct st_file *f, const struct st_entry *e, uint64_t first, size_t n, float *dst,
		uint16_t *buf, size_t cap, char *err, size_t errlen);
/* rows x n elements of a tensor: row k from element first + k x fstride,
 * into dst + k x dstride, and into dst2 + k x dstride too when dst2 is
 * not NULL (a second device holding the same block: both written from
 * one read of the source). */
struct st_rows {
	uint64_t first, fstride;
	size_t n, rows;
	float *dst, *dst2;
	ptrdiff_t dstride;
};
/* st_read_buf of a column block of a matrix (rows 1 is st_read_buf).
 * From the file's mapping when st_map made one (no system call per row,
 * no bounce buffer: the values are copied or widened straight out of
 * the page cache), else a pread per row. The same errors and byte count
 * either way: the bytes of the elements read, once however many
 * destinations (the kernel maps whole pages, which this does not
 * count). */
int st_read_rows(struct st_file *f, const struct st_entry *e, const struct st_rows *r, uint16_t *buf, size_t cap,
		 char *err, size_t errlen);
/* Maps the whole file read-only for st_read_rows (nothing is read or
 * mapped into the page table until a range is read; st_unmap or
 * st_close unmaps). Each read populates its pages first
 * (MADV_POPULATE_READ), so a file cut short under the reader is -EIO
 * there, as with pread, not a SIGBUS (but for one cut between that and
 * the copy, microseconds later). Not while another thread reads f. 0 or
 * -errno, -ESTALE when the file's size is no longer the one its header
 * was checked against (the reads then stay preads; a failure is
 * returned again, not retried, until st_unmap). */
int st_map(struct st_file *f);
void st_unmap(struct st_file *f);
/* Bytes of the file read so far: the length and header, and every
 * st_read's bytes. */
uint64_t st_bytes_read(const struct st_file *f);
/* Bytes before the data section: 8 + the header's length. */
uint64_t st_header_bytes(const struct st_file *f);
const char *st_path(const struct st_file *f);

/* Tensors in data-section order, i in [0, st_count). */
int st_count(const struct st_file *f);
const struct st_entry *st_entry_at(const struct st_file *f, int i);
/* NULL if there is no tensor of that name. */
const struct st_entry *st_find(const struct st_file *f, const char *name);
/* Metadata value or NULL. */
const char *st_meta(const struct st_file *f, const char *key);

/* Writes root (pretty-printed, newline-terminated) to path atomically, like
 * st_write. Does not take ownership of root. 0 or a negative errno. */
int json_write_atomic(const char *path, const struct cJSON *root, char *err, size_t errlen);
/* Parses a JSON file (at most 64 MiB). The caller frees the result with
 * cJSON_Delete. NULL with err naming the file. */
struct cJSON *json_read_file(const char *path, char *err, size_t errlen);

#endif
