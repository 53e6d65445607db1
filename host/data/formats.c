/* The shard formats' headers and indexes (host/data/shard.h). Each check
 * names the file and the number that is wrong. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/data/shard.h"
#include "host/data/source.h"

/* index entries read per pread while checking a Megatron index */
#define IDX_CHUNK 65536

static uint64_t le64(const uint8_t *b)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return v;
}

static uint32_t le32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

void data_shard_decode(uint32_t *out, const uint8_t *b, int width, size_t n)
{
	if (width == 2)
		for (size_t i = 0; i < n; i++)
			out[i] = (uint32_t)b[2 * i] | (uint32_t)b[2 * i + 1] << 8;
	else
		for (size_t i = 0; i < n; i++)
			out[i] = le32(b + 4 * i);
}

static int llmc_header(struct shard *sh, int fd, int64_t size, char *err, size_t errlen)
{
	uint8_t h[12];
	if (size < LLMC_HEADER_BYTES)
		return data_err(err, errlen, -EBADMSG, "'%s' has %lld bytes, shorter than llm.c's "
				"%d-byte header", sh->path, (long long)size, LLMC_HEADER_BYTES);
	int rc = data_pread(fd, h, sizeof(h), 0, sh->path, err, errlen);
	if (rc)
		return rc;
	int32_t magic = (int32_t)le32(h), version = (int32_t)le32(h + 4), count = (int32_t)le32(h + 8);
	if (magic == LLMC_MAGIC_U16 || magic == LLMC_MAGIC_U32) {
		int want = magic == LLMC_MAGIC_U16 ? LLMC_VERSION_U16 : LLMC_VERSION_U32;
		if (version != want)
			return data_err(err, errlen, -EBADMSG, "'%s': llm.c magic %d needs version %d, "
					"the header says %d", sh->path, magic, want, version);
	} else {
		return data_err(err, errlen, -EBADMSG, "'%s': bad magic %d (llm.c shards begin with "
				"%d or %d)", sh->path, magic, LLMC_MAGIC_U16, LLMC_MAGIC_U32);
	}
	sh->width = magic == LLMC_MAGIC_U16 ? 2 : 4;
	if (count < 0)
		return data_err(err, errlen, -EBADMSG, "'%s': the header's token count is negative (%d)",
				sh->path, count);
	int64_t want = LLMC_HEADER_BYTES + (int64_t)count * sh->width;
	if (size != want)
		return data_err(err, errlen, -EBADMSG, "'%s' has %lld bytes, but its header says %d "
				"uint%d tokens (1024 + %d x %d = %lld bytes)", sh->path,
				(long long)size, count, 8 * sh->width, count, sh->width, (long long)want);
	sh->off = LLMC_HEADER_BYTES;
	sh->tokens = count;
	return 0;
}

static int raw_header(struct shard *sh, int64_t size, int token_bytes, char *err, size_t errlen)
{
	if (token_bytes != 2 && token_bytes != 4)
		return data_err(err, errlen, -EINVAL, "key 'dataset_token_bytes' must be 2 or 4, got %d",
				token_bytes);
	if (size % token_bytes)
		return data_err(err, errlen, -EBADMSG, "'%s' has %lld bytes, not a whole number of "
				"%d-byte tokens (dataset_token_bytes)", sh->path, (long long)size,
				token_bytes);
	sh->width = token_bytes;
	sh->off = 0;
	sh->tokens = size / token_bytes;
	return 0;
}

static const char *megatron_dtype(unsigned code)
{
	static const char *const names[] = { "?", "uint8", "int8", "int16", "int32", "int64",
					     "float64", "float32", "uint16" };
	return code < sizeof(names) / sizeof(names[0]) ? names[code] : "unknown";
}

/* The lengths and byte offsets: every sequence starts where the previous
 * ends (Megatron's writer makes them so), and the last ends where the
 * .bin does. */
static int check_sequences(struct shard *sh, int fd, int64_t bin_size, uint8_t *buf, char *err,
			   size_t errlen)
{
	int64_t end = 0;
	for (int64_t i0 = 0; i0 < sh->nseq; i0 += IDX_CHUNK) {
		int64_t n = sh->nseq - i0 < IDX_CHUNK ? sh->nseq - i0 : IDX_CHUNK;
		uint8_t *len = buf, *ptr = buf + 4 * IDX_CHUNK;
		int rc;
		if ((rc = data_pread(fd, len, (size_t)n * 4, MEGATRON_HEADER_BYTES + 4 * i0, sh->idx,
				     err, errlen)) ||
		    (rc = data_pread(fd, ptr, (size_t)n * 8, sh->ptr_at + 8 * i0, sh->idx, err, errlen)))
			return rc;
		for (int64_t i = 0; i < n; i++) {
			int64_t l = (int32_t)le32(len + 4 * i), p = (int64_t)le64(ptr + 8 * i);
			if (l < 0)
				return data_err(err, errlen, -EBADMSG, "'%s': sequence %lld has length %lld",
						sh->idx, (long long)(i0 + i), (long long)l);
			if (p != end)
				return data_err(err, errlen, -EBADMSG, "'%s': sequence %lld starts at byte "
						"%lld of the .bin, not where the one before it ends (%lld)",
						sh->idx, (long long)(i0 + i), (long long)p, (long long)end);
			end = p + l * sh->width;
			if (end > bin_size)
				return data_err(err, errlen, -EBADMSG, "'%s': sequence %lld ends at byte %lld, "
						"past the end of '%s' (%lld bytes)", sh->idx,
						(long long)(i0 + i), (long long)end, sh->path,
						(long long)bin_size);
		}
	}
	if (end != bin_size)
		return data_err(err, errlen, -EBADMSG, "'%s' has %lld bytes, but '%s' describes %lld",
				sh->path, (long long)bin_size, sh->idx, (long long)end);
	sh->tokens = end / sh->width;
	return 0;
}

/* The document index: 0 first, never decreasing, the sequence count last. */
static int check_documents(struct shard *sh, int fd, uint8_t *buf, char *err, size_t errlen)
{
	int64_t prev = 0;
	if (sh->ndoc < 1)
		return data_err(err, errlen, -EBADMSG, "'%s': the document index is empty (it holds at "
				"least the end)", sh->idx);
	for (int64_t i0 = 0; i0 < sh->ndoc; i0 += IDX_CHUNK) {
		int64_t n = sh->ndoc - i0 < IDX_CHUNK ? sh->ndoc - i0 : IDX_CHUNK;
		int rc = data_pread(fd, buf, (size_t)n * 8, sh->doc_at + 8 * i0, sh->idx, err, errlen);
		if (rc)
			return rc;
		for (int64_t i = 0; i < n; i++) {
			int64_t d = (int64_t)le64(buf + 8 * i);
			bool first = i0 + i == 0, last = i0 + i == sh->ndoc - 1;
			if (d < prev || d > sh->nseq || (first && d != 0) || (last && d != sh->nseq))
				return data_err(err, errlen, -EBADMSG, "'%s': document index entry %lld is %lld "
						"(entries run from 0 up to the %lld sequences)", sh->idx,
						(long long)(i0 + i), (long long)d, (long long)sh->nseq);
			prev = d;
		}
	}
	return 0;
}

static int megatron_header(struct shard *sh, int64_t bin_size, char *err, size_t errlen)
{
	int64_t size;
	uint8_t h[MEGATRON_HEADER_BYTES], *buf = NULL;
	int fd = data_open_file(sh->idx, &size, err, errlen), rc;
	if (fd < 0)
		return fd;
	if (size < MEGATRON_HEADER_BYTES) {
		rc = data_err(err, errlen, -EBADMSG, "'%s' has %lld bytes, shorter than Megatron's "
			      "%d-byte index header", sh->idx, (long long)size, MEGATRON_HEADER_BYTES);
		goto out;
	}
	if ((rc = data_pread(fd, h, sizeof(h), 0, sh->idx, err, errlen)))
		goto out;
	rc = -EBADMSG;
	uint64_t version = le64(h + 9), nseq = le64(h + 18), ndoc = le64(h + 26);
	unsigned code = h[17];
	if (memcmp(h, MEGATRON_MAGIC, MEGATRON_MAGIC_BYTES)) {
		data_err(err, errlen, rc, "'%s': bad magic (a Megatron index begins with MMIDIDX\\0\\0)",
			 sh->idx);
		goto out;
	}
	if (version != 1) {
		data_err(err, errlen, rc, "'%s': index version %llu, meshrun reads version 1", sh->idx,
			 (unsigned long long)version);
		goto out;
	}
	if (code != MEGATRON_DTYPE_UINT16 && code != MEGATRON_DTYPE_INT32) {
		data_err(err, errlen, rc, "'%s': dtype code %u (%s) is not a token type meshrun reads "
			 "(uint16: %d, int32: %d)", sh->idx, code, megatron_dtype(code),
			 MEGATRON_DTYPE_UINT16, MEGATRON_DTYPE_INT32);
		goto out;
	}
	sh->width = code == MEGATRON_DTYPE_UINT16 ? 2 : 4;
	/* the multimodal variant adds one mode byte per sequence */
	uint64_t want = MEGATRON_HEADER_BYTES + 12 * nseq + 8 * ndoc;
	if (nseq > (1ULL << 40) || ndoc > (1ULL << 40) ||
	    ((uint64_t)size != want && (uint64_t)size != want + nseq)) {
		data_err(err, errlen, rc, "'%s' has %lld bytes, but %llu sequences and %llu "
			 "document-index entries take %llu", sh->idx, (long long)size,
			 (unsigned long long)nseq, (unsigned long long)ndoc, (unsigned long long)want);
		goto out;
	}
	sh->nseq = (int64_t)nseq;
	sh->ndoc = (int64_t)ndoc;
	sh->ptr_at = MEGATRON_HEADER_BYTES + 4 * sh->nseq;
	sh->doc_at = sh->ptr_at + 8 * sh->nseq;
	sh->off = 0;
	if (!(buf = malloc(12 * (size_t)IDX_CHUNK))) {
		rc = data_err(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	if (!(rc = check_sequences(sh, fd, bin_size, buf, err, errlen)))
		rc = check_documents(sh, fd, buf, err, errlen);
out:
	free(buf);
	close(fd);
	return rc;
}

int data_shard_header(struct shard *sh, enum shard_format f, int token_bytes, char *err,
		      size_t errlen)
{
	int64_t size;
	int fd = data_open_file(sh->path, &size, err, errlen), rc;
	if (fd < 0)
		return fd;
	if (f == SHARD_LLMC)
		rc = llmc_header(sh, fd, size, err, errlen);
	else if (f == SHARD_RAW)
		rc = raw_header(sh, size, token_bytes, err, errlen);
	else
		rc = megatron_header(sh, size, err, errlen);
	close(fd);
	return rc;
}

int data_shard_doc_start(const struct shard *sh, int idx_fd, int64_t d, int64_t *start, char *err,
		    size_t errlen)
{
	uint8_t b[8];
	int rc = data_pread(idx_fd, b, 8, sh->doc_at + 8 * d, sh->idx, err, errlen);
	if (rc)
		return rc;
	int64_t seq = (int64_t)le64(b);
	/* checked when the shard was opened; a file changed since is bad input */
	if (seq < 0 || seq > sh->nseq)
		return data_err(err, errlen, -EBADMSG, "'%s': document index entry %lld changed to "
				"%lld while reading", sh->idx, (long long)d, (long long)seq);
	if (seq == sh->nseq) {
		*start = sh->tokens;
		return 0;
	}
	if ((rc = data_pread(idx_fd, b, 8, sh->ptr_at + 8 * seq, sh->idx, err, errlen)))
		return rc;
	int64_t p = (int64_t)le64(b);
	if (p < 0 || p % sh->width || p / sh->width > sh->tokens)
		return data_err(err, errlen, -EBADMSG, "'%s': sequence %lld's byte offset changed to "
				"%lld while reading", sh->idx, (long long)seq, (long long)p);
	*start = p / sh->width;
	return 0;
}
