/* One token shard on disk and the readers of its format's header
 * (docs/data.md#formats): llm.c's shards, raw token files (nanoGPT's
 * train.bin) and Megatron-LM's indexed datasets (.idx + .bin). A reader
 * checks everything the header promises against the file before a
 * single token is read, and reads only headers and indexes, streaming
 * (never whole). Used by the shard source (host/data/shards.c) and by
 * `meshrun data pack` (host/data/pack.c). */
#ifndef MESHRUN_DATA_SHARD_H
#define MESHRUN_DATA_SHARD_H

#include <stddef.h>
#include <stdint.h>

/* llm.c: int32 header[256] = { magic, version, token count, 0... } */
#define LLMC_HEADER_BYTES 1024
#define LLMC_MAGIC_U16 20240520     /* version 1: uint16 tokens (GPT-2) */
#define LLMC_MAGIC_U32 20240801     /* version 7: uint32 tokens (Llama 3) */
#define LLMC_VERSION_U16 1
#define LLMC_VERSION_U32 7

/* Megatron-LM: "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64
 * sequences, u64 document-index entries, then int32 lengths, int64 byte
 * offsets, int64 document index (all little-endian) */
#define MEGATRON_MAGIC "MMIDIDX\0\0"
#define MEGATRON_MAGIC_BYTES 9
#define MEGATRON_HEADER_BYTES 34
#define MEGATRON_DTYPE_INT32 4
#define MEGATRON_DTYPE_UINT16 8

enum shard_format { SHARD_LLMC, SHARD_RAW, SHARD_MEGATRON };

struct shard {
	char *path;            /* the token file (megatron: PREFIX.bin) */
	char *idx;             /* megatron: PREFIX.idx; else NULL */
	int64_t off;           /* byte offset of token 0 in path */
	int64_t tokens;
	int width;             /* bytes per token: 2 or 4 */
	/* megatron: sequences, document-index entries (documents + 1), and
	 * where the byte offsets and the document index sit in idx */
	int64_t nseq, ndoc;
	int64_t ptr_at, doc_at;
	/* the shard source's: its rows and the global index of the first */
	int64_t rows, row0;
};

/* Reads and checks the header of sh->path (and sh->idx for megatron),
 * filling off, tokens, width and the index fields. token_bytes is raw's
 * width (2 or 4). 0, or -EBADMSG (bad file) / -ENOMEM with a one-line
 * err naming the file and what is wrong. */
int data_shard_header(struct shard *sh, enum shard_format f, int token_bytes, char *err,
		      size_t errlen);

/* Megatron: the token index in the .bin where document d starts
 * (d = ndoc - 1: the end of the tokens), reading the index through
 * idx_fd. 0 or -EIO/-EBADMSG with err. */
int data_shard_doc_start(const struct shard *sh, int idx_fd, int64_t d, int64_t *start, char *err,
		    size_t errlen);

/* Decodes n little-endian tokens of width bytes from b into out. */
void data_shard_decode(uint32_t *out, const uint8_t *b, int width, size_t n);

#endif
