/* Writes the seed corpora of the fuzz targets: real frames encoded by
 * frame_encode (net/frame.h: protobuf-c control headers, binary data
 * headers), the bodies alone for fuzz_control (a data frame's binary
 * header and its payload length for the chunk kind), frame
 * streams that the link model accepts, configs with overrides, and small
 * safetensors files written by st_write. gen_seeds OUTDIR [CONFIG.yml ...]
 * writes OUTDIR/{frame,control,stream,config,safetensors}/NAME; the
 * Makefile's fuzz-seeds step adds a real tiny checkpoint beside them. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/ckpt/safetensors.h"
#include "net/frame.h"
#include "net/net.h"
#include "net/link.h"
#include "tests/fuzz/link_model.h"

static const char *outdir;

static void put(const char *target, const char *name, const void *p, size_t n)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", outdir, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
	FILE *f = fopen(path, "wb");
	if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
		fprintf(stderr, "gen_seeds: unable to write '%s'\n", path);
		exit(1);
	}
}

/* A growing byte buffer */
struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void add(struct buf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			exit(1);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

/* Appends frame f with its payload (for a chunk: byte_count bytes). */
static void add_frame(struct buf *b, Meshrun__Frame *f, uint8_t fill)
{
	uint64_t plen = f->body_case == MESHRUN__FRAME__BODY_CHUNK ? f->chunk->byte_count : 0;
	uint8_t *h = malloc(frame_encoded_len(f));
	size_t n = frame_encode(f, plen, h);
	if (!h || !n)
		exit(1);
	add(b, h, n);
	free(h);
	for (uint64_t i = 0; i < plen; i++) {
		uint8_t v = (uint8_t)(fill + i);
		add(b, &v, 1);
	}
}

/* ---- one message of each kind, in a Frame ---- */

static uint8_t hash[32];
static Meshrun__Hello hello = MESHRUN__HELLO__INIT;
static Meshrun__HostInfo hi0 = MESHRUN__HOST_INFO__INIT, hi1 = MESHRUN__HOST_INFO__INIT;
static Meshrun__HostInfo *his[2] = { &hi0, &hi1 };
static Meshrun__Topology topo = MESHRUN__TOPOLOGY__INIT;
static Meshrun__Refuse refuse = MESHRUN__REFUSE__INIT;
static Meshrun__LinkHello link_hello = MESHRUN__LINK_HELLO__INIT;
static Meshrun__Heartbeat heartbeat = MESHRUN__HEARTBEAT__INIT;
static Meshrun__Barrier barrier = MESHRUN__BARRIER__INIT;
static Meshrun__Abort abort_ = MESHRUN__ABORT__INIT;
static Meshrun__Done done = MESHRUN__DONE__INIT;
static Meshrun__RecvReady ready = MESHRUN__RECV_READY__INIT;

static void init_messages(void)
{
	memset(hash, LM_CONFIG_HASH_BYTE, sizeof(hash));
	hello.host_id = 1;
	hello.num_hosts = LM_NUM_HOSTS;
	hello.devices = 2;
	hello.data_address = "127.0.0.1:7001";
	hello.config_hash.data = hash;
	hello.config_hash.len = sizeof(hash);
	hello.version = NET_VERSION;
	hi0.host_id = 0;
	hi0.data_address = "127.0.0.1:7000";
	hi0.devices = 2;
	hi1.host_id = 1;
	hi1.data_address = "[::1]:7001";
	hi1.devices = 2;
	topo.n_hosts = 2;
	topo.hosts = his;
	topo.job_id = 0x1234567890abcdefull;
	refuse.reason = "duplicate host id 1: host 1 already joined";
	link_hello.host_id = 0;
	link_hello.job_id = topo.job_id;
	heartbeat.sent_ns = 123456789;
	barrier.seq = 1;
	abort_.host_id = 0;
	abort_.reason = "lost host 2 (127.0.0.1:7002): no heartbeat for 4.0 s";
	abort_.code = 5;
	done.host_id = 0;
	done.status = 0;
	ready.src_device = 3;
	ready.dst_device = 1;
	ready.tag = LM_TAG(3);
	ready.byte_count = LM_SEND_BYTES;
}

static Meshrun__CollectiveChunk chunk(int src, int dst, uint64_t tag, uint64_t msg_bytes,
				      uint64_t off, uint64_t count, int eager)
{
	Meshrun__CollectiveChunk c = MESHRUN__COLLECTIVE_CHUNK__INIT;
	c.op = MESHRUN__COLL_OP__COLL_P2P;
	c.group_id = LM_GROUP;
	c.coll_seq = LM_SEQ;
	c.step = 7;
	c.src_device = (uint32_t)src;
	c.dst_device = (uint32_t)dst;
	c.chunk_index = (uint32_t)(tag & 0xffff);
	c.offset = off;
	c.byte_count = count;
	c.tag = tag;
	c.msg_bytes = msg_bytes;
	c.msg_offset = off;
	c.eager = eager;
	return c;
}

static Meshrun__Frame frame(uint64_t seq, int body, void *msg)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	f.link_seq = seq;
	f.ack_seq = seq ? seq - 1 : 0;
	f.body_case = body;
	switch (body) {
	case MESHRUN__FRAME__BODY_HELLO: f.hello = msg; break;
	case MESHRUN__FRAME__BODY_TOPOLOGY: f.topology = msg; break;
	case MESHRUN__FRAME__BODY_REFUSE: f.refuse = msg; break;
	case MESHRUN__FRAME__BODY_LINK_HELLO: f.link_hello = msg; break;
	case MESHRUN__FRAME__BODY_HEARTBEAT: f.heartbeat = msg; break;
	case MESHRUN__FRAME__BODY_BARRIER: f.barrier = msg; break;
	case MESHRUN__FRAME__BODY_ABORT: f.abort = msg; break;
	case MESHRUN__FRAME__BODY_DONE: f.done = msg; break;
	case MESHRUN__FRAME__BODY_CHUNK: f.chunk = msg; break;
	case MESHRUN__FRAME__BODY_RECV_READY: f.recv_ready = msg; break;
	}
	return f;
}

/* fuzz_control's state bits (byte 1), as in fuzz_control.c */
#define CTL_RUNNING   0x04
#define CTL_REPLAY    0x08
#define CTL_WAS_UP    0x10
#define CTL_PART      0x80
#define CTL_NEXT      5      /* the next link_seq on a link that ran */

/* fuzz_control: the body selector, the link's state, the frame's link_seq
 * and ack_seq, then the body alone */
static void put_control_ack(const char *name, int body, unsigned st, uint8_t seq, uint8_t ack,
			    const void *msg)
{
	const ProtobufCMessage *m = msg;
	bool data = body == MESHRUN__FRAME__BODY_CHUNK;
	size_t n = data ? FRAME_DATA_HDR + 2 : protobuf_c_message_get_packed_size(m);
	uint8_t *p = malloc(n + 4 + FRAME_PREFIX_LEN);
	if (!p)
		exit(1);
	p[0] = (uint8_t)(body - MESHRUN__FRAME__BODY_HELLO);
	p[1] = (uint8_t)st;
	p[2] = seq;
	p[3] = ack;
	if (data) {
		/* the binary header (after its prefix) and the payload length */
		const Meshrun__CollectiveChunk *c = msg;
		Meshrun__Frame f = MESHRUN__FRAME__INIT;
		struct frame_data d;
		f.link_seq = seq;
		f.ack_seq = ack;
		f.body_case = MESHRUN__FRAME__BODY_CHUNK;
		f.chunk = (Meshrun__CollectiveChunk *)c;
		frame_data_from_view(&f, &d);
		uint8_t tmp[FRAME_PREFIX_LEN + FRAME_DATA_HDR];
		frame_encode_data(&d, c->byte_count, tmp);
		memcpy(p + 4, tmp + FRAME_PREFIX_LEN, FRAME_DATA_HDR);
		p[4 + FRAME_DATA_HDR] = (uint8_t)c->byte_count;
		p[4 + FRAME_DATA_HDR + 1] = (uint8_t)(c->byte_count >> 8);
	} else {
		protobuf_c_message_pack(m, p + 4);
	}
	put("control", name, p, n + 4);
	free(p);
}

/* ... acknowledging what a link that ran has received before */
static void put_control(const char *name, int body, unsigned st, uint8_t seq, const void *msg)
{
	put_control_ack(name, body, st, seq, st & CTL_RUNNING ? 3 : 0, msg);
}

/* The state each kind arrives in: a hello kind before the hello on the
 * connection of the role that takes it, the rest on a running link. */
static unsigned control_state(int body)
{
	switch (body) {
	case MESHRUN__FRAME__BODY_HELLO: return ROLE_COORD_IN;
	case MESHRUN__FRAME__BODY_TOPOLOGY: return ROLE_COORD_OUT;
	case MESHRUN__FRAME__BODY_REFUSE: return ROLE_COORD_OUT;
	case MESHRUN__FRAME__BODY_LINK_HELLO: return ROLE_LINK_IN;
	default: return CTL_RUNNING;
	}
}

/* The states the rendezvous and recovery checks tell apart. */
static void control_states(void)
{
	static Meshrun__Ack ack = MESHRUN__ACK__INIT;
	Meshrun__LinkHello resume = link_hello;
	resume.resume = 1;
	resume.last_seq = 3;
	put_control("link_hello-answer", MESHRUN__FRAME__BODY_LINK_HELLO, ROLE_LINK_OUT, 1,
		    &link_hello);
	put_control("link_hello-resume-accept", MESHRUN__FRAME__BODY_LINK_HELLO,
		    ROLE_LINK_IN | CTL_REPLAY | CTL_WAS_UP, 0, &resume);
	put_control("link_hello-resume-answer", MESHRUN__FRAME__BODY_LINK_HELLO,
		    ROLE_LINK_OUT | CTL_REPLAY | CTL_WAS_UP, 0, &resume);
	put_control("link_hello-duplicate", MESHRUN__FRAME__BODY_LINK_HELLO, ROLE_LINK_IN | 0x40, 1,
		    &link_hello);
	put_control("refuse-link", MESHRUN__FRAME__BODY_REFUSE, ROLE_LINK_OUT, 1, &refuse);
	put_control("hello-late", MESHRUN__FRAME__BODY_HELLO, ROLE_COORD_IN | 0x20, 1, &hello);
	put_control("ack", MESHRUN__FRAME__BODY_ACK, CTL_RUNNING | CTL_REPLAY, 0, &ack);
	put_control("heartbeat-dup", MESHRUN__FRAME__BODY_HEARTBEAT, CTL_RUNNING | CTL_REPLAY, 3,
		    &heartbeat);
	put_control_ack("heartbeat-ack-unsent", MESHRUN__FRAME__BODY_HEARTBEAT,
			CTL_RUNNING | CTL_REPLAY, CTL_NEXT, 7, &heartbeat);
	put_control("heartbeat-bad-seq", MESHRUN__FRAME__BODY_HEARTBEAT, CTL_RUNNING, 9,
		    &heartbeat);
	put_control("hello-on-running-link", MESHRUN__FRAME__BODY_HELLO, CTL_RUNNING, CTL_NEXT,
		    &hello);
}

/* fuzz_frame: each kind as one whole frame; fuzz_control: its body alone
 * (put_control) */
static void one_of_each(void)
{
	static const struct { int body; void *msg; } kinds[] = {
		{ MESHRUN__FRAME__BODY_HELLO, &hello },
		{ MESHRUN__FRAME__BODY_TOPOLOGY, &topo },
		{ MESHRUN__FRAME__BODY_REFUSE, &refuse },
		{ MESHRUN__FRAME__BODY_LINK_HELLO, &link_hello },
		{ MESHRUN__FRAME__BODY_HEARTBEAT, &heartbeat },
		{ MESHRUN__FRAME__BODY_BARRIER, &barrier },
		{ MESHRUN__FRAME__BODY_ABORT, &abort_ },
		{ MESHRUN__FRAME__BODY_DONE, &done },
		{ MESHRUN__FRAME__BODY_RECV_READY, &ready },
	};
	Meshrun__CollectiveChunk c0 = chunk(0, 2, LM_TAG(0), LM_RECV0_BYTES, 0, LM_RECV0_BYTES, 0);
	Meshrun__CollectiveChunk c1 = chunk(1, 3, LM_TAG(1), LM_RECV1_BYTES, 0, LM_RECV1_BYTES, 0);
	Meshrun__CollectiveChunk ce = chunk(0, 2, LM_TAG(9), 48, 0, 48, 1);
	Meshrun__CollectiveChunk cz = chunk(0, 3, LM_TAG(8), 0, 0, 0, 1);
	struct { const char *name; Meshrun__CollectiveChunk *c; } chunks[] = {
		{ "chunk-recv0", &c0 }, { "chunk-recv1-sum", &c1 },
		{ "chunk-eager-staged", &ce }, { "chunk-eager-empty", &cz },
	};
	struct buf all = { 0 };
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		Meshrun__Frame f = frame(1, kinds[i].body, kinds[i].msg);
		struct buf b = { 0 };
		add_frame(&b, &f, 0);
		put("frame", frame_body_name(kinds[i].body), b.p, b.n);
		add_frame(&all, &f, 0);
		free(b.p);

		unsigned st = control_state(kinds[i].body);
		put_control(frame_body_name(kinds[i].body), kinds[i].body, st,
			    st & CTL_RUNNING ? CTL_NEXT : 1, kinds[i].msg);
	}
	control_states();
	put("frame", "all-kinds", all.p, all.n);
	free(all.p);
	for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
		Meshrun__Frame f = frame(1, MESHRUN__FRAME__BODY_CHUNK, chunks[i].c);
		struct buf b = { 0 };
		add_frame(&b, &f, 0x40);
		put("frame", chunks[i].name, b.p, b.n);
		free(b.p);
		put_control(chunks[i].name, MESHRUN__FRAME__BODY_CHUNK, CTL_RUNNING, CTL_NEXT,
			    chunks[i].c);
	}
	put_control("chunk-rest-after-break", MESHRUN__FRAME__BODY_CHUNK,
		    CTL_RUNNING | CTL_REPLAY | CTL_PART, CTL_NEXT, &c0);
	/* a data frame carrying the RecvReady the waiting send 3->1 needs */
	struct frame_data rd = {
		.link_seq = CTL_NEXT, .ack_seq = 3, .tag = LM_TAG(0), .msg_bytes = LM_RECV0_BYTES,
		.src = 0, .dst = 2, .op = MESHRUN__COLL_OP__COLL_P2P, .flags = FRAME_DATA_RR,
		.rr = { .src = 3, .dst = 1, .tag = LM_TAG(3), .bytes = LM_SEND_BYTES },
	};
	uint8_t tmp[FRAME_PREFIX_LEN + FRAME_DATA_HDR], ctl[4 + FRAME_DATA_HDR + 2];
	frame_encode_data(&rd, LM_RECV0_BYTES, tmp);
	ctl[0] = (uint8_t)(MESHRUN__FRAME__BODY_CHUNK - MESHRUN__FRAME__BODY_HELLO);
	ctl[1] = CTL_RUNNING | CTL_REPLAY;
	ctl[2] = CTL_NEXT;
	ctl[3] = 3;
	memcpy(ctl + 4, tmp + FRAME_PREFIX_LEN, FRAME_DATA_HDR);
	ctl[4 + FRAME_DATA_HDR] = LM_RECV0_BYTES;
	ctl[4 + FRAME_DATA_HDR + 1] = 0;
	put("control", "chunk-with-recv_ready", ctl, sizeof(ctl));
	struct buf b = { 0 };
	add(&b, tmp, sizeof(tmp));
	for (int i = 0; i < LM_RECV0_BYTES; i++) {
		uint8_t v = (uint8_t)i;
		add(&b, &v, 1);
	}
	put("frame", "chunk-with-recv_ready", b.p, b.n);
	free(b.p);
}

/* fuzz_stream: 4 bytes that seed the read splits, then a stream of frames
 * numbered from 1, as a running link sees it */
static void stream(const char *name, uint32_t split, const Meshrun__Frame *fs, int n)
{
	struct buf b = { 0 };
	add(&b, &split, 4);
	for (int i = 0; i < n; i++) {
		Meshrun__Frame f = fs[i];
		f.link_seq = (uint64_t)i + 1;
		add_frame(&b, &f, (uint8_t)(0x10 * i));
	}
	put("stream", name, b.p, b.n);
	free(b.p);
}

static void streams(void)
{
	/* the 64-byte receive in two fragments, the summing receive whole,
	 * eager data staged, the RecvReady the waiting send needs */
	Meshrun__CollectiveChunk a = chunk(0, 2, LM_TAG(0), LM_RECV0_BYTES, 0, 40, 0);
	Meshrun__CollectiveChunk b = chunk(0, 2, LM_TAG(0), LM_RECV0_BYTES, 40, 24, 0);
	Meshrun__CollectiveChunk s1 = chunk(1, 3, LM_TAG(1), LM_RECV1_BYTES, 0, 100, 0);
	Meshrun__CollectiveChunk s2 = chunk(1, 3, LM_TAG(1), LM_RECV1_BYTES, 100, 156, 0);
	Meshrun__CollectiveChunk e = chunk(1, 2, LM_TAG(5), 96, 0, 96, 1);
	Meshrun__RecvReady eager_ready = ready;
	eager_ready.src_device = 2;
	eager_ready.dst_device = 0;
	eager_ready.tag = LM_TAG(2);
	eager_ready.byte_count = LM_SEND_EAGER_BYTES;
	Meshrun__Frame run[] = {
		frame(0, MESHRUN__FRAME__BODY_BARRIER, &barrier),
		frame(0, MESHRUN__FRAME__BODY_HEARTBEAT, &heartbeat),
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &a),
		frame(0, MESHRUN__FRAME__BODY_RECV_READY, &ready),
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &b),
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &s1),
		frame(0, MESHRUN__FRAME__BODY_RECV_READY, &eager_ready),
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &s2),
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &e),
		frame(0, MESHRUN__FRAME__BODY_DONE, &done),
	};
	int nrun = (int)(sizeof(run) / sizeof(run[0]));
	stream("run-whole-reads", 0x00000008u, run, nrun); /* rng & 7 == 0 first */
	stream("run-small-reads", 0x12345677u, run, nrun);
	Meshrun__Frame aborted[] = {
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &a),
		frame(0, MESHRUN__FRAME__BODY_ABORT, &abort_),
		frame(0, MESHRUN__FRAME__BODY_CHUNK, &b),
	};
	stream("abort-mid-message", 0xdeadbeefu, aborted, 3);
	/* a rendezvous frame on a running link: a bad frame */
	Meshrun__Frame late[] = {
		frame(0, MESHRUN__FRAME__BODY_HEARTBEAT, &heartbeat),
		frame(0, MESHRUN__FRAME__BODY_HELLO, &hello),
	};
	stream("hello-on-running-link", 0x0badf00du, late, 2);
	/* a stream cut in the middle of a payload */
	struct buf cut = { 0 };
	uint32_t split = 0x01020304u;
	add(&cut, &split, 4);
	Meshrun__Frame f = frame(1, MESHRUN__FRAME__BODY_CHUNK, &s1);
	add_frame(&cut, &f, 0x33);
	put("stream", "cut-in-payload", cut.p, cut.n - 30);
	free(cut.p);
}

/* ---- configs: the file, a NUL, override lines ---- */

static void config_seed(const char *name, const char *yml, size_t ylen, const char *overrides)
{
	struct buf b = { 0 };
	add(&b, yml, ylen);
	if (overrides) {
		add(&b, "", 1);
		add(&b, overrides, strlen(overrides));
	}
	put("config", name, b.p, b.n);
	free(b.p);
}

static void configs(int argc, char **argv)
{
	static const char small[] =
		"base_config: base.yml\n"
		"hosts: [\"10.0.0.1:7000\", \"10.0.0.2:7000\"]\n"
		"dcn_data_parallelism: 2\n"
		"ici_data_parallelism: -1\n"
		"logical_axis_rules:\n  - vocab=tensor\n  - embed=fsdp|expert\n  - norm=\n"
		"dataset_type: \"text\"\n"
		"steps: 5\n";
	config_seed("small", small, sizeof(small) - 1,
		    "learning_rate=1e-4\nhosts=a:1,b:2\nopt_type=adamw\nsegment_bytes=64K");
	config_seed("empty", "", 0, NULL);
	for (int i = 0; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		static char text[1 << 16];
		if (!f) {
			fprintf(stderr, "gen_seeds: unable to open '%s'\n", argv[i]);
			exit(1);
		}
		size_t n = fread(text, 1, sizeof(text), f);
		fclose(f);
		const char *base = strrchr(argv[i], '/') ? strrchr(argv[i], '/') + 1 : argv[i];
		char name[256];
		snprintf(name, sizeof(name), "%s", base);
		config_seed(name, text, n, NULL);
		snprintf(name, sizeof(name), "%s+overrides", base);
		config_seed(name, text, n, "steps=3\nper_device_batch_size=2\nlogits_via_embedding=true\n"
					   "dcn_data_parallelism=-1\nheartbeat_timeout_s=2.5");
	}
}

/* ---- safetensors ---- */

static void read_back(const char *path, const char *name)
{
	FILE *f = fopen(path, "rb");
	static uint8_t data[1 << 16];
	size_t n = f ? fread(data, 1, sizeof(data), f) : 0;
	if (!f || n == sizeof(data)) {
		fprintf(stderr, "gen_seeds: unable to read '%s'\n", path);
		exit(1);
	}
	fclose(f);
	remove(path);
	put("safetensors", name, data, n);
}

static void safetensors(void)
{
	char path[1024], err[512];
	float w[12], b[3], s = 0.5f;
	for (int i = 0; i < 12; i++)
		w[i] = (float)i * 0.25f - 1.0f;
	for (int i = 0; i < 3; i++)
		b[i] = (float)i;
	struct st_tensor t[] = {
		{ "layers.0.weight", 2, { 4, 3 }, w, ST_F32 },
		{ "layers.0.bias", 1, { 3 }, b, ST_F32 },
		{ "scale", 0, { 0 }, &s, ST_F32 },
		{ "empty", 2, { 0, 5 }, NULL, ST_F32 },
	};
	static const char *const meta[] = { "format", "pt", "step", "10", NULL };
	snprintf(path, sizeof(path), "%s/tmp.safetensors", outdir);
	if (st_write(path, t, 4, meta, err, sizeof(err))) {
		fprintf(stderr, "gen_seeds: %s\n", err);
		exit(1);
	}
	read_back(path, "f32-four-tensors");
	if (st_write(path, t, 0, NULL, err, sizeof(err))) {
		fprintf(stderr, "gen_seeds: %s\n", err);
		exit(1);
	}
	read_back(path, "no-tensors");

	/* BF16, which st_write does not write: by hand, padded to 8 */
	static const char hdr[] =
		"{\"__metadata__\":{\"format\":\"pt\"},"
		"\"h\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
		"\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}";
	struct buf o = { 0 };
	size_t hl = (sizeof(hdr) - 1 + 7) / 8 * 8;
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	add(&o, len8, 8);
	add(&o, hdr, sizeof(hdr) - 1);
	for (size_t i = sizeof(hdr) - 1; i < hl; i++)
		add(&o, " ", 1);
	static const uint16_t bf[6] = { 0x3f80, 0xbf80, 0x4000, 0x0000, 0x7f80, 0x3e80 };
	add(&o, bf, sizeof(bf));
	float f2[2] = { 1.5f, -2.0f };
	add(&o, f2, sizeof(f2));
	put("safetensors", "bf16-and-f32", o.p, o.n);
	free(o.p);

	/* F16 with a subnormal, infinity and NaN, and a dtype that does not
	 * load (F8_E4M3: opens, refused when read) */
	static const char hdr16[] =
		"{\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]},"
		"\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[10,12]}}";
	struct buf o2 = { 0 };
	hl = (sizeof(hdr16) - 1 + 7) / 8 * 8;
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	add(&o2, len8, 8);
	add(&o2, hdr16, sizeof(hdr16) - 1);
	for (size_t i = sizeof(hdr16) - 1; i < hl; i++)
		add(&o2, " ", 1);
	static const uint16_t h16[5] = { 0x3c00, 0x0001, 0x7c00, 0x7e00, 0xc500 };
	add(&o2, h16, sizeof(h16));
	add(&o2, "\x38\xb8", 2);
	put("safetensors", "f16-and-fp8", o2.p, o2.n);
	free(o2.p);

	/* indexes (fuzz_safetensors.c's "HFINDEX\n" inputs) beside its two
	 * shards: right, and wrong in each way the loader refuses */
	static const char *const idx[][2] = {
		{ "index-ok", "{\"metadata\":{\"total_size\":40},\"weight_map\":{\"a\":\"s1.safetensors\","
			      "\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}" },
		{ "index-wrong-shard", "{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\","
				       "\"c\":\"s2.safetensors\"}}" },
		{ "index-missing", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
				   "\"c\":\"s2.safetensors\",\"d\":\"s2.safetensors\"}}" },
		{ "index-outside", "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}" },
		{ "index-fp8", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a_scale\":\"s1.safetensors\","
			       "\"w.weight_scale_inv\":\"s3.safetensors\"}}" },
		{ "index-no-map", "{\"metadata\":{}}" },
	};
	for (size_t i = 0; i < sizeof(idx) / sizeof(idx[0]); i++) {
		struct buf o3 = { 0 };
		add(&o3, "HFINDEX\n", 8);
		add(&o3, idx[i][1], strlen(idx[i][1]));
		put("safetensors", idx[i][0], o3.p, o3.n);
		free(o3.p);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: gen_seeds OUTDIR [CONFIG.yml ...]\n");
		return 2;
	}
	outdir = argv[1];
	mkdir(outdir, 0755);
	init_messages();
	one_of_each();
	streams();
	configs(argc - 2, argv + 2);
	safetensors();
	return 0;
}
