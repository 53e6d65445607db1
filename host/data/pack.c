/* `meshrun data pack` (see pack.h): inputs are streamed a chunk at a time
 * into the current output shard; a shard is closed (header patched or
 * index written, then renamed from *.tmp) when it holds shard_tokens
 * tokens, for llm.c shards even inside a document (llm.c's writers do
 * the same), for Megatron before the document that would overflow it. */
#include "host/data/pack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/data/source.h"

#define CHUNK_TOKENS (1 << 20)

struct writer {
	const struct pack_opts *o;
	struct pack_stats *st;
	int width;                 /* output bytes per token */
	int fd;                    /* the open shard's token file, else -1 */
	char path[4096];           /* its final name, without .bin */
	int64_t tokens;            /* in the open shard */
	int32_t *lens;             /* megatron: the open shard's document lengths */
	int64_t nlen, caplen;
	int64_t doc_len;           /* tokens of the document being written */
	uint8_t *out;              /* encoded tokens before write() */
	uint32_t *tok;             /* decoded input */
	uint8_t *in;               /* raw input */
};

static int write_all(int fd, const void *buf, size_t len, int64_t off, const char *path, char *err,
		     size_t errlen)
{
	const char *p = buf;
	while (len) {
		ssize_t r = off < 0 ? write(fd, p, len) : pwrite(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return data_err(err, errlen, -EIO, "unable to write '%s': %s", path,
					r < 0 ? strerror(errno) : "nothing written");
		p += r;
		len -= (size_t)r;
		if (off >= 0)
			off += r;
	}
	return 0;
}

static void le_put(uint8_t *b, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static int open_shard(struct writer *w, char *err, size_t errlen)
{
	char tmp[4200];
	snprintf(w->path, sizeof(w->path), "%s/%s_%06d", w->o->dir, w->o->name, w->st->shards);
	snprintf(tmp, sizeof(tmp), "%s.bin.tmp", w->path);
	w->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0)
		return data_err(err, errlen, -EIO, "unable to create '%s': %s", tmp, strerror(errno));
	w->tokens = 0;
	w->nlen = 0;
	if (w->o->out == SHARD_LLMC) {  /* the count is patched in at close */
		uint8_t h[LLMC_HEADER_BYTES] = { 0 };
		le_put(h, w->width == 2 ? LLMC_MAGIC_U16 : LLMC_MAGIC_U32, 4);
		le_put(h + 4, w->width == 2 ? LLMC_VERSION_U16 : LLMC_VERSION_U32, 4);
		return write_all(w->fd, h, sizeof(h), -1, tmp, err, errlen);
	}
	return 0;
}

/* Megatron's index for the shard's documents, one sequence each. */
static int write_idx(struct writer *w, const char *tmp, char *err, size_t errlen)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = 0;
	uint8_t h[MEGATRON_HEADER_BYTES], b[8];
	if (fd < 0)
		return data_err(err, errlen, -EIO, "unable to create '%s': %s", tmp, strerror(errno));
	memcpy(h, MEGATRON_MAGIC, MEGATRON_MAGIC_BYTES);
	le_put(h + 9, 1, 8);
	h[17] = w->width == 2 ? MEGATRON_DTYPE_UINT16 : MEGATRON_DTYPE_INT32;
	le_put(h + 18, (uint64_t)w->nlen, 8);
	le_put(h + 26, (uint64_t)w->nlen + 1, 8);
	FILE *f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		return data_err(err, errlen, -ENOMEM, "out of memory");
	}
	fwrite(h, 1, sizeof(h), f);
	for (int64_t i = 0; i < w->nlen; i++) {
		le_put(b, (uint64_t)(uint32_t)w->lens[i], 4);
		fwrite(b, 1, 4, f);
	}
	int64_t at = 0;
	for (int64_t i = 0; i < w->nlen; i++, at += (int64_t)w->lens[i - 1] * w->width) {
		le_put(b, (uint64_t)at, 8);
		fwrite(b, 1, 8, f);
	}
	for (int64_t i = 0; i <= w->nlen; i++) {
		le_put(b, (uint64_t)i, 8);
		fwrite(b, 1, 8, f);
	}
	if (ferror(f) | fclose(f))
		rc = data_err(err, errlen, -EIO, "unable to write '%s'", tmp);
	return rc;
}

static int close_shard(struct writer *w, char *err, size_t errlen)
{
	char tmp[4200], fin[4200];
	int rc = 0;
	if (w->fd < 0)
		return 0;
	snprintf(tmp, sizeof(tmp), "%s.bin.tmp", w->path);
	if (w->o->out == SHARD_LLMC) {
		uint8_t c[4];
		le_put(c, (uint64_t)w->tokens, 4);
		rc = write_all(w->fd, c, 4, 8, tmp, err, errlen);
	}
	if (close(w->fd) && !rc)
		rc = data_err(err, errlen, -EIO, "unable to write '%s': %s", tmp, strerror(errno));
	w->fd = -1;
	if (!rc && w->o->out == SHARD_MEGATRON) {
		snprintf(tmp, sizeof(tmp), "%s.idx.tmp", w->path);
		snprintf(fin, sizeof(fin), "%s.idx", w->path);
		if (!(rc = write_idx(w, tmp, err, errlen)) && rename(tmp, fin))
			rc = data_err(err, errlen, -EIO, "unable to rename '%s': %s", tmp,
				      strerror(errno));
		snprintf(tmp, sizeof(tmp), "%s.bin.tmp", w->path);
	}
	snprintf(fin, sizeof(fin), "%s.bin", w->path);
	if (!rc && rename(tmp, fin))
		rc = data_err(err, errlen, -EIO, "unable to rename '%s': %s", tmp, strerror(errno));
	w->st->shards++;
	return rc;
}

/* Appends n tokens; src and at name where they came from. */
static int put(struct writer *w, const uint32_t *tok, size_t n, const char *src, int64_t at,
	       char *err, size_t errlen)
{
	while (n) {
		int rc;
		if (w->fd < 0 && (rc = open_shard(w, err, errlen)))
			return rc;
		size_t k = n;
		if (w->o->out == SHARD_LLMC && (int64_t)k > w->o->shard_tokens - w->tokens)
			k = (size_t)(w->o->shard_tokens - w->tokens);
		for (size_t i = 0; i < k; i++) {
			if (w->width == 2 && tok[i] > 0xffff)
				return data_err(err, errlen, -EBADMSG, "'%s': token %u at token offset "
						"%lld does not fit uint16 (--token-bytes 4)", src, tok[i],
						(long long)(at + (int64_t)i));
			le_put(w->out + i * (size_t)w->width, tok[i], w->width);
		}
		char tmp[4200];
		snprintf(tmp, sizeof(tmp), "%s.bin.tmp", w->path);
		if ((rc = write_all(w->fd, w->out, k * (size_t)w->width, -1, tmp, err, errlen)))
			return rc;
		w->tokens += (int64_t)k;
		w->doc_len += (int64_t)k;
		w->st->tokens += (int64_t)k;
		tok += k;
		n -= k;
		at += (int64_t)k;
		if (w->o->out == SHARD_LLMC && w->tokens == w->o->shard_tokens &&
		    (rc = close_shard(w, err, errlen)))
			return rc;
	}
	return 0;
}

/* A document of len tokens (eot not counted) begins: Megatron shards
 * close before a document that would overflow them. */
static int doc_begin(struct writer *w, int64_t len, char *err, size_t errlen)
{
	len += w->o->eot >= 0;
	w->doc_len = 0;
	if (w->o->out != SHARD_MEGATRON)
		return 0;
	if (len > INT32_MAX)
		return data_err(err, errlen, -EBADMSG, "a document of %lld tokens is longer than "
				"a Megatron sequence may be", (long long)len);
	if (w->fd >= 0 && w->tokens > 0 && w->tokens + len > w->o->shard_tokens)
		return close_shard(w, err, errlen);
	return 0;
}

static int doc_end(struct writer *w, char *err, size_t errlen)
{
	int rc;
	if (w->o->eot >= 0) {
		uint32_t e = (uint32_t)w->o->eot;
		if ((rc = put(w, &e, 1, "--eot", 0, err, errlen)))
			return rc;
	}
	w->st->documents++;
	if (w->o->out != SHARD_MEGATRON)
		return 0;
	if (w->fd < 0 && (rc = open_shard(w, err, errlen)))  /* an empty document */
		return rc;
	if (w->nlen == w->caplen) {
		int64_t cap = w->caplen ? 2 * w->caplen : 1024;
		int32_t *l = realloc(w->lens, sizeof(*l) * (size_t)cap);
		if (!l)
			return data_err(err, errlen, -ENOMEM, "out of memory");
		w->lens = l;
		w->caplen = cap;
	}
	w->lens[w->nlen++] = (int32_t)w->doc_len;
	return 0;
}

/* Tokens [first, first + n) of a file whose token 0 is at byte off. */
static int copy_tokens(struct writer *w, const char *path, int64_t off, int width, int64_t first,
		       int64_t n, char *err, size_t errlen)
{
	int64_t size;
	int fd = data_open_file(path, &size, err, errlen), rc = 0;
	if (fd < 0)
		return fd;
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	for (int64_t i = first; !rc && i < first + n; i += CHUNK_TOKENS) {
		size_t k = (size_t)(first + n - i < CHUNK_TOKENS ? first + n - i : CHUNK_TOKENS);
		if ((rc = data_pread(fd, w->in, k * (size_t)width, off + i * width, path, err, errlen)))
			break;
		if (width == 1)
			for (size_t j = 0; j < k; j++)
				w->tok[j] = w->in[j];
		else
			data_shard_decode(w->tok, w->in, width, k);
		rc = put(w, w->tok, k, path, i, err, errlen);
	}
	close(fd);
	return rc;
}

/* An input's shard, its names (a Megatron PREFIX, PREFIX.bin or
 * PREFIX.idx: PREFIX.bin and PREFIX.idx) in bin and idx. */
static struct shard input_shard(const struct pack_opts *o, const char *path, char *bin, char *idx,
				size_t len)
{
	struct shard sh = { .path = (char *)path };
	if (o->in == PACK_MEGATRON) {
		size_t k = strlen(path);
		if (k > 4 && (!strcmp(path + k - 4, ".bin") || !strcmp(path + k - 4, ".idx")))
			k -= 4;
		snprintf(bin, len, "%.*s.bin", (int)k, path);
		snprintf(idx, len, "%.*s.idx", (int)k, path);
		sh.path = bin;
		sh.idx = idx;
	}
	return sh;
}

static enum shard_format input_format(const struct pack_opts *o)
{
	return o->in == PACK_LLMC ? SHARD_LLMC : o->in == PACK_MEGATRON ? SHARD_MEGATRON : SHARD_RAW;
}

/* One input: its header read and checked, then its documents. */
static int pack_input(struct writer *w, const char *path, char *err, size_t errlen)
{
	const struct pack_opts *o = w->o;
	char bin[4200], idx[4200];
	struct shard sh = input_shard(o, path, bin, idx, sizeof(bin));
	int rc;
	if (o->in == PACK_TEXT) {
		int64_t size;
		int fd = data_open_file(path, &size, err, errlen);
		if (fd < 0)
			return fd;
		close(fd);
		sh.width = 1;
		sh.tokens = size;
	} else if ((rc = data_shard_header(&sh, input_format(o), o->in_token_bytes, err, errlen))) {
		return rc;
	}
	if (o->in != PACK_MEGATRON) {
		if ((rc = doc_begin(w, sh.tokens, err, errlen)) ||
		    (rc = copy_tokens(w, path, sh.off, sh.width, 0, sh.tokens, err, errlen)))
			return rc;
		return doc_end(w, err, errlen);
	}
	int ifd = open(sh.idx, O_RDONLY | O_CLOEXEC);
	if (ifd < 0)
		return data_err(err, errlen, -EBADMSG, "unable to open '%s': %s", sh.idx,
				strerror(errno));
	int64_t a = 0, b;
	rc = sh.ndoc < 1 ? 0 : data_shard_doc_start(&sh, ifd, 0, &a, err, errlen);
	for (int64_t d = 0; !rc && d + 1 < sh.ndoc; d++, a = b)
		if (!(rc = data_shard_doc_start(&sh, ifd, d + 1, &b, err, errlen)) &&
		    !(rc = doc_begin(w, b - a, err, errlen)) &&
		    !(rc = copy_tokens(w, sh.path, 0, sh.width, a, b - a, err, errlen)))
			rc = doc_end(w, err, errlen);
	close(ifd);
	return rc;
}

/* The output width when not given: the widest input's. */
static int widest(const struct pack_opts *o, char *const *inputs, int n, char *err, size_t errlen)
{
	int width = 2;
	for (int i = 0; i < n && o->in != PACK_TEXT; i++) {
		if (o->in == PACK_RAW)
			return o->in_token_bytes;
		char bin[4200], idx[4200];
		struct shard sh = input_shard(o, inputs[i], bin, idx, sizeof(bin));
		int rc = data_shard_header(&sh, input_format(o), 0, err, errlen);
		if (rc)
			return rc;
		width = sh.width > width ? sh.width : width;
	}
	return width;
}

int data_pack(const struct pack_opts *o, char *const *inputs, int n, struct pack_stats *st,
	      char *err, size_t errlen)
{
	struct writer w = { .o = o, .st = st, .fd = -1 };
	int rc = 0;
	memset(st, 0, sizeof(*st));
	if (o->shard_tokens < 1 || (o->out == SHARD_LLMC && o->shard_tokens > INT32_MAX))
		return data_err(err, errlen, -EINVAL, "--shard-tokens must be in [1, %d], got %lld",
				INT32_MAX, (long long)o->shard_tokens);
	if (o->token_bytes && o->token_bytes != 2 && o->token_bytes != 4)
		return data_err(err, errlen, -EINVAL, "--token-bytes must be 2 or 4, got %d",
				o->token_bytes);
	if ((w.width = o->token_bytes ? o->token_bytes : widest(o, inputs, n, err, errlen)) < 0)
		return w.width;
	if (o->eot >= (w.width == 2 ? 65536LL : 4294967296LL))
		return data_err(err, errlen, -EINVAL, "--eot %lld does not fit uint%d", o->eot,
				8 * w.width);
	if (mkdir(o->dir, 0755) && errno != EEXIST)
		return data_err(err, errlen, -EIO, "unable to create directory '%s': %s", o->dir,
				strerror(errno));
	w.out = malloc((size_t)CHUNK_TOKENS * 4);
	w.tok = malloc(sizeof(uint32_t) * CHUNK_TOKENS);
	w.in = malloc((size_t)CHUNK_TOKENS * 4);
	if (!w.out || !w.tok || !w.in)
		rc = data_err(err, errlen, -ENOMEM, "out of memory");
	for (int i = 0; !rc && i < n; i++)
		rc = pack_input(&w, inputs[i], err, errlen);
	if (!rc) {
		rc = close_shard(&w, err, errlen);
	} else if (w.fd >= 0) {  /* a shard left half written is no shard */
		char tmp[4200];
		close(w.fd);
		snprintf(tmp, sizeof(tmp), "%s.bin.tmp", w.path);
		unlink(tmp);
	}
	free(w.out);
	free(w.tok);
	free(w.in);
	free(w.lens);
	return rc;
}
