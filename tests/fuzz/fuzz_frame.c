/* (a) The frame prefix and header parsers (net/frame.h) on arbitrary bytes:
 * the input is a buffer of back-to-back frames (control frames with
 * protobuf headers, data frames with binary ones), decoded with
 * frame_decode until it runs out or a frame is bad; the first 16 bytes also
 * go through frame_parse_prefix and the whole input through
 * frame_parse_header and (its first FRAME_DATA_HDR bytes) frame_parse_data.
 * Properties: a failure always says why; a decoded frame stays inside the
 * buffer, and re-encoding its header decodes to the same header; a data
 * header re-encodes to the same bytes. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "net/frame.h"
#include "tests/fuzz/fuzz.h"

static const struct frame_limits lim = { .max_payload = 1 << 20, .max_header = 4096 };

/* protobuf-c keeps fields it does not know and packs them back verbatim;
 * it accepts some (a field number 0 in an overlong key) that it refuses
 * when it reads them again. meshrun never re-sends a header it received,
 * so for those only "no crash" is checked. */
static bool has_unknown(const ProtobufCMessage *m)
{
	if (!m)
		return false;
	if (m->n_unknown_fields)
		return true;
	const ProtobufCMessageDescriptor *d = m->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[i];
		if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		const void *at = (const char *)m + fd->offset;
		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)((const char *)m + fd->quantifier_offset);
			ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)at;
			for (size_t j = 0; j < n; j++)
				if (has_unknown(v[j]))
					return true;
		} else if (!(fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ||
			   *(const uint32_t *)((const char *)m + fd->quantifier_offset) == fd->id) {
			if (has_unknown(*(ProtobufCMessage *const *)at))
				return true;
		}
	}
	return false;
}

/* encode(decode(x)) decodes, and packs to the same bytes as decode(x) */
static void check_roundtrip(const Meshrun__Frame *f, const uint8_t *payload, uint64_t plen)
{
	/* a data frame's view packs to protobuf too: compared that way */
	size_t hl = frame_encoded_len(f), packed = meshrun__frame__get_packed_size(f);
	uint8_t *b = malloc(hl + (size_t)plen), *p1 = malloc(packed + 1), *p2;
	FUZZ_CHECK(b && p1);
	size_t n = frame_encode(f, plen, b);
	if (n == 0) {                     /* repacked past the u16 limit */
		FUZZ_CHECK(packed > FRAME_MAX_HEADER);
		goto out;
	}
	FUZZ_CHECK(f->body_case != MESHRUN__FRAME__BODY_CHUNK || n == FRAME_PREFIX_LEN + FRAME_DATA_HDR);
	FUZZ_CHECK(n == hl);
	if (plen)
		memcpy(b + n, payload, (size_t)plen);
	struct frame_limits big = { .max_payload = lim.max_payload };
	Meshrun__Frame *g;
	const uint8_t *gp;
	uint64_t gplen;
	size_t used;
	char err[256] = "";
	int rc = frame_decode(b, n + (size_t)plen, &big, &g, &gp, &gplen, &used, err, sizeof(err));
	if (rc && has_unknown(&f->base))
		goto out;
	if (rc) {
		fprintf(stderr, "re-encoded frame does not decode: %s\n", err);
		abort();
	}
	FUZZ_CHECK(used == n + plen && gplen == plen && g->body_case == f->body_case);
	p2 = malloc(packed + 1);
	FUZZ_CHECK(p2 && meshrun__frame__get_packed_size(g) == packed);
	meshrun__frame__pack(f, p1);
	meshrun__frame__pack(g, p2);
	FUZZ_CHECK(!memcmp(p1, p2, packed));
	free(p2);
	frame_header_free(g);
out:
	free(p1);
	free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	int rc;

	if (size >= FRAME_PREFIX_LEN) {
		struct frame_prefix p;
		err[0] = 0;
		rc = frame_parse_prefix(data, &lim, &p, err, sizeof(err));
		FUZZ_CHECK(rc == 0 || ((rc == -EPROTO || rc == -EMSGSIZE) && err[0]));
		if (!rc)
			FUZZ_CHECK(p.header_len >= 1 && p.header_len <= lim.max_header &&
				   p.payload_len <= lim.max_payload);
	}

	err[0] = 0;
	Meshrun__Frame *h = frame_parse_header(data, size, 0, &lim, err, sizeof(err));
	FUZZ_CHECK(h || err[0]);
	frame_header_free(h);

	if (size >= FRAME_DATA_HDR + 2) {
		struct frame_data d;
		uint64_t plen = data[FRAME_DATA_HDR] | (uint64_t)data[FRAME_DATA_HDR + 1] << 8;
		err[0] = 0;
		rc = frame_parse_data(data, FRAME_DATA_HDR, plen, &lim, &d, err, sizeof(err));
		FUZZ_CHECK(rc == 0 || (rc == -EPROTO && err[0]));
		if (!rc) {
			FUZZ_CHECK(d.msg_offset <= d.msg_bytes && plen <= d.msg_bytes - d.msg_offset);
			uint8_t b[FRAME_PREFIX_LEN + FRAME_DATA_HDR];
			FUZZ_CHECK(frame_encode_data(&d, plen, b) == sizeof(b));
			FUZZ_CHECK(!memcmp(b + FRAME_PREFIX_LEN, data, FRAME_DATA_HDR));
		}
	}

	size_t off = 0;
	while (off < size) {
		Meshrun__Frame *f;
		const uint8_t *payload;
		uint64_t plen;
		size_t used;
		err[0] = 0;
		rc = frame_decode(data + off, size - off, &lim, &f, &payload, &plen, &used, err,
				  sizeof(err));
		if (rc == -EAGAIN) {
			FUZZ_CHECK(!f);
			break;
		}
		if (rc) {
			FUZZ_CHECK(!f && (rc == -EPROTO || rc == -EMSGSIZE) && err[0]);
			break;
		}
		FUZZ_CHECK(f && used > FRAME_PREFIX_LEN && used <= size - off);
		FUZZ_CHECK(plen <= used - FRAME_PREFIX_LEN - 1);
		FUZZ_CHECK(plen ? payload + plen == data + off + used : payload == NULL);
		if (f->body_case == MESHRUN__FRAME__BODY_CHUNK)
			FUZZ_CHECK(f->chunk->byte_count == plen &&
				   f->chunk->msg_offset + plen <= f->chunk->msg_bytes);
		else
			FUZZ_CHECK(plen == 0);
		FUZZ_CHECK(strcmp(frame_body_name(f->body_case), "unknown"));
		check_roundtrip(f, payload, plen);
		frame_header_free(f);
		off += used;
	}
	return 0;
}
