/* Writing token shards (`meshrun data pack`, docs/data.md#writing-shards):
 * token files or byte text in, llm.c shards or Megatron indexed datasets
 * out, of a chosen size. Input is streamed, never held whole. */
#ifndef MESHRUN_DATA_PACK_H
#define MESHRUN_DATA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "host/data/shard.h"

/* Input formats: text (each byte a token), raw (headerless tokens of
 * in_token_bytes), llmc, megatron (a prefix). */
enum pack_input { PACK_TEXT, PACK_RAW, PACK_LLMC, PACK_MEGATRON };

struct pack_opts {
	enum shard_format out;     /* SHARD_LLMC or SHARD_MEGATRON */
	enum pack_input in;
	int in_token_bytes;        /* raw input: 2 or 4 */
	int token_bytes;           /* output: 2 or 4; 0: the widest input's */
	int64_t shard_tokens;      /* tokens per output shard (megatron: whole
				    * documents, so a shard may hold more when
				    * one document is longer) */
	long long eot;             /* appended after every document; -1: none */
	const char *dir;           /* made if missing */
	const char *name;          /* shards are DIR/NAME_000000.bin (.idx) */
};

struct pack_stats {
	int shards;
	int64_t tokens, documents;
};

/* Packs inputs[0..n) in order. A document is one input file (text, raw,
 * llmc) or one document of a Megatron input. Each shard is written as
 * *.tmp and renamed when complete. 0, or with a one-line err naming the
 * file: -EINVAL (options), -EBADMSG (an input: bad header, a token too
 * wide for the output), -EIO (writing), -ENOMEM. */
int data_pack(const struct pack_opts *o, char *const *inputs, int n, struct pack_stats *st,
	      char *err, size_t errlen);

#endif
