/* (c) A link's byte stream after the handshake: input bytes 0-3 seed the
 * places where reads split the stream (as TCP and TLS records do), the rest
 * is the stream. It goes through link_read's state machine (prefix ->
 * header -> payload, with the real frame_parse_prefix, frame_parse_header
 * for control frames and frame_parse_data for data frames, and a header
 * buffer grown to the exact length, as recv.c keeps it) into
 * the link model (link_model.h). Real: the frame code, every check a frame
 * meets (net/wire_check.c: sequence numbers and acks, which bodies a
 * running link takes, chunk and recv_ready ownership and fragment order)
 * and the xport matching and landing. Modelled: recv.c's link_read stages
 * (not separable from its socket and TLS) and the link's receive state.
 * Property: the incremental reader agrees with frame_decode on the whole
 * rest of the stream at every frame boundary, however the reads split. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "net/frame.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/link_model.h"

enum stage { RX_PREFIX, RX_HEADER, RX_PAYLOAD };

static const struct frame_limits lim = { .max_payload = 1 << 16, .max_header = 4096 };

struct reader {
	const uint8_t *s;
	size_t len, pos;
	uint32_t rng;
};

/* a "read" of at most want bytes: 1..64, or all of want one time in 8 */
static size_t read_some(struct reader *r, size_t want)
{
	r->rng ^= r->rng << 13;
	r->rng ^= r->rng >> 17;
	r->rng ^= r->rng << 5;
	size_t n = (r->rng & 7) == 0 ? want : 1 + (r->rng >> 3) % 64;
	if (n > want)
		n = want;
	if (n > r->len - r->pos)
		n = r->len - r->pos;
	return n;
}

/* What frame_decode says about the frame starting at pos: 0 with its
 * length in *flen, -EAGAIN, or an error. */
static int decode_at(const struct reader *r, size_t *flen)
{
	Meshrun__Frame *f;
	const uint8_t *p;
	uint64_t plen;
	char err[256];
	int rc = frame_decode(r->s + r->pos, r->len - r->pos, &lim, &f, &p, &plen, flen, err,
			      sizeof(err));
	frame_header_free(f);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 4)
		return 0;
	struct reader r = { .s = data + 4, .len = size - 4 };
	memcpy(&r.rng, data, 4);
	r.rng |= 1;

	struct lm *m = lm_new();
	uint8_t prefix[FRAME_PREFIX_LEN], *hdr = NULL;
	size_t hdr_cap = 0, got = 0, frame_start = 0, flen = 0;
	struct frame_prefix p = { 0 };
	enum stage stage = RX_PREFIX;
	char why[600];
	int expect = decode_at(&r, &flen);
	bool dead = false;

	while (!dead && r.pos < r.len) {
		size_t want = stage == RX_PREFIX ? FRAME_PREFIX_LEN - got
			    : stage == RX_HEADER ? p.header_len - got
						 : (size_t)(p.payload_len - got);
		size_t n = read_some(&r, want);
		const uint8_t *in = r.s + r.pos;
		r.pos += n;
		switch (stage) {
		case RX_PREFIX:
			memcpy(prefix + got, in, n);
			got += n;
			if (got < FRAME_PREFIX_LEN)
				break;
			if (frame_parse_prefix(prefix, &lim, &p, why, sizeof(why))) {
				fuzz_note("prefix", why);
				FUZZ_CHECK(expect != 0 && expect != -EAGAIN);
				dead = true;
				break;
			}
			if (hdr_cap < p.header_len) {
				uint8_t *b = realloc(hdr, p.header_len);
				FUZZ_CHECK(b);
				hdr = b;
				hdr_cap = p.header_len;
			}
			stage = RX_HEADER;
			got = 0;
			break;
		case RX_HEADER: {
			memcpy(hdr + got, in, n);
			got += n;
			if (got < p.header_len)
				break;
			int rc;
			if (p.data) {
				struct frame_data d;
				if (frame_parse_data(hdr, p.header_len, p.payload_len, &lim, &d, why,
						     sizeof(why))) {
					fuzz_note("data header", why);
					FUZZ_CHECK(expect != 0);
					dead = true;
					break;
				}
				FUZZ_CHECK(expect == 0 || expect == -EAGAIN);
				rc = lm_data(m, &d, p.payload_len, why, sizeof(why));
			} else {
				Meshrun__Frame *f = frame_parse_header(hdr, p.header_len, p.payload_len,
								       &lim, why, sizeof(why));
				if (!f) {
					fuzz_note("header", why);
					/* frame_decode sees it only once the payload is in */
					FUZZ_CHECK(expect != 0);
					dead = true;
					break;
				}
				FUZZ_CHECK(expect == 0 || expect == -EAGAIN);
				rc = lm_frame(m, f, why, sizeof(why));
				frame_header_free(f);
			}
			if (rc) {
				FUZZ_CHECK(why[0]);
				fuzz_note("link model", why);
				dead = true;
				break;
			}
			got = 0;
			stage = RX_PAYLOAD;
			break;
		}
		case RX_PAYLOAD:
			lm_payload(m, in, n);
			got += n;
			break;
		}
		if (!dead && stage == RX_PAYLOAD && got == p.payload_len) {
			lm_payload_done(m);
			/* a whole frame: frame_decode must have seen the same one */
			FUZZ_CHECK(expect == 0 && r.pos - frame_start == flen);
			stage = RX_PREFIX;
			got = 0;
			frame_start = r.pos;
			expect = decode_at(&r, &flen);
		}
	}
	if (!dead && stage != RX_PREFIX)
		fuzz_note("stream", "ends inside a frame");
	if (!dead && r.pos == r.len)
		/* the stream ended: frame_decode must not see a whole frame */
		FUZZ_CHECK(expect == -EAGAIN);
	free(hdr);
	lm_free(m);
	return 0;
}
