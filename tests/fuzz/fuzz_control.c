/* (b) Each message body as it comes off a link: input byte 0 picks the body
 * (hello, topology, refuse, link_hello, heartbeat, barrier, abort, done,
 * chunk, recv_ready), the rest is that message's protobuf bytes. The
 * target wraps them in a Frame header (link_seq 1, the body's field),
 * runs the real frame_parse_header (protobuf-c unpack + frame checks),
 * then the link model's checks for that body (link_model.h: the rendezvous
 * checks for hello/topology/link_hello, xport matching and landing for
 * chunk/recv_ready); a chunk carries byte_count bytes of payload (up to
 * 64 KiB; larger ones are only parsed). */
#include <errno.h>
#include <string.h>

#include "net/frame.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/link_model.h"

#define MAX_PAYLOAD (64u << 10)

static const struct frame_limits lim = { .max_payload = 64u << 20 };

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	do {
		p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[600];
	if (size < 1 || size > 4096)
		return 0;
	unsigned field = MESHRUN__FRAME__BODY_HELLO + data[0] % 10; /* fields 10..19 */
	const uint8_t *body = data + 1;
	size_t blen = size - 1;

	uint8_t *hdr = malloc(blen + 16);
	FUZZ_CHECK(hdr);
	size_t hl = 0;
	hdr[hl++] = 0x08;                 /* link_seq = 1 */
	hdr[hl++] = 0x01;
	hl += put_varint(hdr + hl, (uint64_t)field << 3 | 2);
	hl += put_varint(hdr + hl, blen);
	memcpy(hdr + hl, body, blen);
	hl += blen;

	/* a chunk's payload length is its byte_count: read it the way the
	 * sender wrote it, from the body alone */
	uint64_t plen = 0;
	if (field == MESHRUN__FRAME__BODY_CHUNK) {
		Meshrun__CollectiveChunk *c = meshrun__collective_chunk__unpack(NULL, blen, body);
		if (c) {
			plen = c->byte_count;
			meshrun__collective_chunk__free_unpacked(c, NULL);
		}
	}
	why[0] = 0;
	Meshrun__Frame *f = frame_parse_header(hdr, hl, plen, &lim, why, sizeof(why));
	free(hdr);
	if (!f) {
		FUZZ_CHECK(why[0]);
		fuzz_note("header", why);
		return 0;
	}
	FUZZ_CHECK((unsigned)f->body_case == field && f->link_seq == 1);
	if (plen > MAX_PAYLOAD) {
		frame_header_free(f);
		return 0;
	}
	struct lm *m = lm_new();
	why[0] = 0;
	int rc = lm_frame(m, f, plen, why, sizeof(why));
	FUZZ_CHECK(rc == 0 || (rc == -EPROTO && why[0]));
	if (rc)
		fuzz_note("link model", why);
	if (rc == 0 && plen) {
		/* the payload: the body's own bytes, repeated */
		uint8_t *p = malloc((size_t)plen);
		FUZZ_CHECK(p);
		for (size_t i = 0; i < plen; i++)
			p[i] = blen ? body[i % blen] : (uint8_t)i;
		lm_payload(m, p, (size_t)plen);
		free(p);
	}
	if (rc == 0)
		lm_payload_done(m);
	frame_header_free(f);
	lm_free(m);
	return 0;
}
