/* Frame encode/decode and the limit checks; see net/frame.h. */
#include "net/frame.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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
	if (f->body_case == MESHRUN__FRAME__BODY_CHUNK)
		return FRAME_PREFIX_LEN + FRAME_DATA_HDR;
	return FRAME_PREFIX_LEN + meshrun__frame__get_packed_size(f);
}

size_t frame_encode_data(const struct frame_data *d, uint64_t payload_len, uint8_t *buf)
{
	uint8_t *h = buf + FRAME_PREFIX_LEN;
	put_le32(buf, FRAME_DATA_MAGIC);
	put_le16(buf + 4, FRAME_VERSION);
	put_le16(buf + 6, FRAME_DATA_HDR);
	put_le64(buf + 8, payload_len);
	put_le64(h + 0, d->link_seq);
	put_le64(h + 8, d->ack_seq);
	put_le64(h + 16, d->tag);
	put_le64(h + 24, d->msg_bytes);
	put_le64(h + 32, d->msg_offset);
	put_le64(h + 40, d->step);
	put_le32(h + 48, d->src);
	put_le32(h + 52, d->dst);
	put_le32(h + 56, d->flags);
	put_le32(h + 60, d->op);
	put_le32(h + 64, d->rr.src);
	put_le32(h + 68, d->rr.dst);
	put_le64(h + 72, d->rr.tag);
	put_le64(h + 80, d->rr.bytes);
	return FRAME_PREFIX_LEN + FRAME_DATA_HDR;
}

void frame_data_view(const struct frame_data *d, uint64_t payload_len, Meshrun__Frame *f,
		     Meshrun__CollectiveChunk *c)
{
	Meshrun__Frame fi = MESHRUN__FRAME__INIT;
	Meshrun__CollectiveChunk ci = MESHRUN__COLLECTIVE_CHUNK__INIT;
	*f = fi;
	*c = ci;
	c->op = (Meshrun__CollOp)d->op;
	c->group_id = (uint32_t)(d->tag >> 48);
	c->coll_seq = (d->tag >> 16) & 0xffffffffu;
	c->step = d->step;
	c->src_device = d->src;
	c->dst_device = d->dst;
	c->chunk_index = (uint32_t)(d->tag & 0xffff);
	c->byte_count = payload_len;
	c->tag = d->tag;
	c->msg_bytes = d->msg_bytes;
	c->msg_offset = d->msg_offset;
	c->eager = (d->flags & FRAME_DATA_EAGER) != 0;
	f->link_seq = d->link_seq;
	f->ack_seq = d->ack_seq;
	f->body_case = MESHRUN__FRAME__BODY_CHUNK;
	f->chunk = c;
}

void frame_data_from_view(const Meshrun__Frame *f, struct frame_data *d)
{
	const Meshrun__CollectiveChunk *c = f->chunk;
	*d = (struct frame_data){ .link_seq = f->link_seq, .ack_seq = f->ack_seq };
	if (!c)
		return;
	d->tag = c->tag;
	d->msg_bytes = c->msg_bytes;
	d->msg_offset = c->msg_offset;
	d->step = c->step;
	d->src = c->src_device;
	d->dst = c->dst_device;
	d->op = (uint32_t)c->op;
	d->flags = c->eager ? FRAME_DATA_EAGER : 0;
}

size_t frame_encode(const Meshrun__Frame *f, uint64_t payload_len, uint8_t *buf)
{
	if (f->body_case == MESHRUN__FRAME__BODY_CHUNK) {
		struct frame_data d;
		frame_data_from_view(f, &d);
		return frame_encode_data(&d, payload_len, buf);
	}
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
	out->data = out->magic == FRAME_DATA_MAGIC;
	if (out->magic != FRAME_MAGIC && !out->data) {
		snprintf(err, errlen, "wrong magic 0x%08x (want 0x%08x or 0x%08x)", out->magic,
			 FRAME_MAGIC, FRAME_DATA_MAGIC);
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
	if (out->data && out->header_len != FRAME_DATA_HDR) {
		snprintf(err, errlen, "data frame header of %u bytes (want %u)", out->header_len,
			 FRAME_DATA_HDR);
		return -EPROTO;
	}
	if (out->payload_len > lim->max_payload) {
		snprintf(err, errlen, "payload of %llu bytes exceeds max_frame_bytes %llu",
			 (unsigned long long)out->payload_len,
			 (unsigned long long)lim->max_payload);
		return -EMSGSIZE;
	}
	if (!out->data && out->payload_len) {
		snprintf(err, errlen, "control frame carries a payload of %llu bytes",
			 (unsigned long long)out->payload_len);
		return -EPROTO;
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
	case MESHRUN__FRAME__BODY_CHUNK:
		snprintf(err, errlen, "chunk body in a control frame (data travels in data frames)");
		goto out_free;
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

int frame_parse_data(const uint8_t *hdr, size_t len, uint64_t payload_len,
		     const struct frame_limits *lim, struct frame_data *d, char *err,
		     size_t errlen)
{
	if (len != FRAME_DATA_HDR) {
		snprintf(err, errlen, "data frame header of %zu bytes (want %u)", len, FRAME_DATA_HDR);
		return -EPROTO;
	}
	if (payload_len > lim->max_payload) {
		snprintf(err, errlen, "payload of %llu bytes exceeds max_frame_bytes %llu",
			 (unsigned long long)payload_len, (unsigned long long)lim->max_payload);
		return -EPROTO;
	}
	d->link_seq = get_le64(hdr + 0);
	d->ack_seq = get_le64(hdr + 8);
	d->tag = get_le64(hdr + 16);
	d->msg_bytes = get_le64(hdr + 24);
	d->msg_offset = get_le64(hdr + 32);
	d->step = get_le64(hdr + 40);
	d->src = get_le32(hdr + 48);
	d->dst = get_le32(hdr + 52);
	d->flags = get_le32(hdr + 56);
	d->op = get_le32(hdr + 60);
	d->rr.src = get_le32(hdr + 64);
	d->rr.dst = get_le32(hdr + 68);
	d->rr.tag = get_le64(hdr + 72);
	d->rr.bytes = get_le64(hdr + 80);
	if (d->flags & ~(uint32_t)FRAME_DATA_FLAGS) {
		snprintf(err, errlen, "data frame with unknown flags 0x%x", d->flags);
		return -EPROTO;
	}
	if (!(d->flags & FRAME_DATA_RR) && (d->rr.src || d->rr.dst || d->rr.tag || d->rr.bytes)) {
		snprintf(err, errlen, "data frame carries recv_ready fields without its flag");
		return -EPROTO;
	}
	if (d->op > MESHRUN__COLL_OP__COLL_P2P) {
		snprintf(err, errlen, "data frame with unknown op %u", d->op);
		return -EPROTO;
	}
	if (d->msg_offset > d->msg_bytes || payload_len > d->msg_bytes - d->msg_offset) {
		snprintf(err, errlen, "chunk fragment [%llu, +%llu) outside its message of %llu bytes",
			 (unsigned long long)d->msg_offset, (unsigned long long)payload_len,
			 (unsigned long long)d->msg_bytes);
		return -EPROTO;
	}
	return 0;
}

/* A data frame as a heap view that frame_header_free frees (protobuf-c's
 * free walks the chunk submessage and frees both with free()). */
static Meshrun__Frame *data_view_new(const struct frame_data *d, uint64_t payload_len)
{
	Meshrun__Frame *f = malloc(sizeof(*f));
	Meshrun__CollectiveChunk *c = malloc(sizeof(*c));
	if (!f || !c) {
		free(f);
		free(c);
		return NULL;
	}
	frame_data_view(d, payload_len, f, c);
	return f;
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
	Meshrun__Frame *f;
	if (p.data) {
		struct frame_data d;
		if (frame_parse_data(buf + FRAME_PREFIX_LEN, p.header_len, p.payload_len, lim, &d, err,
				     errlen))
			return -EPROTO;
		f = data_view_new(&d, p.payload_len);
		if (!f) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	} else {
		f = frame_parse_header(buf + FRAME_PREFIX_LEN, p.header_len, p.payload_len, lim, err,
				       errlen);
	}
	if (!f)
		return -EPROTO;
	*hdr = f;
	*payload = p.payload_len ? buf + FRAME_PREFIX_LEN + p.header_len : NULL;
	*payload_len = p.payload_len;
	*consumed = FRAME_PREFIX_LEN + p.header_len + (size_t)p.payload_len;
	return 0;
}
