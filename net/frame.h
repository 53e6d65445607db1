/* The DCN frame (docs/wire.md):
 *     u32 magic | u16 version | u16 header_len | u64 payload_len | header | payload
 * little-endian; header is one protobuf-c Meshrun__Frame. Pure functions on
 * buffers, no sockets: the link code reads the 16-byte prefix, checks it,
 * reads header_len bytes, checks the header, then reads the payload straight
 * into its destination. Every length is checked before anything is
 * allocated; a failed check fills err with the reason (the caller names the
 * peer) and the caller closes the link. */
#ifndef MESHRUN_FRAME_H
#define MESHRUN_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/meshrun.pb-c.h"

#define FRAME_MAGIC      0x5248534du   /* "MSHR" as little-endian bytes */
#define FRAME_VERSION    1
#define FRAME_PREFIX_LEN 16
#define FRAME_MAX_HEADER 65535         /* header_len is a u16 */

struct frame_limits {
	uint64_t max_payload;          /* cfg max_frame_bytes */
	uint32_t max_header;           /* 0: FRAME_MAX_HEADER */
};

struct frame_prefix {
	uint32_t magic;
	uint16_t version;
	uint16_t header_len;
	uint64_t payload_len;
};

/* Bytes frame_encode writes for f: prefix + packed header. */
size_t frame_encoded_len(const Meshrun__Frame *f);
/* Writes prefix + header of f into buf (frame_encoded_len(f) bytes) for a
 * frame whose payload of payload_len bytes follows. Returns the bytes
 * written, or 0 if the header is larger than FRAME_MAX_HEADER. */
size_t frame_encode(const Meshrun__Frame *f, uint64_t payload_len, uint8_t *buf);

/* Parses and checks a prefix: magic, version, 1 <= header_len <=
 * lim->max_header, payload_len <= lim->max_payload. 0 or -EPROTO/-EMSGSIZE
 * with the reason in err. */
int frame_parse_prefix(const uint8_t p[FRAME_PREFIX_LEN], const struct frame_limits *lim,
		       struct frame_prefix *out, char *err, size_t errlen);

/* Unpacks and checks a header of len bytes for a frame carrying payload_len
 * bytes: a body must be set, only a CollectiveChunk may carry a payload and
 * then its byte_count must equal payload_len, a chunk's fragment must lie
 * inside its message. Returns the header (free with frame_header_free) or
 * NULL with the reason in err. */
Meshrun__Frame *frame_parse_header(const uint8_t *hdr, size_t len, uint64_t payload_len,
				   const struct frame_limits *lim, char *err, size_t errlen);
void frame_header_free(Meshrun__Frame *f);

/* Decodes one whole frame at the start of buf (len bytes). 0: *hdr (caller
 * frees with frame_header_free), *payload (points into buf, NULL if empty),
 * *payload_len and *consumed are set; -EAGAIN: buf holds only part of a
 * frame so far (nothing allocated); -EPROTO / -EMSGSIZE: a bad frame, reason
 * in err. */
int frame_decode(const uint8_t *buf, size_t len, const struct frame_limits *lim,
		 Meshrun__Frame **hdr, const uint8_t **payload, uint64_t *payload_len,
		 size_t *consumed, char *err, size_t errlen);

/* Lower-case name of a frame's body ("hello", "chunk", ...). */
const char *frame_body_name(int body_case);

#endif
