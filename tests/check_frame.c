/* Frame encode/decode (net/frame.h) without sockets, and over the plain TCP
 * connection type: good frames of both kinds (protobuf control headers,
 * binary data headers) round-trip; truncated, oversized, wrong magic or
 * version, garbage headers, empty headers, payloads on control frames and
 * data headers with unknown flags, stray fields or fragments outside their
 * message are rejected without a crash or a leak (this suite also runs
 * under ASan). */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/frame.h"

static const struct frame_limits lim = { .max_payload = 1 << 20 };

/* Encodes f with payload into a fresh buffer; *len gets the total. */
static uint8_t *encode(const Meshrun__Frame *f, const void *payload, size_t plen, size_t *len)
{
	size_t hl = frame_encoded_len(f);
	uint8_t *b = malloc(hl + plen + 1);
	ck_assert_ptr_nonnull(b);
	size_t n = frame_encode(f, plen, b);
	ck_assert_uint_eq(n, hl);
	if (plen)
		memcpy(b + n, payload, plen);
	*len = n + plen;
	return b;
}

static uint8_t *hello_frame(size_t *len)
{
	static uint8_t hash[32] = { 1, 2, 3, 4 };
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Hello h = MESHRUN__HELLO__INIT;
	h.host_id = 3;
	h.num_hosts = 4;
	h.devices = 2;
	h.data_address = "127.0.0.1:7003";
	h.config_hash.data = hash;
	h.config_hash.len = sizeof(hash);
	h.version = "test";
	f.link_seq = 7;
	f.ack_seq = 6;
	f.body_case = MESHRUN__FRAME__BODY_HELLO;
	f.hello = &h;
	return encode(&f, NULL, 0, len);
}

/* A data frame (binary header) with payload. */
static uint8_t *data_frame(const struct frame_data *d, const uint8_t *payload, size_t plen,
			   size_t *len)
{
	uint8_t *b = malloc(FRAME_PREFIX_LEN + FRAME_DATA_HDR + plen + 1);
	ck_assert_ptr_nonnull(b);
	size_t n = frame_encode_data(d, plen, b);
	ck_assert_uint_eq(n, FRAME_PREFIX_LEN + FRAME_DATA_HDR);
	if (plen)
		memcpy(b + n, payload, plen);
	*len = n + plen;
	return b;
}

static uint8_t *chunk_frame(const uint8_t *payload, size_t plen, uint64_t msg_bytes,
			    uint64_t msg_offset, size_t *len)
{
	struct frame_data d = {
		.link_seq = 1, .tag = 0x0005000000091234ull, .msg_bytes = msg_bytes,
		.msg_offset = msg_offset, .step = 3, .src = 1, .dst = 2,
		.op = MESHRUN__COLL_OP__COLL_ALL_REDUCE,
	};
	return data_frame(&d, payload, plen, len);
}

START_TEST(test_hello_roundtrip)
{
	size_t len, used;
	uint8_t *b = hello_frame(&len);
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)), 0);
	ck_assert_uint_eq(used, len);
	ck_assert_uint_eq(plen, 0);
	ck_assert_ptr_null(pay);
	ck_assert_int_eq(h->body_case, MESHRUN__FRAME__BODY_HELLO);
	ck_assert_uint_eq(h->link_seq, 7);
	ck_assert_uint_eq(h->ack_seq, 6);
	ck_assert_uint_eq(h->hello->host_id, 3);
	ck_assert_uint_eq(h->hello->devices, 2);
	ck_assert_str_eq(h->hello->data_address, "127.0.0.1:7003");
	ck_assert_uint_eq(h->hello->config_hash.len, 32);
	ck_assert_uint_eq(h->hello->config_hash.data[3], 4);
	ck_assert_str_eq(h->hello->version, "test");
	frame_header_free(h);
	/* little-endian prefix */
	ck_assert_uint_eq(b[0], 0x4d);
	ck_assert_uint_eq(b[1], 0x53);
	ck_assert_uint_eq(b[4], FRAME_VERSION);
	ck_assert_uint_eq(b[6] | (b[7] << 8), len - FRAME_PREFIX_LEN);
	free(b);
}
END_TEST

START_TEST(test_chunk_roundtrip)
{
	uint8_t payload[1000];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 7);
	size_t len, used;
	uint8_t *b = chunk_frame(payload, sizeof(payload), 5000, 4000, &len);
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)), 0);
	ck_assert_uint_eq(plen, sizeof(payload));
	ck_assert_uint_eq(used, len);
	ck_assert_mem_eq(pay, payload, sizeof(payload));
	/* the view: tag split into group, sequence and chunk index */
	ck_assert_int_eq(h->body_case, MESHRUN__FRAME__BODY_CHUNK);
	ck_assert_uint_eq(h->chunk->tag, 0x0005000000091234ull);
	ck_assert_uint_eq(h->chunk->group_id, 5);
	ck_assert_uint_eq(h->chunk->coll_seq, 9);
	ck_assert_uint_eq(h->chunk->chunk_index, 0x1234);
	ck_assert_uint_eq(h->chunk->msg_offset, 4000);
	ck_assert_uint_eq(h->chunk->byte_count, sizeof(payload));
	ck_assert_int_eq(h->chunk->op, MESHRUN__COLL_OP__COLL_ALL_REDUCE);
	frame_header_free(h);
	/* "MSHD", version 2, the fixed header length, the payload length */
	ck_assert_mem_eq(b, "MSHD", 4);
	ck_assert_uint_eq(b[4] | (b[5] << 8), FRAME_VERSION);
	ck_assert_uint_eq(b[6] | (b[7] << 8), FRAME_DATA_HDR);
	ck_assert_uint_eq(b[8] | (b[9] << 8), sizeof(payload));
	free(b);
}
END_TEST

/* Every field of a binary data header, a riding RecvReady among them,
 * comes back from frame_parse_data at the place the layout names; and a
 * chunk view encodes to the same bytes. */
START_TEST(test_data_header_fields)
{
	struct frame_data d = {
		.link_seq = 0x0102030405060708ull, .ack_seq = 0x1112131415161718ull,
		.tag = 0x2122232425262728ull, .msg_bytes = 1u << 20, .msg_offset = 65536,
		.step = 0x4142434445464748ull, .src = 0x51525354, .dst = 0x61626364,
		.flags = FRAME_DATA_EAGER | FRAME_DATA_ACK | FRAME_DATA_RR,
		.op = MESHRUN__COLL_OP__COLL_PERMUTE,
		.rr = { .src = 7, .dst = 9, .tag = 0x7172737475767778ull, .bytes = 4096 },
	};
	uint8_t b[FRAME_PREFIX_LEN + FRAME_DATA_HDR];
	ck_assert_uint_eq(frame_encode_data(&d, 100, b), sizeof(b));
	const uint8_t *h = b + FRAME_PREFIX_LEN;
	ck_assert_uint_eq(h[0], 0x08);              /* link_seq, little-endian */
	ck_assert_uint_eq(h[8 + 7], 0x11);          /* ack_seq's top byte */
	ck_assert_uint_eq(h[48], 0x54);             /* src */
	ck_assert_uint_eq(h[56], 7);                /* flags */
	ck_assert_uint_eq(h[72], 0x78);             /* rr.tag */
	struct frame_data got;
	char err[256];
	ck_assert_int_eq(frame_parse_data(h, FRAME_DATA_HDR, 100, &lim, &got, err, sizeof(err)), 0);
	ck_assert_mem_eq(&got, &d, sizeof(d));
	/* through the protobuf view and back (the view carries no ack or rr) */
	Meshrun__Frame f;
	Meshrun__CollectiveChunk c;
	frame_data_view(&d, 100, &f, &c);
	ck_assert(c.eager);
	ck_assert_uint_eq(c.src_device, d.src);
	struct frame_data back;
	frame_data_from_view(&f, &back);
	ck_assert_uint_eq(back.tag, d.tag);
	ck_assert_uint_eq(back.step, d.step);
	ck_assert_uint_eq(back.flags, FRAME_DATA_EAGER);
	ck_assert_uint_eq(back.rr.tag, 0);
}
END_TEST

/* Every proper prefix of a frame asks for more and allocates nothing. */
START_TEST(test_truncated)
{
	uint8_t payload[100] = { 9 };
	size_t len, used;
	uint8_t *b = chunk_frame(payload, sizeof(payload), 100, 0, &len);
	Meshrun__Frame *h = (Meshrun__Frame *)1;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	for (size_t cut = 0; cut < len; cut++) {
		ck_assert_int_eq(frame_decode(b, cut, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
				 -EAGAIN);
		ck_assert_ptr_null(h);
	}
	free(b);
}
END_TEST

START_TEST(test_oversized_payload)
{
	size_t len, used;
	uint8_t *b = hello_frame(&len);
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	/* claim a payload far above max_frame_bytes: refused from the prefix */
	b[8] = 0;
	b[9] = 0;
	b[10] = 0;
	b[11] = 0;
	b[12] = 0;
	b[13] = 0;
	b[14] = 0;
	b[15] = 0x80;
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EMSGSIZE);
	ck_assert_ptr_nonnull(strstr(err, "exceeds max_frame_bytes"));
	struct frame_prefix p;
	ck_assert_int_eq(frame_parse_prefix(b, &lim, &p, err, sizeof(err)), -EMSGSIZE);
	/* one byte over the limit */
	struct frame_limits small = { .max_payload = 99 };
	uint8_t payload[100] = { 0 };
	free(b);
	b = chunk_frame(payload, sizeof(payload), 100, 0, &len);
	ck_assert_int_eq(frame_decode(b, len, &small, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EMSGSIZE);
	free(b);
}
END_TEST

START_TEST(test_oversized_header)
{
	size_t len, used;
	uint8_t *b = hello_frame(&len);
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	struct frame_limits tight = { .max_payload = 1 << 20, .max_header = 8 };
	ck_assert_int_eq(frame_decode(b, len, &tight, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EMSGSIZE);
	ck_assert_ptr_nonnull(strstr(err, "header of"));
	free(b);
}
END_TEST

START_TEST(test_wrong_magic_and_version)
{
	size_t len, used;
	uint8_t *b = hello_frame(&len);
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	b[0] ^= 0xff;
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "wrong magic"));
	b[0] ^= 0xff;
	b[4] = FRAME_VERSION + 1;
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "wire version"));
	free(b);
}
END_TEST

START_TEST(test_zero_length)
{
	uint8_t b[FRAME_PREFIX_LEN] = { 0x4d, 0x53, 0x48, 0x52, FRAME_VERSION, 0, 0, 0 };
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	size_t used;
	char err[256];
	ck_assert_int_eq(frame_decode(b, sizeof(b), &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "empty frame header"));
	ck_assert_ptr_null(frame_parse_header(b, 0, 0, &lim, err, sizeof(err)));
}
END_TEST

START_TEST(test_garbage_header)
{
	/* a header that is not protobuf, and a valid protobuf with no body */
	uint8_t b[FRAME_PREFIX_LEN + 8] = { 0x4d, 0x53, 0x48, 0x52, FRAME_VERSION, 0, 8, 0 };
	memset(b + FRAME_PREFIX_LEN, 0xff, 8);
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	size_t used;
	char err[256];
	ck_assert_int_eq(frame_decode(b, sizeof(b), &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "malformed"));
	uint8_t nobody[] = { 0x08, 0x01 };  /* link_seq = 1, nothing else */
	ck_assert_ptr_null(frame_parse_header(nobody, sizeof(nobody), 0, &lim, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "without a known body"));
}
END_TEST

START_TEST(test_payload_rules)
{
	size_t len, used;
	Meshrun__Frame *h;
	const uint8_t *pay;
	uint64_t plen;
	char err[256];
	uint8_t payload[64] = { 1 };

	/* a hello frame followed by bytes it claims as payload */
	uint8_t *b = hello_frame(&len);
	uint8_t *big = malloc(len + sizeof(payload));
	memcpy(big, b, len);
	memcpy(big + len, payload, sizeof(payload));
	big[8] = sizeof(payload);
	ck_assert_int_eq(frame_decode(big, len + sizeof(payload), &lim, &h, &pay, &plen, &used,
				      err, sizeof(err)), -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "control frame carries a payload"));
	struct frame_prefix pp;
	ck_assert_int_eq(frame_parse_prefix(big, &lim, &pp, err, sizeof(err)), -EPROTO);
	free(big);
	free(b);

	/* a chunk body in a control frame: data goes only in data frames */
	Meshrun__Frame cf = MESHRUN__FRAME__INIT;
	Meshrun__CollectiveChunk cc = MESHRUN__COLLECTIVE_CHUNK__INIT;
	cf.body_case = MESHRUN__FRAME__BODY_CHUNK;
	cf.chunk = &cc;
	size_t clen = meshrun__frame__get_packed_size(&cf);
	uint8_t *cb = malloc(clen);
	meshrun__frame__pack(&cf, cb);
	ck_assert_ptr_null(frame_parse_header(cb, clen, 0, &lim, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "chunk body in a control frame"));
	free(cb);

	/* fragment reaching past its message */
	b = chunk_frame(payload, sizeof(payload), 100, 50, &len);
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "outside its message"));
	free(b);

	/* unknown flags; rr fields without their flag; an unknown op; a data
	 * header of another length */
	struct frame_data d = { .link_seq = 1, .msg_bytes = 64, .flags = 8 };
	b = data_frame(&d, payload, sizeof(payload), &len);
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "unknown flags"));
	free(b);
	d.flags = 0;
	d.rr.bytes = 4;
	b = data_frame(&d, payload, sizeof(payload), &len);
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "without its flag"));
	d.flags = FRAME_DATA_RR;
	free(b);
	b = data_frame(&d, payload, sizeof(payload), &len);
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)), 0);
	frame_header_free(h);
	free(b);
	d.op = MESHRUN__COLL_OP__COLL_P2P + 1;
	b = data_frame(&d, payload, sizeof(payload), &len);
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)),
			 -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "unknown op"));
	b[6] = FRAME_DATA_HDR - 8;
	ck_assert_int_eq(frame_parse_prefix(b, &lim, &pp, err, sizeof(err)), -EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "data frame header of"));
	free(b);

	/* an empty chunk is fine */
	b = chunk_frame(NULL, 0, 0, 0, &len);
	ck_assert_int_eq(frame_decode(b, len, &lim, &h, &pay, &plen, &used, err, sizeof(err)), 0);
	ck_assert_uint_eq(plen, 0);
	frame_header_free(h);
	free(b);
}
END_TEST

/* Random corruption of a good frame: decode answers, never crashes or
 * leaks (ASan). */
START_TEST(test_mutations)
{
	uint8_t payload[300];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)i;
	size_t len;
	uint8_t *good = chunk_frame(payload, sizeof(payload), 1000, 0, &len);
	uint8_t *b = malloc(len);
	unsigned seed = 12345;
	int ok = 0, bad = 0;
	for (int it = 0; it < 20000; it++) {
		memcpy(b, good, len);
		int flips = 1 + (int)(rand_r(&seed) % 4);
		for (int k = 0; k < flips; k++)
			b[rand_r(&seed) % len] = (uint8_t)rand_r(&seed);
		size_t cut = (rand_r(&seed) % 8) ? len : rand_r(&seed) % len;
		Meshrun__Frame *h;
		const uint8_t *pay;
		uint64_t plen;
		size_t used;
		char err[256];
		int rc = frame_decode(b, cut, &lim, &h, &pay, &plen, &used, err, sizeof(err));
		if (rc == 0) {
			ck_assert_uint_le(used, cut);
			frame_header_free(h);
			ok++;
		} else {
			ck_assert(rc == -EAGAIN || rc == -EPROTO || rc == -EMSGSIZE);
			bad++;
		}
	}
	ck_assert_int_gt(bad, 0);
	ck_assert_int_gt(ok, 0);
	free(b);
	free(good);
}
END_TEST

/* Frames streamed through the plain TCP connection type in small pieces
 * come out whole and in order. */
START_TEST(test_tcp_conn_stream)
{
	int sv[2];
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(conn_set_nonblock(sv[0]), 0);
	ck_assert_int_eq(conn_set_nonblock(sv[1]), 0);
	struct conn *a = conn_new_tcp(sv[0]), *z = conn_new_tcp(sv[1]);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(z);
	ck_assert_int_eq(conn_handshake(a), 0);
	/* plain TCP names no host, and has no keys to renew */
	char why[128] = "";
	ck_assert_int_lt(conn_peer_host(a, why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, "no host identity"));
	conn_set_key_update(a, 65536, NULL);

	enum { NFRAMES = 50 };
	uint8_t *stream = NULL;
	size_t slen = 0;
	for (int i = 0; i < NFRAMES; i++) {
		uint8_t payload[200];
		memset(payload, i, sizeof(payload));
		size_t n = (size_t)(i * 4) % sizeof(payload), len;
		uint8_t *f = chunk_frame(payload, n, n, 0, &len);
		stream = realloc(stream, slen + len);
		memcpy(stream + slen, f, len);
		slen += len;
		free(f);
	}
	/* write in odd pieces, read in other odd pieces, decode as we go */
	uint8_t *rx = malloc(slen);
	size_t woff = 0, roff = 0, doff = 0;
	int got = 0;
	while (got < NFRAMES) {
		if (woff < slen) {
			size_t n = slen - woff < 37 ? slen - woff : 37;
			ssize_t w = conn_write(a, stream + woff, n);
			ck_assert(w > 0 || w == -EAGAIN);
			if (w > 0)
				woff += (size_t)w;
		}
		ck_assert_int_eq(conn_flush(a), 0);
		ssize_t r = conn_read(z, rx + roff, slen - roff < 23 ? slen - roff : 23);
		ck_assert(r > 0 || r == -EAGAIN);
		if (r > 0)
			roff += (size_t)r;
		for (;;) {
			Meshrun__Frame *h;
			const uint8_t *pay;
			uint64_t plen;
			size_t used;
			char err[256];
			int rc = frame_decode(rx + doff, roff - doff, &lim, &h, &pay, &plen, &used,
					      err, sizeof(err));
			if (rc == -EAGAIN)
				break;
			ck_assert_int_eq(rc, 0);
			ck_assert_uint_eq(plen, (size_t)(got * 4) % 200);
			for (uint64_t k = 0; k < plen; k++)
				ck_assert_uint_eq(pay[k], got);
			frame_header_free(h);
			doff += used;
			got++;
		}
	}
	ck_assert_uint_eq(doff, slen);
	/* orderly close reads as 0 */
	ck_assert_int_eq(conn_shutdown(a), 0);
	uint8_t c;
	ck_assert_int_eq(conn_read(z, &c, 1), 0);
	free(rx);
	free(stream);
	conn_free(a);
	conn_free(z);
}
END_TEST

START_TEST(test_split_addr)
{
	char h[64];
	int port;
	ck_assert_int_eq(conn_split_addr("127.0.0.1:7000", h, sizeof(h), &port), 0);
	ck_assert_str_eq(h, "127.0.0.1");
	ck_assert_int_eq(port, 7000);
	ck_assert_int_eq(conn_split_addr("[::1]:80", h, sizeof(h), &port), 0);
	ck_assert_str_eq(h, "::1");
	ck_assert_int_eq(conn_split_addr("nohost", h, sizeof(h), &port), -EINVAL);
	ck_assert_int_eq(conn_split_addr("h:99999", h, sizeof(h), &port), -EINVAL);
	ck_assert_int_eq(conn_split_addr("h:", h, sizeof(h), &port), -EINVAL);
}
END_TEST

static Suite *frame_suite(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("roundtrip");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_hello_roundtrip);
	tcase_add_test(tc, test_chunk_roundtrip);
	tcase_add_test(tc, test_data_header_fields);
	suite_add_tcase(s, tc);

	tc = tcase_create("rejects");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_truncated);
	tcase_add_test(tc, test_oversized_payload);
	tcase_add_test(tc, test_oversized_header);
	tcase_add_test(tc, test_wrong_magic_and_version);
	tcase_add_test(tc, test_zero_length);
	tcase_add_test(tc, test_garbage_header);
	tcase_add_test(tc, test_payload_rules);
	tcase_add_test(tc, test_mutations);
	suite_add_tcase(s, tc);

	tc = tcase_create("tcp_conn");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_tcp_conn_stream);
	tcase_add_test(tc, test_split_addr);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(frame_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
