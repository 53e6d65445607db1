/* Frame encode/decode and the limit checks; see net/frame.h. */
#include "net/frame.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint32_t max_header(const struct frame_limits *lim)
{
	return lim->max_header && lim->max_header < FRAME_MAX_HEADER ? lim->max_header
								      : FRAME_MAX_HEADER;
}

size_t frame_encoded_len(const Meshrun__Frame *f)
{
	return FRAME_PREFIX_LEN + meshrun__frame__get_packed_size(f);
}

size_t frame_encode(const Meshrun__Frame *f, uint64_t payload_len, uint8_t *buf)
{
	size_t hl = meshrun__frame__get_packed_size(f);
	if (hl == 0 || hl > FRAME_MAX_HEADER)
		return 0;
	put_le32(buf, FRAME_MAGIC);
	put_le16(buf + 4, FRAME_VERSION);
	put_le16(buf + 6, (uint16_t)hl);
	put_le64(buf + 8, payload_len);
	meshrun__frame__pack(f, buf + FRAME_PREFIX_LEN);
	return FRAME_PREFIX_LEN + hl;
}

int frame_parse_prefix(const uint8_t p[FRAME_PREFIX_LEN], const struct frame_limits *lim,
		       struct frame_prefix *out, char *err, size_t errlen)
{
	out->magic = get_le32(p);
	out->version = get_le16(p + 4);
	out->header_len = get_le16(p + 6);
	out->payload_len = get_le64(p + 8);
	if (out->magic != FRAME_MAGIC) {
		snprintf(err, errlen, "wrong magic 0x%08x (want 0x%08x)", out->magic, FRAME_MAGIC);
		return -EPROTO;
	}
	if (out->version != FRAME_VERSION) {
		snprintf(err, errlen, "wire version %u, this build speaks %u",
			 out->version, FRAME_VERSION);
		return -EPROTO;
	}
	if (out->header_len == 0) {
		snprintf(err, errlen, "empty frame header");
		return -EPROTO;
	}
	if (out->header_len > max_header(lim)) {
		snprintf(err, errlen, "header of %u bytes exceeds the limit of %u",
			 out->header_len, max_header(lim));
		return -EMSGSIZE;
	}
	if (out->payload_len > lim->max_payload) {
		snprintf(err, errlen, "payload of %llu bytes exceeds max_frame_bytes %llu",
			 (unsigned long long)out->payload_len,
			 (unsigned long long)lim->max_payload);
		return -EMSGSIZE;
	}
	return 0;
}

const char *frame_body_name(int body_case)
{
	switch (body_case) {
	case MESHRUN__FRAME__BODY_HELLO: return "hello";
	case MESHRUN__FRAME__BODY_TOPOLOGY: return "topology";
	case MESHRUN__FRAME__BODY_REFUSE: return "refuse";
	case MESHRUN__FRAME__BODY_LINK_HELLO: return "link_hello";
	case MESHRUN__FRAME__BODY_HEARTBEAT: return "heartbeat";
	case MESHRUN__FRAME__BODY_BARRIER: return "barrier";
	case MESHRUN__FRAME__BODY_ABORT: return "abort";
	case MESHRUN__FRAME__BODY_DONE: return "done";
	case MESHRUN__FRAME__BODY_CHUNK: return "chunk";
	case MESHRUN__FRAME__BODY_RECV_READY: return "recv_ready";
	case MESHRUN__FRAME__BODY_ACK: return "ack";
	default: return "unknown";
	}
}

Meshrun__Frame *frame_parse_header(const uint8_t *hdr, size_t len, uint64_t payload_len,
				   const struct frame_limits *lim, char *err, size_t errlen)
{
	if (len == 0 || len > max_header(lim)) {
		snprintf(err, errlen, "header length %zu out of range", len);
		return NULL;
	}
	if (payload_len > lim->max_payload) {
		snprintf(err, errlen, "payload of %llu bytes exceeds max_frame_bytes %llu",
			 (unsigned long long)payload_len, (unsigned long long)lim->max_payload);
		return NULL;
	}
	Meshrun__Frame *f = meshrun__frame__unpack(NULL, len, hdr);
	if (!f) {
		snprintf(err, errlen, "malformed frame header (%zu bytes)", len);
		return NULL;
	}
	switch (f->body_case) {
	case MESHRUN__FRAME__BODY_HELLO:
	case MESHRUN__FRAME__BODY_TOPOLOGY:
	case MESHRUN__FRAME__BODY_REFUSE:
	case MESHRUN__FRAME__BODY_LINK_HELLO:
	case MESHRUN__FRAME__BODY_HEARTBEAT:
	case MESHRUN__FRAME__BODY_BARRIER:
	case MESHRUN__FRAME__BODY_ABORT:
	case MESHRUN__FRAME__BODY_DONE:
	case MESHRUN__FRAME__BODY_RECV_READY:
	case MESHRUN__FRAME__BODY_ACK:
		if (payload_len) {
			snprintf(err, errlen, "%s frame carries a payload of %llu bytes",
				 frame_body_name(f->body_case), (unsigned long long)payload_len);
			goto out_free;
		}
		return f;
	case MESHRUN__FRAME__BODY_CHUNK: {
		const Meshrun__CollectiveChunk *c = f->chunk;
		if (c->byte_count != payload_len) {
			snprintf(err, errlen, "chunk byte_count %llu but payload of %llu bytes",
				 (unsigned long long)c->byte_count, (unsigned long long)payload_len);
			goto out_free;
		}
		if (c->msg_offset > c->msg_bytes || c->byte_count > c->msg_bytes - c->msg_offset) {
			snprintf(err, errlen, "chunk fragment [%llu, +%llu) outside its message of %llu bytes",
				 (unsigned long long)c->msg_offset, (unsigned long long)c->byte_count,
				 (unsigned long long)c->msg_bytes);
			goto out_free;
		}
		return f;
	}
	default:
		snprintf(err, errlen, "frame without a known body (case %d)", (int)f->body_case);
		goto out_free;
	}
out_free:
	meshrun__frame__free_unpacked(f, NULL);
	return NULL;
}

void frame_header_free(Meshrun__Frame *f)
{
	if (f)
		meshrun__frame__free_unpacked(f, NULL);
}

int frame_decode(const uint8_t *buf, size_t len, const struct frame_limits *lim,
		 Meshrun__Frame **hdr, const uint8_t **payload, uint64_t *payload_len,
		 size_t *consumed, char *err, size_t errlen)
{
	struct frame_prefix p;
	int rc;

	*hdr = NULL;
	if (len < FRAME_PREFIX_LEN)
		return -EAGAIN;
	rc = frame_parse_prefix(buf, lim, &p, err, errlen);
	if (rc)
		return rc;
	size_t avail = len - FRAME_PREFIX_LEN;
	if (avail < p.header_len || avail - p.header_len < p.payload_len)
		return -EAGAIN;
	Meshrun__Frame *f = frame_parse_header(buf + FRAME_PREFIX_LEN, p.header_len,
					       p.payload_len, lim, err, errlen);
	if (!f)
		return -EPROTO;
	*hdr = f;
	*payload = p.payload_len ? buf + FRAME_PREFIX_LEN + p.header_len : NULL;
	*payload_len = p.payload_len;
	*consumed = FRAME_PREFIX_LEN + p.header_len + (size_t)p.payload_len;
	return 0;
}
