/* The checks of the control-message handlers (see wire_check.h): pure
 * functions of a frame's body and a view of this host's state. Called by
 * recv.c and rendezvous.c, and by the fuzz target for control frames; calls
 * nothing in net/ but conn_split_addr and xport_host_of (both read only). */
#include "net/wire_check.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/net.h"
#include "net/xport.h"

int wire_check_seq(const struct wire_rx_seq *s, int body, uint64_t link_seq, uint64_t ack_seq,
		   char *err, size_t errlen)
{
	if (s->replay) {
		if (body == MESHRUN__FRAME__BODY_LINK_HELLO && link_seq == 0 && s->hello)
			return WIRE_SEQ_RESUME_HELLO;
		/* an ack past what we sent would free replay copies the peer
		 * lacks, and hide every later ack */
		if (s->acks && ack_seq > s->tx_seq) {
			snprintf(err, errlen, "%s frame acknowledges frame %llu, only %llu sent",
				 frame_body_name(body), (unsigned long long)ack_seq,
				 (unsigned long long)s->tx_seq);
			return -EBADMSG;
		}
		if (body == MESHRUN__FRAME__BODY_ACK || (link_seq && link_seq <= s->rx_seq))
			return WIRE_SEQ_SKIP;
		if (s->part_seq && link_seq == s->part_seq && link_seq == s->rx_seq + 1)
			return WIRE_SEQ_PART;
		if (link_seq > s->rx_seq + 1) {
			snprintf(err, errlen, "%s frame has sequence number %llu, expected %llu: "
				 "frames lost on the way", frame_body_name(body),
				 (unsigned long long)link_seq, (unsigned long long)(s->rx_seq + 1));
			return WIRE_SEQ_GAP;
		}
	}
	if (link_seq != s->rx_seq + 1) {
		snprintf(err, errlen, "%s frame has sequence number %llu, expected %llu",
			 frame_body_name(body), (unsigned long long)link_seq,
			 (unsigned long long)(s->rx_seq + 1));
		return -EBADMSG;
	}
	return WIRE_SEQ_NEXT;
}

int wire_check_hello_stage(enum link_role role, int body, char *err, size_t errlen)
{
	bool ok = false;
	switch (role) {
	case ROLE_COORD_IN:
		ok = body == MESHRUN__FRAME__BODY_HELLO;
		break;
	case ROLE_COORD_OUT:
		/* Abort: the coordinator's rendezvous deadline passed */
		ok = body == MESHRUN__FRAME__BODY_TOPOLOGY || body == MESHRUN__FRAME__BODY_REFUSE ||
		     body == MESHRUN__FRAME__BODY_ABORT;
		break;
	case ROLE_LINK_IN:
		ok = body == MESHRUN__FRAME__BODY_LINK_HELLO;
		break;
	case ROLE_LINK_OUT:
		ok = body == MESHRUN__FRAME__BODY_LINK_HELLO || body == MESHRUN__FRAME__BODY_REFUSE;
		break;
	}
	if (ok)
		return 0;
	snprintf(err, errlen, "unexpected %s frame before the hello", frame_body_name(body));
	return -EBADMSG;
}

int wire_check_running(int body, char *err, size_t errlen)
{
	switch (body) {
	case MESHRUN__FRAME__BODY_HEARTBEAT:
	case MESHRUN__FRAME__BODY_CHUNK:
	case MESHRUN__FRAME__BODY_RECV_READY:
	case MESHRUN__FRAME__BODY_BARRIER:
	case MESHRUN__FRAME__BODY_DONE:
	case MESHRUN__FRAME__BODY_ABORT:
		return 0;
	default:
		snprintf(err, errlen, "unexpected %s frame on a running link", frame_body_name(body));
		return -EBADMSG;
	}
}

const char *wire_peer_text(const char *s, char *out, size_t outlen)
{
	size_t n = 0;
	if (!outlen)
		return "";
	for (; s && *s && n + 1 < outlen; s++) {
		unsigned char c = (unsigned char)*s;
		out[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	out[n] = 0;
	return out;
}

/* The first 4 bytes of a hash in hex (out: 9 bytes). */
static void hex8(const uint8_t *h, size_t len, char *out)
{
	static const char d[] = "0123456789abcdef";
	size_t i;
	for (i = 0; i < 4 && i < len; i++) {
		out[2 * i] = d[h[i] >> 4];
		out[2 * i + 1] = d[h[i] & 15];
	}
	out[2 * i] = 0;
}

int wire_check_hello(const struct wire_self *s, const struct wire_join *j,
		     const Meshrun__Hello *h, char *err, size_t errlen)
{
	char a[16], b[16], hostpart[128], text[160];
	int id = (int)h->host_id, port;

	if (id <= 0 || id >= s->num_hosts) {
		if (id == 0)
			snprintf(err, errlen, "duplicate host id 0: host 0 is the coordinator");
		else
			snprintf(err, errlen,
				 "host id %d is out of range: the cluster has %d hosts (0..%d)", id,
				 s->num_hosts, s->num_hosts - 1);
		return -EBADMSG;
	}
	if (j->topology_done && !j->joined) {
		snprintf(err, errlen, "the rendezvous is over: the cluster started without host %d",
			 id);
		return -EBADMSG;
	}
	if (j->joined) {
		snprintf(err, errlen, "duplicate host id %d: host %d already joined%s%s", id, id,
			 j->joined_from ? " from " : "", j->joined_from ? j->joined_from : "");
		return -EBADMSG;
	}
	if (!h->version || strcmp(h->version, NET_VERSION)) {
		snprintf(err, errlen, "host %d runs version '%s', the coordinator '%s'", id,
			 wire_peer_text(h->version, text, sizeof(text)), NET_VERSION);
		return -EINVAL;
	}
	if ((int)h->num_hosts != s->num_hosts) {
		snprintf(err, errlen, "host %d was started for %u hosts, the coordinator for %d", id,
			 h->num_hosts, s->num_hosts);
		return -EINVAL;
	}
	if (h->config_hash.len != WIRE_HASH_LEN ||
	    memcmp(h->config_hash.data, s->config_hash, WIRE_HASH_LEN)) {
		hex8(h->config_hash.data, h->config_hash.len, a);
		hex8(s->config_hash, WIRE_HASH_LEN, b);
		snprintf(err, errlen,
			 "host %d's config hash %s differs from the coordinator's %s: run every host with the same config and overrides",
			 id, a, b);
		return -EINVAL;
	}
	if ((int)h->devices != s->devices_per_host) {
		snprintf(err, errlen, "host %d has %u devices, the mesh wants %d per host", id,
			 h->devices, s->devices_per_host);
		return -EINVAL;
	}
	if (!h->data_address || conn_split_addr(h->data_address, hostpart, sizeof(hostpart), &port) ||
	    !port || strlen(h->data_address) >= s->addr_max) {
		snprintf(err, errlen, "host %d sent a bad data address '%s'", id,
			 wire_peer_text(h->data_address, text, sizeof(text)));
		return -EBADMSG;
	}
	return 0;
}

int wire_check_topology(const struct wire_self *s, const Meshrun__Topology *t, char *err,
			size_t errlen)
{
	if ((int)t->n_hosts != s->num_hosts) {
		snprintf(err, errlen, "coordinator sent a topology of %zu hosts, expected %d",
			 t->n_hosts, s->num_hosts);
		return -EBADMSG;
	}
	for (size_t i = 0; i < t->n_hosts; i++) {
		const Meshrun__HostInfo *h = t->hosts[i];
		const char *what = h->host_id != i ? "host_id"
				 : !h->data_address || !h->data_address[0] ? "empty data_address"
				 : strlen(h->data_address) >= s->addr_max ? "data_address too long"
									  : NULL;
		if (what) {
			snprintf(err, errlen, "coordinator sent a bad topology entry %zu (%s)", i, what);
			return -EBADMSG;
		}
	}
	return 0;
}

int wire_check_link_hello(const struct wire_self *s, const Meshrun__LinkHello *h, char *err,
			  size_t errlen)
{
	int id = (int)h->host_id;
	if (h->job_id != s->job_id) {
		snprintf(err, errlen, "link hello for another job (stale agent?)");
		return -EBADMSG;
	}
	if (id < 0 || id >= s->host_id) {
		snprintf(err, errlen, "host %d may not dial host %d (the lower id dials)", id,
			 s->host_id);
		return -EBADMSG;
	}
	if ((int)h->stream < 0 || (int)h->stream >= (s->streams > 0 ? s->streams : 1)) {
		snprintf(err, errlen, "link hello for stream %u, but host pairs have %d",
			 h->stream, s->streams > 0 ? s->streams : 1);
		return -EBADMSG;
	}
	return 0;
}

int wire_check_resume_seq(unsigned host, uint64_t last_seq, uint64_t tx_seq, char *err,
			  size_t errlen)
{
	if (last_seq <= tx_seq)
		return 0;
	snprintf(err, errlen, "host %u resumes after frame %llu, but only %llu were sent to it",
		 host, (unsigned long long)last_seq, (unsigned long long)tx_seq);
	return -EBADMSG;
}

int wire_check_link_join(const struct wire_link_view *v, const Meshrun__LinkHello *h,
			 char *err, size_t errlen)
{
	if (h->resume && !v->resumable) {
		snprintf(err, errlen, "host %u asked to resume a link that is not running",
			 h->host_id);
		return -EBADMSG;
	}
	if (h->resume && wire_check_resume_seq(h->host_id, h->last_seq, v->tx_seq, err, errlen))
		return -EBADMSG;
	if (!h->resume && v->exists) {
		snprintf(err, errlen, "duplicate link from host %u", h->host_id);
		return -EBADMSG;
	}
	return 0;
}

int wire_check_link_answer(const struct wire_self *s, int peer, const char *addr,
			   unsigned stream, bool was_up, const Meshrun__LinkHello *h, char *err,
			   size_t errlen)
{
	if ((int)h->host_id == peer && h->job_id == s->job_id && (!was_up || h->resume) &&
	    h->stream == stream)
		return 0;
	if ((int)h->host_id == peer && h->job_id == s->job_id && h->stream != stream) {
		snprintf(err, errlen, "host %d (%s) answered our stream %u as stream %u", peer, addr,
			 stream, h->stream);
		return -EBADMSG;
	}
	if (was_up)
		snprintf(err, errlen, "host %d (%s) answered our redial as host %u of job %llx",
			 peer, addr, h->host_id, (unsigned long long)h->job_id);
	else
		snprintf(err, errlen, "host %d answered as host %u of job %llx", peer, h->host_id,
			 (unsigned long long)h->job_id);
	return -EBADMSG;
}

int wire_check_chunk(const struct wire_self *s, int peer, const struct wire_rx_msg *m,
		     const struct frame_data *c, char *err, size_t errlen)
{
	int src = (int)c->src, dst = (int)c->dst;
	if (src < 0 || dst < 0) {
		snprintf(err, errlen, "chunk from device %u to device %u does not belong on this link",
			 c->src, c->dst);
		return -EBADMSG;
	}
	if (xport_host_of(s->x, src) != peer || xport_host_of(s->x, dst) != s->host_id) {
		snprintf(err, errlen, "chunk from device %d to device %d does not belong on this link",
			 src, dst);
		return -EBADMSG;
	}
	if (!m->in_msg && c->msg_offset != 0) {
		snprintf(err, errlen, "chunk fragment without its start");
		return -EBADMSG;
	}
	if (m->in_msg && (src != m->src || dst != m->dst || c->tag != m->tag ||
			  c->msg_offset != m->next || c->msg_bytes != m->total)) {
		snprintf(err, errlen, "chunk fragment out of order");
		return -EBADMSG;
	}
	return 0;
}

int wire_check_recv_ready(const struct wire_self *s, int peer, const struct frame_rr *rr,
			  char *err, size_t errlen)
{
	int src = (int)rr->src, dst = (int)rr->dst;
	if (src < 0 || dst < 0 || xport_host_of(s->x, src) != s->host_id ||
	    xport_host_of(s->x, dst) != peer) {
		snprintf(err, errlen, "recv_ready for device %u -> %u does not belong on this link",
			 rr->src, rr->dst);
		return -EBADMSG;
	}
	return 0;
}

int wire_done_status(int32_t code)
{
	return code > 0 && code < 4096 ? -code : NET_ERR;
}
