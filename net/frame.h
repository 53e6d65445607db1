/* The DCN frame (docs/wire.md):
 *     u32 magic | u16 version | u16 header_len | u64 payload_len | header | payload
 * little-endian. Two kinds, told apart by the magic: a control frame's
 * header is one protobuf-c Meshrun__Frame; a data frame's is a fixed
 * binary struct frame_data (FRAME_DATA_HDR bytes), so the hot path packs
 * and parses no protobuf. Pure functions on buffers, no sockets: the link
 * code reads the 16-byte prefix, checks it, reads header_len bytes, checks
 * the header, then reads the payload straight into its destination. Every
 * length is checked before anything is allocated; a failed check fills err
 * with the reason (the caller names the peer) and the caller closes the
 * link. */
#ifndef MESHRUN_FRAME_H
#define MESHRUN_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/meshrun.pb-c.h"

#define FRAME_MAGIC      0x5248534du   /* "MSHR" as little-endian bytes: control */
#define FRAME_DATA_MAGIC 0x4448534du   /* "MSHD": data, binary header */
#define FRAME_VERSION    2
#define FRAME_PREFIX_LEN 16
#define FRAME_MAX_HEADER 65535         /* header_len is a u16 */
#define FRAME_DATA_HDR   88            /* a data frame's header_len, always */

struct frame_limits {
	uint64_t max_payload;          /* cfg max_frame_bytes */
	uint32_t max_header;           /* 0: FRAME_MAX_HEADER */
};

struct frame_prefix {
	uint32_t magic;
	uint16_t version;
	uint16_t header_len;
	uint64_t payload_len;
	bool data;                     /* FRAME_DATA_MAGIC: a binary data header */
};

/* A RecvReady riding on a data frame (the same four fields as the control
 * message): a buffer of `bytes` is posted at the frame's receiver for
 * (src, dst, tag), with src on the frame's receiving host. */
struct frame_rr {
	uint32_t src, dst;
	uint64_t tag, bytes;
};

/* frame_data.flags */
enum {
	FRAME_DATA_EAGER = 1,          /* sent without a RecvReady (eager_max_bytes) */
	FRAME_DATA_ACK = 2,            /* the sender keeps a reference to the caller's
					* buffer: acknowledge at once when the message's
					* last fragment is in */
	FRAME_DATA_RR = 4,             /* rr carries a RecvReady */
	FRAME_DATA_FLAGS = 7,
};

/* A data frame's header, FRAME_DATA_HDR bytes little-endian in this order:
 *   u64 link_seq, ack_seq, tag, msg_bytes, msg_offset, step
 *   u32 src, dst, flags, op, rr.src, rr.dst   u64 rr.tag, rr.bytes
 * One fragment of a message of msg_bytes for (src, dst, tag): its payload
 * (payload_len bytes) belongs at msg_offset. tag = group << 48 | seq << 16
 * | chunk (net/xport.h); op and step name the collective in messages. The
 * rr fields are zero unless FRAME_DATA_RR. */
struct frame_data {
	uint64_t link_seq, ack_seq;
	uint64_t tag, msg_bytes, msg_offset;
	uint64_t step;
	uint32_t src, dst, flags, op;
	struct frame_rr rr;
};

/* Bytes frame_encode writes for f: prefix + header. */
size_t frame_encoded_len(const Meshrun__Frame *f);
/* Writes prefix + header of f into buf (frame_encoded_len(f) bytes) for a
 * frame whose payload of payload_len bytes follows: a control frame, or for
 * a body `chunk` (a CollectiveChunk, the data frame as a protobuf view) a
 * binary data frame (frame_data_from_view). Returns the bytes written, or 0
 * if the header is larger than FRAME_MAX_HEADER. */
size_t frame_encode(const Meshrun__Frame *f, uint64_t payload_len, uint8_t *buf);
/* Writes the prefix and header of data frame d (FRAME_PREFIX_LEN +
 * FRAME_DATA_HDR bytes) for a payload of payload_len bytes; returns that
 * length. */
size_t frame_encode_data(const struct frame_data *d, uint64_t payload_len, uint8_t *buf);

/* Parses and checks a prefix: magic (control or data), version, 1 <=
 * header_len <= lim->max_header (exactly FRAME_DATA_HDR for data),
 * payload_len <= lim->max_payload (0 for control frames). 0 or
 * -EPROTO/-EMSGSIZE with the reason in err. */
int frame_parse_prefix(const uint8_t p[FRAME_PREFIX_LEN], const struct frame_limits *lim,
		       struct frame_prefix *out, char *err, size_t errlen);

/* Unpacks and checks a control frame's header of len bytes: a body must be
 * set, and no control frame carries a payload (payload_len must be 0) or a
 * chunk body (data travels in data frames). Returns the header (free with
 * frame_header_free) or NULL with the reason in err. */
Meshrun__Frame *frame_parse_header(const uint8_t *hdr, size_t len, uint64_t payload_len,
				   const struct frame_limits *lim, char *err, size_t errlen);
void frame_header_free(Meshrun__Frame *f);

/* Parses and checks a data frame's header (len must be FRAME_DATA_HDR) for
 * a payload of payload_len bytes: only known flags, rr zero unless
 * FRAME_DATA_RR, a known op, and the fragment [msg_offset, +payload_len)
 * inside msg_bytes. Nothing allocated. 0 or -EPROTO with err. */
int frame_parse_data(const uint8_t *hdr, size_t len, uint64_t payload_len,
		     const struct frame_limits *lim, struct frame_data *out, char *err,
		     size_t errlen);

/* The data frame d (payload_len bytes) as a Meshrun__Frame with body chunk,
 * in storage the caller provides (nothing allocated; valid while f and c
 * are): what the fault point and older callers see. And back. */
void frame_data_view(const struct frame_data *d, uint64_t payload_len, Meshrun__Frame *f,
		     Meshrun__CollectiveChunk *c);
void frame_data_from_view(const Meshrun__Frame *f, struct frame_data *d);

/* Decodes one whole frame at the start of buf (len bytes), either kind.
 * 0: *hdr (caller frees with frame_header_free; a data frame comes as its
 * view, body chunk), *payload (points into buf, NULL if empty),
 * *payload_len and *consumed are set; -EAGAIN: buf holds only part of a
 * frame so far (nothing allocated); -EPROTO / -EMSGSIZE: a bad frame, reason
 * in err. */
int frame_decode(const uint8_t *buf, size_t len, const struct frame_limits *lim,
		 Meshrun__Frame **hdr, const uint8_t **payload, uint64_t *payload_len,
		 size_t *consumed, char *err, size_t errlen);

/* Lower-case name of a frame's body ("hello", "chunk", ...). */
const char *frame_body_name(int body_case);

#endif
